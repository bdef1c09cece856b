"""The conversation model and the policy for a full context."""
