"""Chat history: the conversation store, snapshots of the context memory, persistence and keys."""
