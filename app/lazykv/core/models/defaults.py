"""Where the app finds models without being told: the folder `make models` fills, and the default
model in it. The window and the entry point ask here; only this module knows ``model_fetch``'s
layout."""

from __future__ import annotations

from pathlib import Path

from lazykv.core.models import model_fetch

DEFAULT_MODEL = "smollm2"


def models_folder() -> Path:
    """The folder the test and default models are fetched into (it may not exist yet)."""
    return model_fetch.models_dir()


def default_model_path() -> Path:
    """The model the app opens when none is set (fetched by `make models`)."""
    return models_folder() / model_fetch.MODELS[DEFAULT_MODEL].filename
