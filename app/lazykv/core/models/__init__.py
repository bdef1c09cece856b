"""Models: the library (the disk scan of other tools' folders, the Hugging Face Hub, downloads into its
cache, what fits this machine) and fetching the test and default models."""
