"""Self-distillation data: the target's own greedy answers, written by the batched engine, as token shards.

The engine runs the target alone (no drafter) on the default runtime, `batch_size` requests at once.
Its batched rows equal each sequence's solo rows bit for bit, so every stored answer is exactly what
the target writes for that prompt alone, whatever the batch size: the batch size is a speed setting,
not part of the data's identity. Only token ids are stored (int32: a million answer tokens with their
prompts take a few MB); the target's hidden states are recomputed from them by batched forwards
(`states.py`).

A sequence is its prompt tokens, then its answer tokens (the end-of-sequence token that stopped it is
not stored: the target's distribution at the last position, which training reads, already predicts it).

Prompts are taken in fixed chunks of the (shuffled, fixed) prompt list; each chunk becomes one shard
file `shard-NNNNN.safetensors` under `DIR/data`, and `manifest.json` lists the shards. A rerun appends
shards after the last complete one (a shard is written to a temporary name and renamed), until the
answers hold at least the requested number of tokens.
"""

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quickdraft.config import SamplingParams
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.output import Failed, Finished

MANIFEST = "manifest.json"
TOKEN_DTYPE = torch.int32  # stored token ids (any vocabulary below 2^31)


@dataclass(frozen=True)
class AnswerConfig:
    """How the target writes its answers. `batch_size` changes the speed, never the answers."""

    max_new_tokens: int = 128  # answer length cap
    batch_size: int = 32  # requests the engine runs at once
    chunk_prompts: int = 256  # prompts per shard
    max_prompt_tokens: int = 256  # longer prompts are skipped

    def identity(self) -> dict:
        """The settings the answers depend on (recorded in the manifest)."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "chunk_prompts": self.chunk_prompts,
            "max_prompt_tokens": self.max_prompt_tokens,
        }


@dataclass(frozen=True)
class Shard:
    """Many sequences stored flat."""

    tokens: torch.Tensor  # [N] int32, sequences concatenated
    lengths: torch.Tensor  # [S] int64
    answer_starts: torch.Tensor  # [S] int64: index of each sequence's first answer token
    prompt_indices: torch.Tensor  # [S] int64: index in the prompt list

    def sequences(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        """(prompt_index, tokens [T] int64, answer_start) per sequence."""
        starts = torch.cumsum(self.lengths, 0) - self.lengths
        for i, (start, length) in enumerate(zip(starts.tolist(), self.lengths.tolist())):
            yield int(self.prompt_indices[i]), self.tokens[start : start + length].long(), int(self.answer_starts[i])

    @property
    def answer_tokens(self) -> int:
        return int((self.lengths - self.answer_starts).sum())


def prompt_list_digest(prompts: list[str]) -> str:
    return hashlib.sha256("\n\x00".join(prompts).encode()).hexdigest()[:16]


def generate_shards(
    load_engine: Callable[[], Engine],
    prompts: list[str],
    data_dir: Path,
    target_tokens: int,
    config: AnswerConfig,
    identity: dict,
    progress: Callable[[int, int], None] = lambda done, goal: None,
) -> int:
    """Append shards to `data_dir` until the answers hold `target_tokens` tokens; returns the total.

    `load_engine` gives the engine that writes the answers (the target alone, at most `batch_size`
    requests running); it is called once, and only when a shard is still to be written (a resumed run
    whose data is complete loads nothing).
    """
    manifest = _open_manifest(data_dir, prompts, config, identity)
    total = sum(entry["answer_tokens"] for entry in manifest["shards"])
    next_chunk = len(manifest["shards"])
    engine = None
    while total < target_tokens:
        first = next_chunk * config.chunk_prompts
        if first >= len(prompts):
            print(f"prompts exhausted after {total} answer tokens", flush=True)
            break
        chunk = list(range(first, min(first + config.chunk_prompts, len(prompts))))
        engine = engine or load_engine()
        started = time.perf_counter()
        shard = answer_chunk(engine, prompts, chunk, config)
        entry = _write_shard(data_dir, next_chunk, shard) | {"seconds": round(time.perf_counter() - started, 2)}
        manifest["shards"].append(entry)
        write_json(data_dir / MANIFEST, manifest)
        total += entry["answer_tokens"]
        next_chunk += 1
        progress(total, target_tokens)
    return total


def answer_chunk(engine: Engine, prompts: list[str], chunk: list[int], config: AnswerConfig) -> Shard:
    """The target's greedy answers to prompts[i] for i in chunk (in the chat template when it has one)."""
    chat = bool(engine.target.tokenizer.chat_template)
    encoded = {i: engine.encode(prompts[i], chat=chat) for i in chunk}
    kept = [i for i in chunk if len(encoded[i]) <= config.max_prompt_tokens]
    params = SamplingParams(max_new_tokens=config.max_new_tokens)
    answers: dict[int, tuple[int, ...]] = {}
    for index, event in engine.stream_many([encoded[i] for i in kept], params):
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Finished):
            answers[kept[index]] = event.token_ids
    sequences = [(i, encoded[i], answers[i]) for i in kept if answers[i]]
    return pack(sequences)


def pack(sequences: list[tuple[int, list[int], tuple[int, ...]]]) -> Shard:
    """(prompt index, prompt ids, answer ids) per sequence -> one shard."""
    flat = [token for _, prompt, answer in sequences for token in (*prompt, *answer)]
    return Shard(
        tokens=torch.tensor(flat, dtype=TOKEN_DTYPE),
        lengths=torch.tensor([len(p) + len(a) for _, p, a in sequences], dtype=torch.long),
        answer_starts=torch.tensor([len(p) for _, p, _ in sequences], dtype=torch.long),
        prompt_indices=torch.tensor([i for i, _, _ in sequences], dtype=torch.long),
    )


def _open_manifest(data_dir: Path, prompts: list[str], config: AnswerConfig, identity: dict) -> dict:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / MANIFEST
    expected = {"target": identity, "prompts": prompt_list_digest(prompts), "generation": config.identity()}
    if not path.exists():
        return {**expected, "shards": []}
    manifest = json.loads(path.read_text())
    for key, value in expected.items():
        if manifest.get(key) != value:
            raise UsageError(
                f"{data_dir} holds data made with a different {key}; use a new --out or the original settings"
            )
    return manifest


def load_shards(data_dir: Path) -> list[Shard]:
    """Every shard listed in the manifest."""
    path = data_dir / MANIFEST
    if not path.exists():
        raise UsageError(f"no training data in {data_dir}; run quickdraft distill to write it first")
    manifest = json.loads(path.read_text())
    return [_read_shard(data_dir / entry["file"]) for entry in manifest["shards"]]


def writing_rate(data_dir: Path) -> tuple[int, float]:
    """(answer tokens, seconds the engine spent writing them) over every shard of the manifest."""
    shards = json.loads((data_dir / MANIFEST).read_text())["shards"]
    return sum(entry["answer_tokens"] for entry in shards), sum(entry["seconds"] for entry in shards)


def shard_files(data_dir: Path) -> list[str]:
    """The shard file names the manifest lists, in order."""
    return [entry["file"] for entry in json.loads((data_dir / MANIFEST).read_text())["shards"]]


def _write_shard(data_dir: Path, number: int, shard: Shard) -> dict:
    name = f"shard-{number:05d}.safetensors"
    save_tensors(data_dir / name, {field: getattr(shard, field).contiguous() for field in Shard.__dataclass_fields__})
    return {"file": name, "sequences": len(shard.lengths), "answer_tokens": shard.answer_tokens}


def _read_shard(path: Path) -> Shard:
    tensors = load_file(str(path))
    return Shard(**{field: tensors[field] for field in Shard.__dataclass_fields__})


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write a safetensors file atomically (`.NAME.partial` beside it, then a rename): a kill leaves no half file."""
    temporary = path.with_name(f".{path.name}.partial")
    save_file(tensors, str(temporary))
    os.replace(temporary, path)


def write_json(path: Path, value: dict) -> None:
    """Write JSON atomically (a temporary name, then a rename)."""
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(json.dumps(value, indent=1))
    os.replace(temporary, path)
