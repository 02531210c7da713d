"""The target's hidden states for the token shards: recomputed by batched forwards, cached beside them.

Training reads, at every position t of a stored sequence, the target's states a_t from the three
layers the head fuses and its final-norm state f_t (the target's next-token distribution there is
softmax(output rows @ f_t)). They are computed from the tokens by the native runtime's batched
forwards, each sequence in a KV cache slot of its own, as prompt chunks (`logits="none"`): a
sequence's states are the same whatever else shares the forward. `DIR/states/` holds one file per
data shard (`aux` [N, 3 * d] and `final` [N, d], bfloat16), written atomically; a rerun computes only
the missing ones, and `manifest.json` there records the layers and the target they belong to (other
settings are refused rather than mixed) and the seconds each shard's states took.
"""

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from quickdraft.distill.data import Shard, load_shards, save_tensors, shard_files, write_json
from quickdraft.errors import UsageError
from quickdraft.models.base import PREFILL_BLOCK, BatchRunner, SequenceStep

STATE_DTYPE = torch.bfloat16
MANIFEST = "manifest.json"
FORWARD_TOKENS = 2048  # tokens per batched forward (whole sequences, each in its own slot)


@dataclass(frozen=True)
class ShardStates:
    aux: torch.Tensor  # [N, len(aux_layers) * d] the head's inputs at every stored position
    final: torch.Tensor  # [N, d] the target's final-norm state at every stored position


def ensure_states(
    data_dir: Path,
    states_dir: Path,
    runner: Callable[[], BatchRunner],
    aux_layers: Sequence[int],
    num_layers: int,
    identity: dict,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> list[ShardStates]:
    """The states of every data shard, computing (with the runner `runner()` gives, loaded only if needed)
    and caching the ones not yet on disk."""
    states_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"target": identity, "aux_layers": list(aux_layers), "seconds": {}}
    path = states_dir / MANIFEST
    if path.exists():
        found = json.loads(path.read_text())
        if any(found.get(key) != manifest[key] for key in ("target", "aux_layers")):
            raise UsageError(
                f"{states_dir} holds states of other layers or another target; delete it to recompute them"
            )
        manifest["seconds"] = found.get("seconds", {})
    write_json(path, manifest)
    files, shards = shard_files(data_dir), load_shards(data_dir)
    loaded, result = None, []
    for done, (name, shard) in enumerate(zip(files, shards), start=1):
        cached = states_dir / name
        if not cached.exists():
            loaded = loaded or runner()
            started = time.perf_counter()
            states = shard_states(loaded, shard, (*aux_layers, num_layers))
            d = states.shape[1] // (len(aux_layers) + 1)
            save_tensors(
                cached, {"aux": states[:, : len(aux_layers) * d].contiguous(), "final": states[:, -d:].contiguous()}
            )
            manifest["seconds"][name] = round(time.perf_counter() - started, 3)
            write_json(path, manifest)
        tensors = load_file(str(cached))
        result.append(ShardStates(tensors["aux"], tensors["final"]))
        progress(done, len(files))
    return result


@torch.inference_mode()
def shard_states(runner: BatchRunner, shard: Shard, layers: tuple[int, ...]) -> torch.Tensor:
    """The states `layers` of every token of the shard, in its order: [N, len(layers) * d] in STATE_DTYPE."""
    sequences = [tokens.tolist() for _, tokens, _ in shard.sequences()]
    out: list[torch.Tensor] = []
    start = 0
    while start < len(sequences):
        end, budget = start, FORWARD_TOKENS
        while end < len(sequences) and (end == start or len(sequences[end]) <= budget):
            budget -= len(sequences[end])
            end += 1
        out += _forward(runner, sequences[start:end], layers)
        start = end
    return torch.cat(out).to(STATE_DTYPE) if out else torch.zeros(0, 0, dtype=STATE_DTYPE)


def _forward(runner: BatchRunner, sequences: list[list[int]], layers: tuple[int, ...]) -> list[torch.Tensor]:
    """Each sequence read as a prompt in its own slot, in chunks ending at PREFILL_BLOCK multiples."""
    slots = [runner.open_slot() for _ in sequences]
    states: list[list[torch.Tensor]] = [[] for _ in sequences]
    try:
        done = [0] * len(sequences)
        while any(d < len(s) for d, s in zip(done, sequences)):
            steps, owners = [], []
            for i, (slot, tokens) in enumerate(zip(slots, sequences)):
                if done[i] < len(tokens):
                    end = min(len(tokens), done[i] + 4 * PREFILL_BLOCK)
                    steps.append(SequenceStep(slot, tuple(tokens[done[i] : end]), "none", layers))
                    owners.append(i)
                    done[i] = end
            for i, output in zip(owners, runner.forward_batch(steps)):
                states[i].append(output.hidden.to(STATE_DTYPE))
    finally:
        for slot in slots:
            runner.close_slot(slot)
    return [torch.cat(parts) for parts in states]


def states_seconds(data_dir: Path, states_dir: Path) -> float | None:
    """Seconds the states of the data manifest's shards took to compute (over every run that computed them), or
    None when some shard's time was not recorded."""
    recorded = json.loads((states_dir / MANIFEST).read_text()).get("seconds", {})
    files = shard_files(data_dir)
    return sum(recorded[name] for name in files) if all(name in recorded for name in files) else None
