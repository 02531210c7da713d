"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's tail.

For n from `max_n` down to `min_n`, take the last n tokens of the context; if they occurred
earlier, propose the (up to k) tokens that followed their most recent earlier occurrence that
still has k tokens after it (in a repeating tail the very latest occurrence is followed by a
single token), or else the most recent one. No model, no distribution: proposals are point masses.

Its sizes are part of its name: `ngram` looks up suffixes of 1..4 tokens, `ngram:MAX` of 1..MAX,
`ngram:MIN-MAX` of MIN..MAX (so a request asking for other sizes gets a drafter of its own).
"""

import bisect
import re

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel

DEFAULT_MIN_N, DEFAULT_MAX_N = 1, 4
MAX_N_LIMIT = 16  # longest suffix anyone may ask to look up


class NgramDrafter(Drafter):
    lookup_only = True  # a proposal costs a search of the context, no model forward

    def __init__(self, min_n: int = DEFAULT_MIN_N, max_n: int = DEFAULT_MAX_N, name: str = "ngram") -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.name = name
        self._index = _NgramIndex(min_n, max_n)

    @classmethod
    def from_argument(cls, argument: str, target: LoadedModel, options: DrafterLoadOptions) -> "NgramDrafter":
        """`ngram` (sizes 1..4), `ngram:MAX` or `ngram:MIN-MAX`."""
        min_n, max_n = parse_sizes(argument)
        return cls(min_n, max_n, name=f"ngram:{argument}" if argument else "ngram")

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        self._index = _NgramIndex(self.min_n, self.max_n)  # the request's own (a fork shares its parent's until now)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if k == 0:
            return Draft(token_ids=())
        self._index.extend(context_ids)
        for n in range(min(self.max_n, len(context_ids) - 1), self.min_n - 1, -1):
            start = self._index.latest_match(n, k)
            if start is not None:
                return Draft(token_ids=tuple(context_ids[start + n : start + n + k]), source=f"{n}-gram")
        return Draft(token_ids=())


class _NgramIndex:
    """Where each n-gram (min_n <= n <= max_n) of a context starts, kept up to date as the context grows (a
    request's context only grows: committed tokens), so a lookup costs a dictionary access, not a scan."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.sizes = range(min_n, max_n + 1)
        self.tokens: list[int] = []  # the context indexed so far
        self.starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> its start positions, ascending

    def extend(self, context_ids: list[int]) -> None:
        """Index `context_ids`' new tokens (all of it when it does not continue the indexed context)."""
        if context_ids[: len(self.tokens)] != self.tokens:
            self.tokens, self.starts = [], {}
        for end in range(len(self.tokens) + 1, len(context_ids) + 1):
            for n in self.sizes:
                if end >= n:
                    self.starts.setdefault(tuple(context_ids[end - n : end]), []).append(end - n)
        self.tokens.extend(context_ids[len(self.tokens) :])

    def latest_match(self, n: int, k: int) -> int | None:
        """Start of the most recent earlier occurrence of the last n tokens (one with a successor), preferring
        one with k successors."""
        length = len(self.tokens)
        starts = self.starts.get(tuple(self.tokens[length - n :]), [])
        for last_start in (length - n - k, length - n - 1):  # k successors, else at least one
            i = bisect.bisect_right(starts, last_start)
            if i > 0:
                return starts[i - 1]
        return None


def parse_sizes(argument: str) -> tuple[int, int]:
    """(min_n, max_n) from "" (the defaults), "MAX" or "MIN-MAX"; UsageError for anything else."""
    if not argument:
        return DEFAULT_MIN_N, DEFAULT_MAX_N
    match = re.fullmatch(r"(?:([1-9]\d*)-)?([1-9]\d*)", argument)
    min_n, max_n = (int(match[1] or DEFAULT_MIN_N), int(match[2])) if match else (0, 0)
    if not 1 <= min_n <= max_n <= MAX_N_LIMIT:
        raise UsageError(
            f"ngram sizes {argument!r} are not valid; use ngram, ngram:MAX or ngram:MIN-MAX "
            f"with 1 <= MIN <= MAX <= {MAX_N_LIMIT}"
        )
    return min_n, max_n
