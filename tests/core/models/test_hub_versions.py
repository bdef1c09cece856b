"""The downloads (resume after Cancel included) and the Hub's calls on the oldest huggingface_hub that
pyproject.toml allows and on the newest release: test_download.py and test_hub.py again, in a child process
with that release first on its path. `make test` installs both beside the venv (the Makefile's
hub-versions target); nothing is downloaded here."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
TESTS = ["tests/core/models/test_download.py", "tests/core/models/test_hub.py"]


def _allowed() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "huggingface_hub")


def _env(release: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(release), str(ROOT)])
    return env


def _version(env: dict[str, str]) -> Version:
    out = subprocess.run([sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.__version__)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    return Version(out.stdout.strip())


@pytest.mark.slow
@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_downloads_on_the_oldest_and_the_newest_huggingface_hub(which: str) -> None:
    release = Path(sys.prefix) / f"hub-{which}"
    assert release.is_dir(), f"{release} is missing: `make hub-versions` (part of `make test`) installs it"
    env = _env(release)
    version, allowed = _version(env), _allowed()
    assert version in allowed.specifier, f"huggingface_hub {version} in {release}; pyproject.toml: {allowed}"
    if which == "oldest":
        lowest = min(Version(s.version) for s in allowed.specifier if s.operator == ">=")
        assert version.release[:2] == lowest.release[:2], f"{version} is not the lower bound's {lowest}"
    else:
        assert version > _version(_env(Path(sys.prefix) / "hub-oldest"))
    run = subprocess.run([sys.executable, "-m", "pytest", *TESTS, "-q", "-x", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, f"on huggingface_hub {version}:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout.splitlines()[-1]
