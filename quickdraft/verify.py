"""Verification: which draft tokens the target keeps, as pure functions of token ids and distributions.

Every verification step outputs `num_accepted + 1` tokens, of three kinds:

- *accepted* tokens: draft tokens the target keeps, a prefix of the draft;
- a *recovered* token: at the first rejected position, a token chosen by the target
  (greedy: its argmax; sampling: a draw from the residual distribution);
- a *bonus* token: when every draft token is accepted, the target's own next token, chosen
  from its distribution at the position after the draft.

Greedy verification keeps the draft while it equals the target's argmax, so the output is the
target's greedy output token for token. Sampling uses modified rejection sampling (Leviathan
et al. 2023; Chen et al. 2023): draft token x at position i is accepted with probability
min(1, target_probs[i, x] / draft_probs[i, x]); on rejection the recovered token is drawn from
normalise(max(0, target_probs[i] - draft_probs[i])). Each output token is then distributed
exactly as the target's warped distribution. A drafter without a distribution (n-gram lookup)
proposes a point mass (draft_probs None): its token is accepted with probability target_probs[i, x], and its
residual is the target's row with that token removed. The sampler reads the target's rows in order and stops
at the first rejection, so rows warped on demand (`sampling.WarpedRows`) are warped only up to there.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from quickdraft.categorical import draw


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft."""

    num_accepted: int  # how many draft tokens were kept (a prefix of the draft)
    tokens: tuple[int, ...]  # the accepted tokens, then one recovered or bonus token


def greedy_verify(draft_ids: Sequence[int], target_ids: Sequence[int]) -> Verdict:
    """Keep the draft while it matches the target's argmax.

    draft_ids: [k] proposed tokens; target_ids: [k + 1] the argmax of the target's logits at the
    position of each draft token and one after the last. Plain integers: it runs once per request
    per step, where a few torch calls on k-element tensors cost more than the comparison.
    """
    num_accepted = 0
    while num_accepted < len(draft_ids) and draft_ids[num_accepted] == target_ids[num_accepted]:
        num_accepted += 1
    return Verdict(num_accepted, tuple(target_ids[: num_accepted + 1]))


class ProbabilityRows(Protocol):
    """The target's warped distributions by draft position: a [k + 1, vocab] tensor, or rows warped on demand
    (`sampling.WarpedRows`: the sampler stops at its first rejection and never reads the rows after it)."""

    def __getitem__(self, row: int) -> torch.Tensor: ...  # [vocab]


def rejection_sample(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: ProbabilityRows,
    generator: torch.Generator,
) -> Verdict:
    """Modified rejection sampling; the output follows the target distribution exactly.

    draft_ids: [k] proposed tokens; draft_probs: [k, vocab] the distributions they were drawn
    from, or None for point-mass drafts; target_probs: [k + 1] rows of [vocab], the target's warped
    distributions at each draft position and one after, read in order up to the first rejection.
    """
    k = draft_ids.shape[0]
    tokens = draft_ids.tolist()
    uniform = torch.rand(k, generator=generator, device=draft_ids.device)  # [k]
    if draft_probs is not None:
        uniform = uniform * draft_probs[torch.arange(k, device=draft_ids.device), draft_ids]  # [k]
    thresholds = uniform.tolist()  # accept position i when u_i * draft_p_i < target_p_i (no dividing by 0)
    for i, (token, threshold) in enumerate(zip(tokens, thresholds)):
        row = target_probs[i]  # [vocab]
        if not threshold < float(row[token]):
            if draft_probs is None:
                residual = point_mass_residual(row, token)
            else:
                residual = residual_distribution(row, draft_probs[i])
            return Verdict(i, (*tokens[:i], _draw(residual, generator)))
    return Verdict(k, (*tokens, _draw(target_probs[k], generator)))  # every draft kept: the bonus token


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, target - draft)) for one position: [vocab] -> [vocab].

    When the two distributions are equal a rejection has probability zero; if float rounding
    still leaves no positive mass, the target distribution itself is the correct fallback.
    """
    return _normalised((target_probs - draft_probs).clamp_min(0), target_probs)


def point_mass_residual(target_probs: torch.Tensor, token: int) -> torch.Tensor:
    """`residual_distribution` against a point mass on `token`, without building it: the target's row with that
    token's probability zeroed, normalised ([vocab] -> [vocab]; the same values, since p - 1 <= 0 and p - 0 = p)."""
    residual = target_probs.clone()
    residual[token] = 0.0
    return _normalised(residual, target_probs)


def _normalised(residual: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    mass = residual.sum()
    return residual / mass if mass > 0 else target_probs


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(draw(probs[None], generator)[0])
