"""The patch series in upstream form (issue 46, section 2): at most 36 commits, subjects as llama.cpp
writes them, two ranges that never touch each other's tree. Read from the patch files; no build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1] / "native" / "patches"
SUBJECT = re.compile(r"^[a-z0-9-]+ : \S")
AREAS = {"kv-cache", "ggml-cpu", "ggml", "ggml-cuda", "ggml-vulkan", "ggml-rpc", "state", "common", "python",
         "llama", "model"}


def _patches() -> list[Path]:
    return sorted(PATCHES.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def _subject(patch: Path) -> str:
    """The Subject header, unfolded, without git's [PATCH] prefix."""
    m = re.search(r"^Subject: (.*(?:\n [^\n]*)*)", patch.read_text(errors="replace"), re.MULTILINE)
    assert m, f"{patch.name} has no Subject"
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", re.sub(r"\n ", " ", m.group(1)))


def _paths(patch: Path) -> set[str]:
    return set(re.findall(r"^diff --git a/(\S+) b/", patch.read_text(errors="replace"), re.MULTILINE))


def test_the_series_is_at_most_36_commits() -> None:
    assert 0 < len(_patches()) <= 36


@pytest.mark.parametrize("patch", _patches(), ids=lambda p: p.name[:4])
def test_a_subject_names_its_area_in_72_characters(patch: Path) -> None:
    subject = _subject(patch)
    assert SUBJECT.match(subject) and len(subject) <= 72, subject
    assert subject.split(" : ", 1)[0] in AREAS, subject


def test_no_patch_touches_both_trees_and_llama_cpp_comes_first() -> None:
    trees = []
    for patch in _patches():
        vendored = {p.startswith("vendor/llama.cpp/") for p in _paths(patch)}
        assert len(vendored) == 1, f"{patch.name} touches llama.cpp and llama-cpp-python"
        trees.append(vendored.pop())
    assert trees == sorted(trees, reverse=True), "the llama-cpp-python range follows the llama.cpp range"
    assert all(_subject(p).startswith("python : ") != t for p, t in zip(_patches(), trees, strict=True))


def test_no_body_names_a_sibling_patch_by_number() -> None:
    """Bodies describe the final mechanism, not the series' history ("0036 removes ...")."""
    for patch in _patches():
        text = patch.read_text(errors="replace")
        message = text.split("\n---\n", 1)[0] if "\n---\n" in text else text.split("\ndiff --git", 1)[0]
        assert not re.search(r"\b00[0-9]{2}\b", message.split("\n\n", 1)[-1]), patch.name


def _net_added(path: str, pattern: re.Pattern[str]) -> list[str]:
    """The lines matching pattern that the whole series adds to path, or to the files under it when it ends
    with a slash (added minus removed)."""
    added: list[str] = []
    for patch in _patches():
        for diff in patch.read_text(errors="replace").split("\ndiff --git ")[1:]:
            changed = diff.split(" ", 1)[0].removeprefix("a/")
            if not (changed.startswith(path) if path.endswith("/") else changed == path):
                continue
            for line in diff.splitlines():
                if line.startswith("+") and not line.startswith("+++") and pattern.search(line):
                    added.append(line[1:].strip())
                elif line.startswith("-") and not line.startswith("---") and pattern.search(line):
                    added.remove(line[1:].strip())
    return added


def test_llama_h_grows_by_at_most_six_functions() -> None:
    """Issue 46: one info getter, the progress callback, one conversion call and the two state checks;
    test knobs and the memory-use C form live in the staging header llama-ext.h."""
    functions = _net_added("vendor/llama.cpp/include/llama.h", re.compile(r"\bLLAMA_API\b"))
    names = sorted(re.search(r"(llama_\w+)\s*\(", f).group(1) for f in functions)
    assert names == ["llama_kv_lazy_convert", "llama_kv_lazy_get_info", "llama_kv_lazy_set_progress_callback",
                     "llama_state_check_data", "llama_state_seq_check_data"], names


def test_ggml_gains_two_public_functions() -> None:
    """Issue 46: ggml's public headers gain ggml_convert_rows and ggml_flash_attn_ext_add_kv, nothing else:
    no zero-tail variant (a destination covers what the op clears) and no RPC query (a lost server fails
    through the ggml_status a graph computation returns)."""
    functions = _net_added("vendor/llama.cpp/ggml/include/", re.compile(r"\bGGML_(BACKEND_)?API\b"))
    names = sorted(re.search(r"(\w+)\s*\(", f.replace("(*", "(")).group(1) for f in functions)
    assert names == ["ggml_convert_rows", "ggml_flash_attn_ext_add_kv"], functions
