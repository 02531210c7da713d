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

The first pass over the prompt list answers greedily. When the answers must hold more tokens than one
answer a prompt gives, further passes answer every prompt again, sampled at `resample_temperature` with a
seed fixed by (pass, prompt): more of the target's own text on the same prompts, and text of the kind it
writes when a request samples. Each shard's manifest entry records its pass; the held-out split keeps
pass 0 (greedy answers) only, so held-out figures mean the same whatever the data's size.
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
    resample_temperature: float = 0.7  # passes after the greedy one sample at this; 0: one greedy pass only

    def identity(self) -> dict:
        """The settings the answers depend on (recorded in the manifest)."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "chunk_prompts": self.chunk_prompts,
            "max_prompt_tokens": self.max_prompt_tokens,
            "resample_temperature": self.resample_temperature,
        }

    def sampling(self, answer_pass: int, prompt_index: int, prompts: int) -> SamplingParams:
        """Pass 0 answers greedily; pass p > 0 samples prompt i with seed p * prompts + i (one seed each)."""
        if answer_pass == 0:
            return SamplingParams(max_new_tokens=self.max_new_tokens)
        return SamplingParams(
            temperature=self.resample_temperature,
            seed=answer_pass * prompts + prompt_index,
            max_new_tokens=self.max_new_tokens,
        )


@dataclass(frozen=True)
class Shard:
    """Many sequences stored flat."""

    tokens: torch.Tensor  # [N] int32, sequences concatenated
    lengths: torch.Tensor  # [S] int64
    answer_starts: torch.Tensor  # [S] int64: index of each sequence's first answer token
    prompt_indices: torch.Tensor  # [S] int64: index in the prompt list
    answer_pass: int  # 0: greedy answers; p > 0: the p-th sampled pass over the prompts (the manifest's)

    def sequences(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        """(prompt_index, tokens [T] int64, answer_start) per sequence."""
        starts = torch.cumsum(self.lengths, 0) - self.lengths
        for i, (start, length) in enumerate(zip(starts.tolist(), self.lengths.tolist())):
            yield int(self.prompt_indices[i]), self.tokens[start : start + length].long(), int(self.answer_starts[i])

    @property
    def answer_tokens(self) -> int:
        return int((self.lengths - self.answer_starts).sum())


SHARD_TENSORS = ("tokens", "lengths", "answer_starts", "prompt_indices")  # what a shard file holds


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
    next_shard = len(manifest["shards"])
    chunks_per_pass = -(-len(prompts) // config.chunk_prompts)
    engine = None
    while total < target_tokens:
        answer_pass, chunk_number = divmod(next_shard, chunks_per_pass)
        if answer_pass > 0 and config.resample_temperature == 0:
            print(f"prompts exhausted after {total} answer tokens (resampling is off)", flush=True)
            break
        first = chunk_number * config.chunk_prompts
        chunk = list(range(first, min(first + config.chunk_prompts, len(prompts))))
        engine = engine or load_engine()
        started = time.perf_counter()
        shard = answer_chunk(engine, prompts, chunk, config, answer_pass)
        entry = _write_shard(data_dir, next_shard, shard) | {
            "pass": answer_pass,
            "seconds": round(time.perf_counter() - started, 2),
        }
        manifest["shards"].append(entry)
        write_json(data_dir / MANIFEST, manifest)
        total += entry["answer_tokens"]
        next_shard += 1
        progress(total, target_tokens)
    return total


def answer_chunk(engine: Engine, prompts: list[str], chunk: list[int], config: AnswerConfig, answer_pass: int) -> Shard:
    """The target's answers to prompts[i] for i in chunk (in the chat template when it has one), greedy in pass 0
    and sampled in later passes (`AnswerConfig.sampling`)."""
    chat = bool(engine.target.tokenizer.chat_template)
    encoded = {i: engine.encode(prompts[i], chat=chat) for i in chunk}
    kept = [i for i in chunk if len(encoded[i]) <= config.max_prompt_tokens]
    params = [config.sampling(answer_pass, i, len(prompts)) for i in kept]
    answers: dict[int, tuple[int, ...]] = {}
    for index, event in engine.stream_many([encoded[i] for i in kept], params):
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Finished):
            answers[kept[index]] = event.token_ids
    sequences = [(i, encoded[i], answers[i]) for i in kept if answers[i]]
    return pack(sequences, answer_pass)


def pack(sequences: list[tuple[int, list[int], tuple[int, ...]]], answer_pass: int) -> Shard:
    """(prompt index, prompt ids, answer ids) per sequence -> one shard."""
    flat = [token for _, prompt, answer in sequences for token in (*prompt, *answer)]
    return Shard(
        tokens=torch.tensor(flat, dtype=TOKEN_DTYPE),
        lengths=torch.tensor([len(p) + len(a) for _, p, a in sequences], dtype=torch.long),
        answer_starts=torch.tensor([len(p) for _, p, _ in sequences], dtype=torch.long),
        prompt_indices=torch.tensor([i for i, _, _ in sequences], dtype=torch.long),
        answer_pass=answer_pass,
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
    return [_read_shard(data_dir / entry["file"], entry.get("pass", 0)) for entry in manifest["shards"]]


def writing_rate(data_dir: Path) -> tuple[int, float]:
    """(answer tokens, seconds the engine spent writing them) over every shard of the manifest."""
    shards = json.loads((data_dir / MANIFEST).read_text())["shards"]
    return sum(entry["answer_tokens"] for entry in shards), sum(entry["seconds"] for entry in shards)


def shard_files(data_dir: Path) -> list[str]:
    """The shard file names the manifest lists, in order."""
    return [entry["file"] for entry in json.loads((data_dir / MANIFEST).read_text())["shards"]]


def _write_shard(data_dir: Path, number: int, shard: Shard) -> dict:
    name = f"shard-{number:05d}.safetensors"
    save_tensors(data_dir / name, {field: getattr(shard, field).contiguous() for field in SHARD_TENSORS})
    return {"file": name, "sequences": len(shard.lengths), "answer_tokens": shard.answer_tokens}


def _read_shard(path: Path, answer_pass: int) -> Shard:
    tensors = load_file(str(path))
    return Shard(**{field: tensors[field] for field in SHARD_TENSORS}, answer_pass=answer_pass)


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
