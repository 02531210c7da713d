"""The `none` drafter: proposes nothing, so the loop is plain target decoding (the baseline)."""

import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters.base import Draft, DrafterLoadOptions, register_drafter
from quickdraft.models.loading import LoadedModel


class NoDrafter:
    name = "none"
    lookup_only = True

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        pass

    def propose(self, context_ids: list[int], k: int) -> Draft:
        return Draft(token_ids=())


@register_drafter("none")
def _make(argument: str, target: LoadedModel, spec: SpecConfig, options: DrafterLoadOptions) -> NoDrafter:
    return NoDrafter()
