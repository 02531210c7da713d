"""Self-distillation data: the target's own greedy answers with its hidden state at every position.

The target answers prompts in left-padded batches with transformers `generate`, in the
generation dtype: by default bfloat16 where the CPU multiplies bfloat16 natively (the precision of
the default native runtime's activations), float32 where it does not (there bfloat16 is emulated
and several times slower: `scripts/datagen_speed.py` measures it); "int8" also rounds the weights
as the native runtime does, see `int8_rounded`. A forward hook on
its final norm captures the post-norm hidden state (the vector its output layer reads) of every
position it computes, prefill and decode steps alike, so the states cost no extra forward. The
target's next-token distribution at a position is `lm_head(state)`, so it is not stored.

A sequence of T tokens (prompt, then answer) is stored with the states f_0..f_{T-1}; f_t predicts
token t+1. The last generated token is dropped: the target never computed its state.

Prompts are taken in fixed chunks of the (shuffled, fixed) prompt list; each chunk becomes one
shard file `shard-NNNNN.safetensors` under `DIR/data`, and `manifest.json` lists the shards.
A rerun appends shards after the last complete one (a shard is written to a temporary name and
renamed), until the answers hold at least the requested number of tokens.
"""

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel, load_model, transformers_model
from quickdraft.models.native.weights import quantize_rows
from quickdraft.text import encode_prompt

MANIFEST = "manifest.json"
HIDDEN_DTYPE = torch.bfloat16  # stored states; training reads them back as float32


def default_writer_dtype() -> str:
    """bfloat16 where oneDNN has native bfloat16 matrix kernels on this CPU, float32 elsewhere."""
    native_bfloat16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()
    return "bfloat16" if native_bfloat16 else "float32"


@dataclass(frozen=True)
class AnswerConfig:
    """How the target writes its answers."""

    max_new_tokens: int = 128  # answer length cap
    batch_size: int = 64  # sequences per generate call
    chunk_prompts: int = 128  # prompts per shard
    max_prompt_tokens: int = 256  # longer prompts are skipped
    dtype: str = field(default_factory=default_writer_dtype)  # "float32", "bfloat16" or "int8" (see int8_rounded)


@dataclass(frozen=True)
class Sequence:
    """One prompt and the target's answer, with the target's states."""

    prompt_index: int  # index in the prompt list
    tokens: torch.Tensor  # [T] int64: prompt tokens then answer tokens (last generated token dropped)
    hidden: torch.Tensor  # [T, hidden] the target's post-norm state at each position
    answer_start: int  # index of the first answer token in `tokens`


@dataclass(frozen=True)
class Shard:
    """Many sequences stored flat."""

    tokens: torch.Tensor  # [N] int64, sequences concatenated
    hidden: torch.Tensor  # [N, hidden]
    lengths: torch.Tensor  # [S] int64
    answer_starts: torch.Tensor  # [S] int64
    prompt_indices: torch.Tensor  # [S] int64

    def sequences(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, int]]:
        """(prompt_index, tokens [T], hidden [T, d], answer_start) per sequence."""
        starts = torch.cumsum(self.lengths, 0) - self.lengths
        for i, (start, length) in enumerate(zip(starts.tolist(), self.lengths.tolist())):
            end = start + length
            yield (
                int(self.prompt_indices[i]),
                self.tokens[start:end],
                self.hidden[start:end],
                int(self.answer_starts[i]),
            )

    @property
    def answer_tokens(self) -> int:
        return int((self.lengths - self.answer_starts).sum())


def prompt_list_digest(prompts: list[str]) -> str:
    return hashlib.sha256("\n\x00".join(prompts).encode()).hexdigest()[:16]


def generate_shards(
    load_writer: Callable[[], LoadedModel],
    prompts: list[str],
    data_dir: Path,
    target_tokens: int,
    config: AnswerConfig,
    identity: dict,
    progress: Callable[[int, int], None] = lambda done, goal: None,
) -> int:
    """Append shards to `data_dir` until the answers hold `target_tokens` tokens; returns the total.

    `load_writer` gives the model that writes the answers; it is called once, and only when a
    shard is still to be written (a resumed run whose data is complete loads nothing).
    """
    manifest = _open_manifest(data_dir, prompts, config, identity)
    total = sum(entry["answer_tokens"] for entry in manifest["shards"])
    next_chunk = len(manifest["shards"])
    writer = None
    while total < target_tokens:
        first = next_chunk * config.chunk_prompts
        if first >= len(prompts):
            print(f"prompts exhausted after {total} answer tokens", flush=True)
            break
        chunk = list(range(first, min(first + config.chunk_prompts, len(prompts))))
        writer = writer or load_writer()
        shard = answer_chunk(transformers_model(writer), writer.tokenizer, prompts, chunk, config)
        entry = _write_shard(data_dir, next_chunk, shard)
        manifest["shards"].append(entry)
        _write_json(data_dir / MANIFEST, manifest)
        total += entry["answer_tokens"]
        next_chunk += 1
        progress(total, target_tokens)
    return total


def _open_manifest(data_dir: Path, prompts: list[str], config: AnswerConfig, identity: dict) -> dict:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / MANIFEST
    expected = {"target": identity, "prompts": prompt_list_digest(prompts), "generation": asdict(config)}
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
        raise UsageError(f"no training data in {data_dir}; run quickdraft distill without --skip-data first")
    manifest = json.loads(path.read_text())
    return [_read_shard(data_dir / entry["file"]) for entry in manifest["shards"]]


def answer_chunk(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    chunk: list[int],
    config: AnswerConfig,
) -> Shard:
    """The target's answers to prompts[i] for i in chunk, batched by similar prompt length."""
    encoded = {
        i: encode_prompt(tokenizer, prompts[i], chat=bool(tokenizer.chat_template), model_name="target") for i in chunk
    }
    kept = sorted((i for i in chunk if len(encoded[i]) <= config.max_prompt_tokens), key=lambda i: len(encoded[i]))
    sequences: list[Sequence] = []
    for start in range(0, len(kept), config.batch_size):
        batch = kept[start : start + config.batch_size]
        sequences += generate_batch(model, [encoded[i] for i in batch], batch, config.max_new_tokens)
    return _pack(sequences, model.config.get_text_config().hidden_size)


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel, prompt_ids: list[list[int]], prompt_indices: list[int], max_new_tokens: int
) -> list[Sequence]:
    """Greedy answers to a batch of tokenised prompts, with the post-norm state of every position."""
    pad = _pad_id(model)
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.tensor(
        [[pad] * (width - len(ids)) + ids for ids in prompt_ids], device=model.device
    )  # [B, width]
    attention = torch.tensor(
        [[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=model.device
    )  # [B, width]
    captured: list[torch.Tensor] = []
    hook = final_norm(model).register_forward_hook(
        lambda module, args, output: captured.append(output.to(HIDDEN_DTYPE))
    )
    try:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            top_p=None,
            top_k=None,
            temperature=None,
        )  # [B, width + generated]
    finally:
        hook.remove()
    hidden = torch.cat(captured, dim=1).cpu()  # [B, width + generated - 1, d]
    eos = set(_eos_ids(model))
    return [
        _sequence(index, out[row, width:].tolist(), ids, hidden[row, width - len(ids) :], eos)
        for row, (index, ids) in enumerate(zip(prompt_indices, prompt_ids))
    ]


def _sequence(
    prompt_index: int, generated: list[int], prompt: list[int], hidden: torch.Tensor, eos: set[int]
) -> Sequence:
    """Cut the answer after its first EOS, then drop the last token (its state was never computed)."""
    length = next((i + 1 for i, token in enumerate(generated) if token in eos), len(generated))
    tokens = torch.tensor(prompt + generated[: length - 1], dtype=torch.long)  # [T]
    return Sequence(prompt_index, tokens, hidden[: len(tokens)].clone(), answer_start=len(prompt))


def load_writer(target_name: str, dtype: str) -> LoadedModel:
    """The transformers model that writes the answers in generation dtype `dtype`."""
    writer = load_model(target_name, runtime="hf", dtype="float32" if dtype == "float32" else "bfloat16")
    if dtype == "int8":
        int8_rounded(transformers_model(writer))
    return writer


@torch.no_grad()
def int8_rounded(model: PreTrainedModel) -> PreTrainedModel:
    """The model with every decoder matrix and the output layer rounded to per-row int8, in place.

    This is the default native runtime's arithmetic (`Linear(..., int8=True)`: the same rows, the
    same scales, bfloat16 activations), so a bfloat16 model rounded this way writes answers much
    closer to the engine's default target than the unrounded model does (bfloat16 sums in another
    order still differ at near-ties). The input embedding stays as it is, as there; a tied output
    layer is untied first.
    """
    decoder_linears = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    for linear in [*decoder_linears, model.get_output_embeddings()]:
        q, scales = quantize_rows(linear.weight.detach())  # [out, in] int8, [out]
        linear.weight = torch.nn.Parameter(
            (q.float() * scales.float()[:, None]).to(linear.weight.dtype), requires_grad=False
        )
    return model


def final_norm(model: PreTrainedModel) -> torch.nn.Module:
    """The module whose output is the state the output layer reads."""
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None:
        raise UsageError(
            f"{type(model).__name__} has no final norm at model.norm; distill supports Llama- and Gemma-style models"
        )
    return norm


def _pad_id(model: PreTrainedModel) -> int:
    config = model.generation_config
    if config.pad_token_id is not None:
        return int(config.pad_token_id)
    return _eos_ids(model)[0]


def _eos_ids(model: PreTrainedModel) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        raise UsageError("the target has no eos_token_id in its generation config; set one")
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def _pack(sequences: list[Sequence], hidden_size: int) -> Shard:
    if not sequences:
        return Shard(
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, hidden_size, dtype=HIDDEN_DTYPE),
            *(torch.zeros(0, dtype=torch.long) for _ in range(3)),
        )
    return Shard(
        tokens=torch.cat([s.tokens for s in sequences]),
        hidden=torch.cat([s.hidden for s in sequences]),
        lengths=torch.tensor([len(s.tokens) for s in sequences]),
        answer_starts=torch.tensor([s.answer_start for s in sequences]),
        prompt_indices=torch.tensor([s.prompt_index for s in sequences]),
    )


def _write_shard(data_dir: Path, number: int, shard: Shard) -> dict:
    name = f"shard-{number:05d}.safetensors"
    temporary = data_dir / f".{name}.partial"
    save_file({field: getattr(shard, field).contiguous() for field in Shard.__dataclass_fields__}, str(temporary))
    os.replace(temporary, data_dir / name)
    return {"file": name, "sequences": len(shard.lengths), "answer_tokens": shard.answer_tokens}


def _read_shard(path: Path) -> Shard:
    tensors = load_file(str(path))
    return Shard(**{field: tensors[field] for field in Shard.__dataclass_fields__})


def _write_json(path: Path, value: dict) -> None:
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(json.dumps(value, indent=1))
    os.replace(temporary, path)
