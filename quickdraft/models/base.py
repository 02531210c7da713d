"""The `ModelRunner` interface every model backend implements: everything the engine, the drafters
and the tools ask of a model.

A runner owns one model and one KV cache for a single sequence (batch 1). The cache holds the
first `cache_length` tokens of the sequence; `forward` appends tokens at the next positions and
returns their logits; `rollback` forgets everything after a given length, so rejected draft
tokens are simply overwritten by the next `forward`.

A `BatchRunner` holds several sequences at once, one KV cache *slot* each, and runs one forward
over a ragged batch (`forward_batch`): every sequence brings its own new tokens (a prefill chunk,
or a pending token and its draft) and gets back the rows it asked for. The promise that makes a
request's output independent of what else runs: every row a sequence gets from a batched forward
is bit-identical to what the same tokens give in a forward of that sequence alone.

Hidden states, for drafters that read the target's own states (the `head` drafter), come from the
same forward pass, never an extra one. With `hidden_layers=(i, j, ...)`, `prefill` returns
`(logits [vocab], hidden [len(token_ids), len(layers) * hidden_size])` and `forward` returns
`(logits [n, vocab], hidden [n, len(layers) * hidden_size])`: for each layer id in the order given,
the state at every input position, concatenated. The ids number states as transformers'
`output_hidden_states` does: id i < num_layers is the residual stream entering decoder layer i
(id 0: the embeddings as the first layer reads them), id num_layers the final state after the final
norm (exactly the vector the output layer multiplies). Prefill returns them for every prompt
position, though it computes logits only for the last; with no ids nothing changes.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a model besides its weights."""

    name: str  # registry name or path it was loaded from
    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int  # number of logits per position (may exceed the tokenizer's size: padding)
    max_context: int  # longest sequence the runner accepts, prompt plus generated tokens
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)  # any of these ends generation


class MatrixProduct(Protocol):
    """One weight matrix of a forward and the product with it."""

    in_features: int  # columns of the matrix: an input is [rows, in_features]
    nbytes: int  # bytes a product reads (the weight as stored, with its scales and bias)
    form: str  # how the weight is stored: "dense", "int8" (per row) or "int4" (32-column groups)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] in the runner's dtype -> [rows, out]."""
        ...


def synchronize(device: torch.device) -> None:
    """Wait until `device` has run every kernel queued on it: a GPU runs them after the call that queued them has
    returned, so whoever times a forward waits for it (a CPU computes before returning)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@runtime_checkable
class ModelRunner(Protocol):
    """One causal LM with its own KV cache, batch 1."""

    info: ModelInfo
    device: torch.device
    dtype: torch.dtype  # of the activations and the KV cache

    @property
    def cache_length(self) -> int:
        """Number of tokens whose keys and values are in the cache."""
        ...

    def prefill(
        self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Reset the cache, run the prompt; the logits of its last position [vocab] float32 (and, with
        `hidden_layers`, the states of every prompt position [len(token_ids), len(layers) * hidden_size])."""
        ...

    def forward(
        self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append tokens at positions cache_length..; their logits [len(token_ids), vocab] float32 (and, with
        `hidden_layers`, their states [len(token_ids), len(layers) * hidden_size])."""
        ...

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens (length <= cache_length, else `InternalError`)."""
        ...

    def embedding_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token embeddings [vocab, hidden_size], output layer [vocab, hidden_size]) as stored (Gemma's
        embedding scale not applied): a head reuses them, and its identity check probes the output layer."""
        ...

    def linear_layers(self) -> Sequence[MatrixProduct]:
        """Every matrix product of a forward, in order, each taking [rows, in] (bench-runtime times them alone:
        a decode ceiling); empty when the runner cannot isolate them (transformers)."""
        ...


def matrix_forms(runner: ModelRunner) -> dict[str, int]:
    """How many of the runner's matrices run in each form, e.g. {"int4": 120, "int8": 1}; empty for transformers."""
    return dict(Counter(linear.form for linear in runner.linear_layers()))


PREFILL_BLOCK = 128  # prompt positions per block: cut a prompt into forwards at multiples of it (`SequenceStep`)


@dataclass(frozen=True)
class SequenceStep:
    """One sequence's part of a batched forward.

    A prompt read in several forwards leaves the same cache however it was cut, as long as every chunk but
    the last ends at a multiple of PREFILL_BLOCK positions.
    """

    slot: int  # the sequence's KV cache slot
    token_ids: tuple[int, ...]  # new tokens, at positions slot_length(slot)..
    logits: Literal["all", "last", "none"] = "all"  # which rows' logits come back (a prefill chunk: last or none)
    hidden_layers: tuple[int, ...] = ()  # also return these states of every new position (ids as in `prefill`)


@dataclass(frozen=True)
class SequenceOutput:
    """What one sequence gets back from a batched forward."""

    logits: torch.Tensor | None  # [len(token_ids), vocab] ("all"), [1, vocab] ("last") or None; float32
    hidden: torch.Tensor | None  # [len(token_ids), len(hidden_layers) * hidden_size] float32, when asked


@runtime_checkable
class BatchRunner(ModelRunner, Protocol):
    """A runner that holds several sequences, one KV cache slot each, and runs them in one forward.

    The batch-1 methods of `ModelRunner` work on a slot of their own, never on an opened one.
    """

    def open_slot(self) -> int:
        """A free slot, empty, for a new sequence."""
        ...

    def close_slot(self, slot: int) -> None:
        """The sequence is done; its slot may be handed out again."""
        ...

    def slot_length(self, slot: int) -> int:
        """Tokens cached in `slot`."""
        ...

    def rollback_slot(self, slot: int, length: int) -> None:
        """Keep only the first `length` tokens of `slot` (O(1))."""
        ...

    def forward_batch(self, steps: Sequence[SequenceStep]) -> list[SequenceOutput]:
        """One forward over every step's tokens (each slot at most once); outputs in the order of `steps`."""
        ...

    def slot_bytes(self) -> int:
        """KV cache bytes one slot holds when its sequence fills the model's context."""
        ...
