"""Training checkpoints without pickle: resuming from anyone's checkpoint never runs their code.

One safetensors file holds the model's tensors (`model/NAME`) and the optimizer's per-parameter
tensors (`optimizer/PARAM/KEY`, e.g. Adam's `exp_avg`); its header's metadata holds the rest as
JSON: the trainer's progress, the optimizer's parameter groups and any per-parameter values that
are not tensors. Reading it parses a JSON header and raw tensor bytes, nothing else. The file is
written under a temporary name and renamed, so a checkpoint is whole or absent.
"""

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from quickdraft.errors import UsageError
from quickdraft.models.checkpoint import one_line

FORMAT = "quickdraft-training-checkpoint/1"
METADATA_KEY = "quickdraft"


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, progress: dict) -> None:
    """Write the model, the optimizer and `progress` (JSON-able) to `path`, atomically."""
    tensors = {f"model/{name}": tensor for name, tensor in model.state_dict().items()}
    optimizer_state = optimizer.state_dict()
    values: dict[str, dict] = {}
    for param, entries in optimizer_state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{param}/{key}"] = value
            else:
                values.setdefault(str(param), {})[key] = value
    metadata = {
        "format": FORMAT,
        "progress": progress,
        "param_groups": optimizer_state["param_groups"],
        "optimizer_values": values,
    }
    temporary = path.with_name(path.name + ".partial")
    save_file(_unshared(tensors), str(temporary), metadata={METADATA_KEY: json.dumps(metadata)})
    temporary.replace(path)


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore the model and the optimizer from `path`; returns the saved progress."""
    metadata, tensors = _read(path)
    prefix = "model/"
    model.load_state_dict({name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)})
    state = {int(param): dict(entries) for param, entries in metadata["optimizer_values"].items()}
    for name, tensor in tensors.items():
        if name.startswith("optimizer/"):
            _, param, key = name.split("/", 2)
            state.setdefault(int(param), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": metadata["param_groups"]})
    return metadata["progress"]


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of a checkpoint file, or a UsageError saying it is none."""
    try:
        with safe_open(str(path), framework="pt") as file:
            metadata = json.loads((file.metadata() or {})[METADATA_KEY])
            tensors = {name: file.get_tensor(name) for name in file.keys()}
        if metadata.get("format") != FORMAT:
            raise ValueError(f"format {metadata.get('format')!r}, expected {FORMAT}")
    except (SafetensorError, OSError, KeyError, ValueError, AttributeError) as exc:
        raise UsageError(
            f"{path} is not a quickdraft training checkpoint ({one_line(exc)}); delete it to train from the start"
        ) from exc
    return metadata, tensors


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, a copy for each one whose memory an earlier one uses (tied weights): safetensors
    stores no shared memory."""
    seen: set[int] = set()
    unshared = {}
    for name, tensor in tensors.items():
        storage = tensor.untyped_storage().data_ptr()
        unshared[name] = (tensor.clone() if storage in seen else tensor).contiguous()
        seen.add(storage)
    return unshared
