"""The `none` drafter: proposes nothing, so the loop is plain target decoding (the baseline)."""

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel


class NoDrafter(Drafter):
    name = "none"
    lookup_only = True

    @classmethod
    def from_argument(cls, argument: str, target: LoadedModel, options: DrafterLoadOptions) -> "NoDrafter":
        cls.check_argument(argument)
        return cls()

    @staticmethod
    def check_argument(argument: str) -> None:
        if argument:
            raise UsageError(f"the none drafter takes no options, got none:{argument}; use none")

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        pass

    def propose(self, context_ids: list[int], k: int) -> Draft:
        return Draft(token_ids=())
