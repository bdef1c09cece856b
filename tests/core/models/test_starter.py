"""The starter list: well-known chat model repos, parsed from resources/, each marked unchecked."""

from __future__ import annotations

import re

from lazykv.core.models.starter import starter_list


def test_the_starter_list_names_repos_marked_unchecked() -> None:
    entries = starter_list()
    assert len(entries) >= 10
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+", e.repo_id) for e in entries)
    assert all(not e.checked for e in entries)  # nobody could look at the Hub from here
    assert len({e.repo_id for e in entries}) == len(entries)
    assert all("gguf" in e.repo_id.lower() for e in entries)
