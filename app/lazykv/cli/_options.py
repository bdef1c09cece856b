"""Command-line options made from the settings declaration: each option is a setting (its flag, type,
limits, description and default are declared once, in ``core.settings``), so ``serve``, ``estimate``,
``models`` and the window's own command line load and plan what the app would.

An option not given keeps the app's setting (the user's, else the declared default); the values given
are checked as the settings dialog checks them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lazykv.core.engine.load_spec import LoadSpec, LoadSpecError
from lazykv.core.kinds import SettingKind
from lazykv.core.settings import LOAD_SETTINGS, SETTINGS_BY_NAME, Setting, load_spec

LOAD_OPTIONS = LOAD_SETTINGS
HELP_TITLE = "how the model is loaded (default: the app's settings)"


def add_setting_options(parser: argparse.ArgumentParser, names: Sequence[str] = LOAD_OPTIONS,
                        current: Mapping[str, Any] | None = None) -> None:
    """An option for each setting of ``names``; ``current``: the values --help calls the default (the
    user's settings), else the declared defaults."""
    group = parser.add_argument_group(HELP_TITLE)
    for name in names:
        setting = SETTINGS_BY_NAME[name]
        if not setting.flag:
            raise ValueError(f"the setting {name} declares no command-line flag")
        default = setting.default if current is None else current[name]
        shown = _shown(setting, default)
        about = f"{setting.label}: {setting.description} (default {shown})".replace("%", "%%")
        if setting.kind is SettingKind.BOOL:
            group.add_argument(setting.flag, dest=name, default=None, action=argparse.BooleanOptionalAction,
                               help=about)
        elif setting.kind is SettingKind.ENDPOINT_LIST:
            group.add_argument(setting.flag, dest=name, default=None, type=_checked(setting, _endpoints),
                               metavar="HOST:PORT[,...]", help=f"{about}; here comma-separated")
        else:
            group.add_argument(setting.flag, dest=name, default=None, metavar=_metavar(setting), help=about,
                               type=_checked(setting, _scalar(setting)))


def given(args: argparse.Namespace, names: Sequence[str] = LOAD_OPTIONS) -> dict[str, Any]:
    """The settings the command line set, by setting name. A context length given without a memory budget
    is the length asked for: the settings' budget, if any, is not used then."""
    values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if "n_ctx" in values and "context_budget_mb" in names and "context_budget_mb" not in values:
        values["context_budget_mb"] = 0
    return values


def spec(args: argparse.Namespace, settings: Mapping[str, Any], model: Path | str) -> LoadSpec:
    """What ``model`` is loaded with: the ``settings`` (a Settings or its values), what ``args`` set on top.
    Raises LoadSpecError with a sentence."""
    values = {name: settings[name] for name in LOAD_SETTINGS}
    try:
        return load_spec({**values, **given(args)}, model)
    except (ValueError, TypeError) as err:
        raise LoadSpecError(str(err)) from None


def _shown(setting: Setting, value: Any) -> str:
    for word, meant in setting.words:
        if value == meant:
            return word
    if setting.kind is SettingKind.ENDPOINT_LIST:
        return ",".join(value) or "none"
    if setting.kind is SettingKind.BOOL:
        return "on" if value else "off"
    if setting.special and value == setting.minimum:
        return setting.special.split(" = ", 1)[-1] if " = " in setting.special else str(value)
    return str(value)


def _metavar(setting: Setting) -> str:
    if setting.kind is SettingKind.CHOICE:
        return "{" + ",".join(v for v, _ in setting.choices) + "}"
    unit = "MiB" if setting.name.endswith("_mb") else "N"
    return "|".join([*(word for word, _ in setting.words), unit])


def _scalar(setting: Setting) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        for word, meant in setting.words:
            if text.strip().lower() == word:
                return meant
        if setting.kind not in (SettingKind.INT, SettingKind.FLOAT):
            return text
        value = int(text) if setting.kind is SettingKind.INT else float(text)
        if any(value == meant for _, meant in setting.words):  # a word's value is given as the word
            least = setting.minimum + 1 if setting.minimum is not None else value
            raise ValueError(f"{value:g} is below the minimum {least:g}")
        return value

    return parse


def _endpoints(text: str) -> list[str]:
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def _checked(setting: Setting, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, then the setting's own check; argparse shows the sentence as the option's error."""
    def check(text: str) -> Any:
        try:
            return setting.validate(parse(text))
        except ValueError as err:
            words = " or ".join(word for word, _ in setting.words)
            why = str(err).removeprefix(f"{setting.name}: ")
            if why.startswith(("invalid literal", "could not convert")):
                why = f"“{text}” is neither {words} nor a number" if words else f"“{text}” is not a number"
            raise argparse.ArgumentTypeError(why) from None

    check.__name__ = setting.label  # argparse names the type in its own messages
    return check
