"""Models: fetching the test and default models."""
