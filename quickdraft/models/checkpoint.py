"""What a checkpoint directory says about its model: config.json, and the `ModelInfo` built from it
and generation_config.json; and the check that a safetensors file is whole."""

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from quickdraft.errors import ModelError
from quickdraft.models.base import ModelInfo


def read_config(model_dir: Path) -> dict:
    """The model's config.json as a dict."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read {model_dir}/config.json: {exc}") from exc


def model_info(model_dir: Path, name: str, vocab_size: int) -> ModelInfo:
    """ModelInfo from config.json and generation_config.json (eos ids from both)."""
    config = read_config(model_dir)
    text_config = config.get("text_config", config)
    return ModelInfo(
        name=name,
        architecture=config.get("architectures", ["unknown"])[0],
        vocab_size=vocab_size,
        max_context=int(text_config.get("max_position_embeddings", 2048)),
        eos_token_ids=frozenset(_eos_ids(config) | _eos_ids(_generation_config(model_dir))),
    )


def _generation_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _eos_ids(config: dict) -> set[int]:
    eos = config.get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}


def check_safetensors(path: Path, owner: str, remedy: str) -> None:
    """Refuse a file whose safetensors header is unreadable or does not cover the whole file (a truncated copy).

    `owner` says whose file it is ("the model's"), `remedy` what to do; only the header is read.
    """
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as exc:
        raise ModelError(f"{owner} {path} is truncated or not a safetensors file ({one_line(exc)}); {remedy}") from exc


def one_line(error: BaseException) -> str:
    """A library's error message on one line (some span several)."""
    return " ".join(str(error).split()) or type(error).__name__
