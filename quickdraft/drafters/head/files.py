"""A trained head on disk: `head.safetensors`, `config.json` and a card `README.md`.

config.json holds the format tag, the target's identity (see `identity.py`), the head's shapes
(`HeadConfig`) and the reduced vocabulary: `vocab.ids[i]` is the target token id of draft
logit i. The weights hold only what training changed; the target's embedding and output rows
are taken from the target when the head is loaded, after the identity check.
"""

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quickdraft.drafters.head.identity import check_target
from quickdraft.drafters.head.model import DraftHead, HeadConfig
from quickdraft.errors import UsageError
from quickdraft.models.checkpoint import check_safetensors
from quickdraft.models.loading import LoadedModel

FORMAT = "quickdraft-head/1"
WEIGHTS = "head.safetensors"
CONFIG = "config.json"


def build_head(config: HeadConfig, target: LoadedModel, vocab_ids: torch.Tensor) -> DraftHead:
    """A fresh head for `target` over the reduced vocabulary `vocab_ids` [draft_vocab]."""
    embeddings, output = target.runner.embedding_matrices()
    return DraftHead(config, embeddings, output, vocab_ids)


def save_head(directory: Path, head: DraftHead, identity: dict, dtype: torch.dtype = torch.float32, **extra) -> None:
    """Write weights (in `dtype`) and config; `extra` goes into config.json (e.g. coverage)."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.detach().to(dtype).contiguous() for name, tensor in head.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS))
    config = {
        "format": FORMAT,
        "target": identity,
        "shapes": asdict(head.config),
        "vocab": {"size": len(head.vocab_ids), "ids": head.vocab_ids.tolist()},
        **extra,
    }
    (directory / CONFIG).write_text(json.dumps(config, indent=1))


def read_config(directory: Path) -> dict:
    path = Path(directory) / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"{directory} is not a draft head directory ({path}: {exc}); train one with quickdraft distill"
        ) from exc
    if config.get("format") != FORMAT:
        raise UsageError(
            f"{path} has format {config.get('format')!r}, expected {FORMAT}; retrain the head with this version"
        )
    return config


def load_head(directory: Path, target: LoadedModel) -> DraftHead:
    """The head in `directory` bound to `target` (refused if trained for another)."""
    config = read_config(directory)
    check_target(config["target"], target, str(directory))
    vocab_ids = torch.tensor(config["vocab"]["ids"], dtype=torch.long)  # [draft_vocab]
    head = build_head(HeadConfig(**config["shapes"]), target, vocab_ids)
    weights_path = Path(directory) / WEIGHTS
    check_safetensors(
        weights_path, "the draft head's", "train the head again with quickdraft distill, or copy it again"
    )
    weights = {name: tensor.float() for name, tensor in load_file(str(weights_path)).items()}
    head.load_state_dict(weights)
    return head.eval()
