"""Long natural text for KLD measurements (issue 28): the Python FAQ, from Debian's ``python3-doc``.

``bench/corpus.txt`` is short and repeats itself; llama-perplexity's KLD at n_ctx 4096 wants at least 8k
tokens of text that does not. The FAQ's reStructuredText sources (``_sources/faq/*.rst.txt``, about 27k
words) are prose questions and answers with a little code; the markup is kept as it is (models read
such text all the time). ``tools/sysdeps.sh doc`` installs the package when it is missing.
"""

from __future__ import annotations

import glob
from pathlib import Path

DOC_GLOB = "/usr/share/doc/python3*/html/_sources/faq/*.rst.txt"
PACKAGE = "python3-doc"


def faq_files() -> list[Path]:
    """The FAQ's sources of the newest Python documentation installed, in name order."""
    roots = sorted({Path(p).parents[3] for p in glob.glob(DOC_GLOB)})
    if not roots:
        raise FileNotFoundError(f"no Python documentation at {DOC_GLOB}: install {PACKAGE} "
                                "(sh tools/sysdeps.sh doc)")
    return sorted((roots[-1] / "html" / "_sources" / "faq").glob("*.rst.txt"))


def python_faq() -> str:
    return "\n\n".join(p.read_text(encoding="utf-8") for p in faq_files())


def write_faq(path: Path) -> Path:
    path.write_text(python_faq(), encoding="utf-8")
    return path


if __name__ == "__main__":
    import sys

    print(write_faq(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("python-faq.txt")))
