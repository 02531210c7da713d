"""Drafters built by name: `none`, `ngram[:OPTIONS]`, `corpus[:FILE]`, `head[:DIR]`, a draft model, or a plug-in
kind.

A drafter name is `KIND` or `KIND:ARGUMENT`; the argument is the kind's own business (n-gram
sizes, a head directory). A name that is no kind is a draft model's name or path. Each kind
says whether building it loads files or a model (`loads_model`): a server lets a request name
only kinds that load nothing, besides its own drafter setting, so request content never names a
file. `check_name` refuses bad options before any model loads.

Built-in kinds are listed once, in `BUILTIN_KINDS`; `register_drafter` adds a plug-in kind.
"""

from collections.abc import Callable
from dataclasses import dataclass

from quickdraft.drafters.base import Drafter, DrafterLoadOptions
from quickdraft.drafters.corpus import CorpusDrafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.head.drafter import HeadDrafter
from quickdraft.drafters.ngram import NgramDrafter, parse_sizes
from quickdraft.drafters.no_draft import NoDrafter
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel

DrafterFactory = Callable[[str, LoadedModel, DrafterLoadOptions], Drafter]  # (argument, target, options)
MODEL_KIND = "model"  # the kind of any name that is not a registered kind: a draft model's name or path


@dataclass(frozen=True)
class DrafterKind:
    """How to build one kind of drafter from the argument after `KIND:`."""

    build: DrafterFactory
    loads_model: bool  # building it reads files or loads a model (never on a request's say-so)
    check: Callable[[str], object] = lambda argument: None  # raises UsageError for a bad argument, loading nothing


BUILTIN_KINDS: dict[str, DrafterKind] = {
    "none": DrafterKind(NoDrafter.from_argument, loads_model=False, check=NoDrafter.check_argument),
    "ngram": DrafterKind(NgramDrafter.from_argument, loads_model=False, check=parse_sizes),
    "corpus": DrafterKind(CorpusDrafter.from_argument, loads_model=True),
    "head": DrafterKind(HeadDrafter.from_argument, loads_model=True),
    MODEL_KIND: DrafterKind(DraftModelDrafter.from_argument, loads_model=True),
}
_KINDS: dict[str, DrafterKind] = dict(BUILTIN_KINDS)


def register_drafter(kind: str, build: DrafterFactory, loads_model: bool = True) -> None:
    """Add a plug-in kind: `--drafter KIND` or `KIND:ARGUMENT` then builds `build(argument, target, options)`."""
    _KINDS[kind] = DrafterKind(build, loads_model)


def parse_name(name: str) -> tuple[str, str]:
    """(kind, argument) of a drafter name: `KIND[:ARGUMENT]` for a registered kind, else (MODEL_KIND, name)."""
    kind, _, argument = name.partition(":")
    if kind in _KINDS and (argument or kind == name):
        return kind, argument
    return MODEL_KIND, name


def loads_model(name: str) -> bool:
    """True when building the drafter `name` reads files or loads a model."""
    return _KINDS[parse_name(name)[0]].loads_model


def check_name(name: str) -> None:
    """Refuse (UsageError) a drafter name whose options its kind cannot parse, before anything loads."""
    kind, argument = parse_name(name)
    _KINDS[kind].check(argument)


def make_drafter(name: str, target: LoadedModel, options: DrafterLoadOptions) -> Drafter:
    """Build the drafter `name` (see the module docstring) for `target`."""
    if not name:
        raise UsageError("drafter name is empty; use none, ngram or a draft model name")
    kind, argument = parse_name(name)
    return _KINDS[kind].build(argument, target, options)
