"""The `Drafter` protocol: everything the engine and the controller ask of a drafter.

A drafter proposes up to k tokens that continue the committed context. It sees only token ids;
how it guesses (a lookup, a smaller model, a head on the target's states) is its own business.
Lifecycle per request: `begin` once, then `propose` once per step. The context passed to
`propose` is the whole committed sequence (prompt + generated tokens); a drafter with a cache
rolls it back to whatever prefix of its own history is still valid.

Each running request drafts with its own `fork` of a drafter, released with `finish` when the request
ends, so requests batched together never share drafter state.

Two capabilities have defaults that a drafter subclassing `Drafter` inherits and may override:

- `lookup_only` (default False): proposing costs a lookup, not a model forward (n-gram). The
  adaptive controller then asks it for k_max tokens before deciding, and cuts the proposal to
  the k it chooses; it never times such a drafter.
- `target_layers` (default empty) with `observe_target(hidden)`: the drafter reads these states
  of the target (layer ids as in `models/base.py`: id i is what decoder layer i reads; the `head`
  drafter reads three). The engine then asks the target's forwards for them and passes, after the
  prefill, the states of every prompt position, and after each verification, the states of the
  positions that were committed (the pending token and the accepted draft tokens): `hidden`
  [n, len(target_layers) * hidden] holds the next n committed positions, in order. Other drafters
  cost nothing: the engine only requests states a drafter names.
"""

import copy
from dataclasses import dataclass
from typing import Protocol

import torch

from quickdraft.config import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Proposed continuation of the context."""

    token_ids: tuple[int, ...]  # [k'] with k' <= k
    # [k', target_vocab] distributions the tokens were drawn from; None = point masses
    probs: torch.Tensor | None = None
    # what the proposal rests on (e.g. "3-gram"); the adaptive controller learns acceptance per source
    source: str = ""

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncated(self, k: int) -> "Draft":
        """The first k proposed tokens."""
        return Draft(self.token_ids[:k], None if self.probs is None else self.probs[:k], self.source)


class Drafter(Protocol):
    """Proposes tokens for the target to verify. Subclass it to inherit the capability defaults."""

    name: str
    lookup_only: bool = False  # proposing costs a lookup, not a model forward
    target_layers: tuple[int, ...] = ()  # the target's states the engine passes to `observe_target`

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        """Start a new request; `generator` is the request's RNG for any sampling the drafter does."""
        ...

    def propose(self, context_ids: list[int], k: int) -> Draft:
        """Up to k tokens continuing `context_ids` (prompt + generated so far)."""
        ...

    def observe_target(self, hidden: torch.Tensor) -> None:
        """The target's states [n, len(target_layers) * hidden] at the next n committed positions (only when
        `target_layers` names some)."""
        raise NotImplementedError(f"{type(self).__name__} reads no target states; it must not set target_layers")

    def fork(self) -> "Drafter":
        """A drafter with this one's weights and request state of its own: the engine drafts each running
        request with a fork. The default, a shallow copy, suits a drafter whose `begin` replaces all of its
        request state; one holding a cache elsewhere (a draft model's KV cache) overrides it."""
        return copy.copy(self)

    def finish(self) -> None:
        """The fork's request has ended: give back what it holds (a KV cache slot). Default: nothing."""


@dataclass(frozen=True)
class DrafterLoadOptions:
    """How a drafter that holds a model loads it (the target's settings by default)."""

    runtime: str = "auto"
    dtype: str = "auto"
    device: str = "cpu"
