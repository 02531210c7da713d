"""Online estimates of how often a drafter's tokens are accepted, position by position.

`a[i]` is the probability that draft token i+1 is accepted given that tokens 1..i were: the
conditional acceptance that the expected tokens per step are built from. Each position keeps
exponentially decayed counts (accepted, tried) plus a prior: PRIOR_STRENGTH pseudo-observations
whose mean is the estimate of the position before it (or, for position 1, a given mean). An
unseen position is thus assumed to behave like the one before it. The prior's weight decays
with the evidence, so after a dozen observations the estimate is the recent empirical rate: a
drafter that is never accepted is estimated at ~0, not held up by the prior, and old evidence
fades so the estimate follows the text.

`outcomes` turns any proposal into observations by comparing it with the tokens the target
actually produced in a step. This is exact for the drafter that was verified, and also for a
proposal that was never verified (an n-gram lookup the controller made but did not use, or the
tail of one it cut short): under greedy decoding the target's token equals the proposed one
exactly when verification would have accepted it; under sampling the target's token is drawn
from the target distribution, so it equals a point-mass proposal with the acceptance
probability itself.
"""

from collections.abc import Sequence

PRIOR_MEAN = 0.5  # position 1 of a drafter nothing is known about
PRIOR_STRENGTH = 2.0  # pseudo-observations behind each prior mean, before any evidence
DECAY = 0.9  # weight kept by older evidence (and the prior) at each new observation of a position


class AcceptanceEstimate:
    """Decayed Beta-style estimates of conditional acceptance at draft positions 1..positions."""

    def __init__(self, positions: int, prior_means: Sequence[float] = ()) -> None:
        self._prior_means = list(prior_means)[:positions]  # [<= positions]: carried over from earlier requests
        self._prior_weight = [PRIOR_STRENGTH] * positions  # [positions] decays with each observation
        self._accepted = [0.0] * positions  # [positions] decayed count of acceptances
        self._tried = [0.0] * positions  # [positions] decayed count of observations

    def observe(self, accepted: Sequence[bool]) -> None:
        """Outcomes at positions 1, 2, ... of one proposal (see `outcomes`)."""
        for position, ok in enumerate(accepted[: len(self._tried)]):
            self._prior_weight[position] *= DECAY
            self._accepted[position] = DECAY * self._accepted[position] + ok
            self._tried[position] = DECAY * self._tried[position] + 1.0

    def means(self) -> list[float]:
        """[positions] estimated acceptance at each position."""
        means = []
        previous = PRIOR_MEAN
        for position, (accepted, tried) in enumerate(zip(self._accepted, self._tried)):
            prior = self._prior_means[position] if position < len(self._prior_means) else previous
            weight = self._prior_weight[position]
            previous = (weight * prior + accepted) / (weight + tried)
            means.append(previous)
        return means


def outcomes(proposal: Sequence[int], produced: Sequence[int]) -> list[bool]:
    """Acceptance of each proposed token against the target's tokens: True while they match, then one False."""
    result = []
    for proposed, target_token in zip(proposal, produced):
        result.append(proposed == target_token)
        if proposed != target_token:
            break
    return result
