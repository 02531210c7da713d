"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's tail.

For n from `max_n` down to `min_n`, take the last n tokens of the context; if they occurred
earlier, propose the (up to k) tokens that followed their most recent earlier occurrence that
still has k tokens after it (in a repeating tail the very latest occurrence is followed by a
single token), or else the most recent one. No model, no distribution: proposals are point masses.
"""

import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters.base import Draft, DrafterLoadOptions, register_drafter
from quickdraft.models.loading import LoadedModel


class NgramDrafter:
    name = "ngram"
    lookup_only = True  # a proposal costs a search of the context, no model forward

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        pass

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if k == 0:
            return Draft(token_ids=())
        context = torch.tensor(context_ids, dtype=torch.long)  # [length]
        for n in range(min(self.max_n, len(context_ids) - 1), self.min_n - 1, -1):
            start = _latest_match(context, n, k)
            if start is not None:
                return Draft(token_ids=tuple(context_ids[start + n : start + n + k]), source=f"{n}-gram")
        return Draft(token_ids=())


def _latest_match(context: torch.Tensor, n: int, k: int) -> int | None:
    """Start of the most recent earlier occurrence of the last n tokens, preferring k successors."""
    windows = context[:-1].unfold(0, n, 1)  # [length - n, n]: every n-gram that has a successor
    hits = (windows == context[-n:]).all(dim=1).nonzero().squeeze(1)  # [matches]
    if hits.numel() == 0:
        return None
    with_full_draft = hits[hits + n + k <= context.shape[0]]  # [matches']
    return int(with_full_draft[-1]) if with_full_draft.numel() else int(hits[-1])


@register_drafter("ngram")
def _make(argument: str, target: LoadedModel, spec: SpecConfig, options: DrafterLoadOptions) -> NgramDrafter:
    return NgramDrafter(min_n=spec.ngram_min, max_n=spec.ngram_max)
