"""The starter list (resources/models/starter.toml): repo ids of well-known chat models to begin with.

The ids are unchecked (see the file); what each repo holds is asked of the Hub at run time.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from lazykv.resources import resource

STARTER = "models/starter.toml"


@dataclass(frozen=True)
class StarterEntry:
    repo_id: str
    note: str
    checked: bool


def starter_list(path: Path | None = None) -> list[StarterEntry]:
    """The entries in file order; none when the file is not there (an installed wheel has no resources)."""
    path = path or resource(STARTER)
    if path is None:
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [StarterEntry(str(m["repo"]), str(m.get("note", "")), bool(m.get("checked", False)))
            for m in data.get("model", [])]
