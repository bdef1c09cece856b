from pathlib import Path

import pytest

from lazykv.core.files import write_text_atomic


def test_write_replaces_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    write_text_atomic(target, "first\n")
    write_text_atomic(target, "second\n")
    assert target.read_text(encoding="utf-8") == "second\n"
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "out.md"
    write_text_atomic(target, "kept\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "half \ud800 written")  # a lone surrogate cannot be encoded
    assert target.read_text(encoding="utf-8") == "kept\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.md"]
