"""The `Drafter` protocol and the registry that builds drafters by name.

A drafter proposes up to k tokens that continue the committed context. It sees only token ids;
how it guesses (a lookup, a smaller model, a head on the target's states) is its own business.
Lifecycle per request: `begin` once, then `propose` once per step. The context passed to
`propose` is the whole committed sequence (prompt + generated tokens); a drafter with a cache
rolls it back to whatever prefix of its own history is still valid.

A drafter may set the class attribute `lookup_only = True` when proposing costs a lookup, not a
model forward (n-gram): the adaptive controller then asks it for k_max tokens before deciding,
and cuts the proposal to the k it chooses.

A drafter that reads the target's hidden states (the `head` drafter) sets the class attribute
`needs_target_hidden = True` and has `observe_target(hidden)`: the engine then asks the target
for its states and passes, after the prefill, the states of every prompt position, and after
each verification, the states of the positions that were committed (the pending token and the
accepted draft tokens): `hidden` [n, hidden] holds the next n committed positions, in order.
Other drafters cost nothing: the engine only requests states when the attribute is set.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel


@dataclass(frozen=True)
class Draft:
    """Proposed continuation of the context."""

    token_ids: tuple[int, ...]  # [k'] with k' <= k
    probs: torch.Tensor | None = (
        None  # [k', target_vocab] distributions the tokens were drawn from; None = point masses
    )
    source: str = ""  # what the proposal rests on (e.g. "3-gram"); the adaptive controller learns acceptance per source

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncated(self, k: int) -> "Draft":
        """The first k proposed tokens."""
        return Draft(self.token_ids[:k], None if self.probs is None else self.probs[:k], self.source)


class Drafter(Protocol):
    """Proposes tokens for the target to verify."""

    name: str

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        """Start a new request; `generator` is the request's RNG for any sampling the drafter does."""

    def propose(self, context_ids: list[int], k: int) -> Draft:
        """Up to k tokens continuing `context_ids` (prompt + generated so far)."""


def is_lookup(drafter: Drafter) -> bool:
    """True when the drafter's proposals cost only a lookup (its `lookup_only` attribute, False when absent)."""
    return bool(getattr(drafter, "lookup_only", False))


DrafterFactory = Callable[[str, LoadedModel, SpecConfig, "DrafterLoadOptions"], Drafter]


@dataclass(frozen=True)
class DrafterLoadOptions:
    """How a drafter that holds a model loads it (the target's settings by default)."""

    runtime: str = "auto"
    dtype: str = "auto"
    device: str = "cpu"


_FACTORIES: dict[str, DrafterFactory] = {}


def register_drafter(kind: str) -> Callable[[DrafterFactory], DrafterFactory]:
    """Register a factory for drafter specs `kind` or `kind:ARGUMENT`."""

    def decorator(factory: DrafterFactory) -> DrafterFactory:
        _FACTORIES[kind] = factory
        return factory

    return decorator


def drafter_kinds() -> list[str]:
    return sorted(_FACTORIES)


def make_drafter(spec_name: str, target: LoadedModel, spec: SpecConfig, options: DrafterLoadOptions) -> Drafter:
    """Build a drafter from a spec: a registered kind ("ngram", "none"), "kind:ARG", or a draft model."""
    _import_builtin_drafters()
    if not spec_name:
        raise UsageError("drafter name is empty; use none, ngram or a draft model name")
    kind, _, argument = spec_name.partition(":")
    if kind in _FACTORIES and (argument or kind == spec_name):
        return _FACTORIES[kind](argument, target, spec, options)
    return _FACTORIES["model"](spec_name, target, spec, options)


def _import_builtin_drafters() -> None:
    from quickdraft.drafters import draft_model, head, ngram, no_draft  # noqa: F401  (registers them)
