"""Qt-free core: engine session, conversations, snapshots, settings, memory accounting."""
