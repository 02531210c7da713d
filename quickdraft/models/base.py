"""The `ModelRunner` interface every model backend implements.

A runner owns one model and one KV cache for a single sequence (batch 1). The cache holds the
first `cache_length` tokens of the sequence; `forward` appends tokens at the next positions and
returns their logits; `rollback` forgets everything after a given length, so rejected draft
tokens are simply overwritten by the next `forward`.
"""

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a model besides its weights."""

    name: str  # registry name or path it was loaded from
    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int  # number of logits per position (may exceed the tokenizer's size: padding)
    max_context: int  # longest sequence the runner accepts, prompt plus generated tokens
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)  # any of these ends generation


@runtime_checkable
class ModelRunner(Protocol):
    """One causal LM with its own KV cache, batch 1."""

    info: ModelInfo
    device: torch.device

    @property
    def cache_length(self) -> int:
        """Number of tokens whose keys and values are in the cache."""

    def prefill(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Reset the cache, run the prompt, return the logits of its last position: [vocab] float32."""

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Append tokens at positions cache_length.. and return their logits: [len(token_ids), vocab] float32."""

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens (length <= cache_length)."""
