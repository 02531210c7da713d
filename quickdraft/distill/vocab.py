"""The reduced draft vocabulary: the target tokens that answers use most.

Tokens are ranked by their count in the answers of the training split plus `PRIOR_WEIGHT` times
their count in the training split's prompts (cheap to tokenise, many more of them): answers
decide, prompts order the tokens that answers rarely or never used. Coverage (the fraction of
answer tokens inside the vocabulary) is reported on the held-out split, so it estimates how often
a new answer needs a token the head cannot draft. `size=None` picks the smallest multiple of
`AUTO_STEP` whose held-out coverage reaches `MIN_COVERAGE`.
"""

from dataclasses import dataclass

import torch

MIN_COVERAGE = 0.98
AUTO_STEP = 1024
PRIOR_WEIGHT = 0.01  # weight of a prompt occurrence relative to an answer occurrence


@dataclass(frozen=True)
class VocabChoice:
    ids: torch.Tensor  # [draft_vocab] target token ids, most frequent first (forced ids included)
    train_coverage: float  # fraction of training answer tokens inside the vocabulary
    heldout_coverage: float  # the same on the held-out split


def count_tokens(answers: list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """How often each target id occurs in the answers: [vocab_size] int64."""
    if not answers:
        return torch.zeros(vocab_size, dtype=torch.long)
    return torch.bincount(torch.cat(answers), minlength=vocab_size)[:vocab_size]


def choose_vocab(
    train_counts: torch.Tensor,
    heldout_counts: torch.Tensor,
    size: int | None,
    forced: list[int],
    prior_counts: torch.Tensor | None = None,
) -> VocabChoice:
    """Top tokens by training answer frequency (+ prompt prior), always including `forced` ids
    (e.g. end-of-sequence)."""
    score = train_counts.double() + (PRIOR_WEIGHT * prior_counts.double() if prior_counts is not None else 0.0)
    order = _ranking(score, forced)  # [vocab] ids, forced first, then by score
    if size is None:
        size = _smallest_covering_size(order, heldout_counts)
    ids = order[: min(size, len(order))]
    return VocabChoice(ids, coverage(ids, train_counts), coverage(ids, heldout_counts))


def coverage(ids: torch.Tensor, counts: torch.Tensor) -> float:
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 1.0


def prompt_counts(tokenizer, prompts: list[str], vocab_size: int) -> torch.Tensor:
    """Token counts over the prompts' plain tokenisation: [vocab_size] int64."""
    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
    return count_tokens([torch.tensor(ids, dtype=torch.long) for ids in encoded if ids], vocab_size)


def _ranking(score: torch.Tensor, forced: list[int]) -> torch.Tensor:
    boosted = score.clone()
    boosted[torch.tensor(forced, dtype=torch.long)] = float("inf")
    return torch.argsort(boosted, descending=True, stable=True)


def _smallest_covering_size(order: torch.Tensor, heldout_counts: torch.Tensor) -> int:
    covered = torch.cumsum(heldout_counts[order].double(), 0) / max(int(heldout_counts.sum()), 1)  # [vocab]
    for size in range(AUTO_STEP, len(order) + AUTO_STEP, AUTO_STEP):
        if float(covered[min(size, len(order)) - 1]) >= MIN_COVERAGE:
            return min(size, len(order))
    return len(order)
