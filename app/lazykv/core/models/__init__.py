"""Models: the library (the disk scan of other tools' folders, the Hugging Face Hub, downloads into its
cache, what fits this machine), where the app finds models by default, and fetching the test and
default models."""
