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
proposes a point mass: its draft_probs row is one-hot on the proposed token.
"""

from collections.abc import Sequence
from dataclasses import dataclass

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


def rejection_sample(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Modified rejection sampling; the output follows the target distribution exactly.

    draft_ids: [k] proposed tokens; draft_probs: [k, vocab] the distributions they were drawn
    from, or None for point-mass drafts; target_probs: [k + 1, vocab] the target's warped
    distributions at each draft position and one after.
    """
    k = draft_ids.shape[0]
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_ids, target_probs.shape[-1]).to(
            target_probs.dtype
        )  # [k, vocab]
    rows = torch.arange(k, device=draft_ids.device)
    target_p = target_probs[rows, draft_ids]  # [k]
    draft_p = draft_probs[rows, draft_ids]  # [k]
    uniform = torch.rand(k, generator=generator, device=draft_ids.device)  # [k]
    num_accepted = _leading_true(uniform * draft_p < target_p)  # u < target/draft without dividing by 0
    if num_accepted == k:
        last = _draw(target_probs[k], generator)  # bonus
    else:
        last = _draw(residual_distribution(target_probs[num_accepted], draft_probs[num_accepted]), generator)
    return Verdict(num_accepted, tuple(draft_ids[:num_accepted].tolist()) + (last,))


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, target - draft)) for one position: [vocab] -> [vocab].

    When the two distributions are equal a rejection has probability zero; if float rounding
    still leaves no positive mass, the target distribution itself is the correct fallback.
    """
    residual = (target_probs - draft_probs).clamp_min(0)
    mass = residual.sum()
    return residual / mass if mass > 0 else target_probs


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(draw(probs[None], generator)[0])


def _leading_true(mask: torch.Tensor) -> int:
    """Length of the all-True prefix of a 1-D bool tensor."""
    return int(mask.to(torch.int64).cumprod(dim=0).sum())
