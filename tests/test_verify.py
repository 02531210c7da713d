"""Tiers 1-3 of exactness: verifier tables, the algebra of the rejection rule, Monte-Carlo."""

import pytest
import torch
from scipy.stats import chisquare

from quickdraft.verify import Verdict, greedy_verify, rejection_sample, residual_distribution

VOCAB = 6


# ---- tier 1: tables --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "draft, target_argmax, expected",
    [
        ([1, 2, 3], [1, 2, 3, 4], Verdict(3, (1, 2, 3, 4))),  # all accepted, bonus token 4
        ([1, 2, 3], [5, 2, 3, 4], Verdict(0, (5,))),  # first rejected, recovered token 5
        ([1, 2, 3], [1, 2, 0, 4], Verdict(2, (1, 2, 0))),  # last rejected
        ([], [3], Verdict(0, (3,))),  # nothing drafted: plain decoding
    ],
)
def test_greedy_verify_table(draft, target_argmax, expected):
    assert greedy_verify(draft, target_argmax) == expected


def one_hot_rows(token_ids: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token_ids), VOCAB).float()


@pytest.mark.parametrize("seed", range(5))
def test_rejection_sample_with_certain_target_matches_greedy_table(seed):
    generator = torch.Generator().manual_seed(seed)
    draft = torch.tensor([1, 2, 3])
    assert rejection_sample(draft, None, one_hot_rows([1, 2, 3, 4]), generator) == Verdict(3, (1, 2, 3, 4))
    assert rejection_sample(draft, None, one_hot_rows([1, 2, 0, 4]), generator) == Verdict(2, (1, 2, 0))
    assert rejection_sample(draft, one_hot_rows([1, 2, 3]), one_hot_rows([5, 2, 3, 4]), generator) == Verdict(0, (5,))


def test_rejection_never_recovers_the_rejected_point_mass_token():
    generator = torch.Generator().manual_seed(0)
    target = torch.tensor([[0.5, 0.5, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0]])
    for _ in range(200):
        verdict = rejection_sample(torch.tensor([0]), None, target, generator)
        assert verdict.tokens in ((0, 0), (1,))


class CountingRows:
    """Target rows that record which ones the sampler read."""

    def __init__(self, probs: torch.Tensor) -> None:
        self.probs, self.read = probs, []

    def __getitem__(self, row: int) -> torch.Tensor:
        self.read.append(row)
        return self.probs[row]


def test_the_sampler_reads_target_rows_in_order_and_none_past_the_first_rejection():
    """Rows are warped on demand, so reading one past the first rejection would warp a row for nothing; the
    verdict is the same as from the whole block."""
    target = one_hot_rows([1, 2, 0, 4, 5])  # position 2 rejects the draft for certain
    rows = CountingRows(target)
    draft = torch.tensor([1, 2, 3, 4])
    verdict = rejection_sample(draft, None, rows, torch.Generator().manual_seed(0))
    assert verdict == Verdict(2, (1, 2, 0)) == rejection_sample(draft, None, target, torch.Generator().manual_seed(0))
    assert rows.read == [0, 1, 2]


def test_a_rejection_at_the_second_position_draws_from_that_positions_residual():
    """Position 1 is accepted for certain, position 2 rejected for certain. That position's residual,
    max(0, target - draft) with target [a 0.5, b 0.5] and draft [a 0.5, d 0.5], is all on b; a residual taken
    from position 1's draft row (a point mass elsewhere) would give a half the time."""
    a, b, d1, d2 = 0, 1, 2, 3
    draft = torch.tensor([d1, d2])
    draft_probs = torch.zeros(2, VOCAB)
    draft_probs[0, d1] = 1.0
    draft_probs[1, a] = draft_probs[1, d2] = 0.5
    target = torch.zeros(3, VOCAB)
    target[0, d1] = 1.0
    target[1, a] = target[1, b] = 0.5
    target[2, a] = 1.0
    for seed in range(100):
        assert rejection_sample(draft, draft_probs, target, torch.Generator().manual_seed(seed)) == Verdict(1, (d1, b))


# ---- tier 2: exact algebra of the rule ---------------------------------------------------------


def output_distribution(draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """P(first output token = x) under the rule: accept draft x w.p. min(1, t/d), else residual."""
    accept = torch.where(
        draft_probs > 0, torch.clamp(target_probs / draft_probs, max=1.0), torch.zeros_like(draft_probs)
    )
    accepted_mass = draft_probs * accept  # [vocab]
    return accepted_mass + (1 - accepted_mass.sum()) * residual_distribution(target_probs, draft_probs)


def random_distribution(generator: torch.Generator, zeros: int = 0) -> torch.Tensor:
    probs = torch.rand(VOCAB, generator=generator, dtype=torch.float64)
    probs[torch.randperm(VOCAB, generator=generator)[:zeros]] = 0
    return probs / probs.sum()


@pytest.mark.parametrize("seed", range(20))
def test_rule_reproduces_target_exactly_for_random_pairs(seed):
    generator = torch.Generator().manual_seed(seed)
    target = random_distribution(generator, zeros=seed % 3)
    draft = random_distribution(generator, zeros=(seed // 3) % 3)
    assert torch.allclose(output_distribution(draft, target), target, atol=1e-12)


def test_rule_edge_cases():
    target = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0], dtype=torch.float64)
    same = target.clone()
    disjoint = torch.tensor([0, 0, 0, 0, 0.5, 0.5], dtype=torch.float64)
    one_hot = torch.tensor([0, 0, 1.0, 0, 0, 0], dtype=torch.float64)
    for draft in (same, disjoint, one_hot):
        assert torch.allclose(output_distribution(draft, target), target, atol=1e-12)
    assert torch.equal(residual_distribution(target, same), target)  # no residual mass: fall back to target
    assert torch.allclose(residual_distribution(target, disjoint), target)


# ---- tier 3: Monte-Carlo at every draft position, with a negative control ----------------------

K = 3
TRIALS = 12000
MIN_SAMPLES = 200  # tokens at a position for its chi-square test; fewer is an error, never a skip


def draw_outputs(sampler, target_probs, draft_probs, point_mass: bool, seed: int) -> list[list[int]]:
    """Token emitted at each output position, over many independent verification steps."""
    generator = torch.Generator().manual_seed(seed)
    by_position: list[list[int]] = [[] for _ in range(K + 1)]
    for _ in range(TRIALS):
        draft_ids = torch.multinomial(draft_probs, 1, generator=generator).squeeze(1)  # [K]
        verdict = sampler(draft_ids, None if point_mass else draft_probs, target_probs, generator)
        for position, token in enumerate(verdict.tokens):
            by_position[position].append(token)
    return by_position


def positions_failing_chi_square(by_position, target_probs, alpha=1e-4) -> list[int]:
    """Draft positions whose emitted tokens do not follow the target distribution there."""
    failing = []
    for position, tokens in enumerate(by_position):
        assert len(tokens) >= MIN_SAMPLES, f"position {position} got {len(tokens)} samples: it would go untested"
        expected = target_probs[position].double()
        support = expected > 0
        counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
        if (counts[~support] > 0).any():
            failing.append(position)
            continue
        observed, expected = counts[support], expected[support] / expected[support].sum() * len(tokens)
        if chisquare(observed.numpy(), expected.numpy()).pvalue < alpha:
            failing.append(position)
    return failing


def distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    target = torch.stack([random_distribution(generator, zeros=1).float() for _ in range(K + 1)])  # [K+1, vocab]
    draft = torch.stack([random_distribution(generator).float() for _ in range(K)])  # [K, vocab]
    draft = 0.5 * draft + 0.5 * target[:K]  # overlapping, so later positions are reached often
    return target, draft


def always_accept(draft_ids, draft_probs, target_probs, generator) -> Verdict:
    """A deliberately wrong sampler: keeps every draft token, then draws the bonus token."""
    bonus = int(torch.multinomial(target_probs[len(draft_ids)], 1, generator=generator))
    return Verdict(len(draft_ids), tuple(draft_ids.tolist()) + (bonus,))


def accept_by_draft_ratio(draft_ids, draft_probs, target_probs, generator) -> Verdict:
    """A subtly wrong sampler: the right acceptance test but recovers from the target, not the residual."""
    rows = torch.arange(len(draft_ids))
    accepted = (
        torch.rand(len(draft_ids), generator=generator) * draft_probs[rows, draft_ids] < target_probs[rows, draft_ids]
    )
    n = int(accepted.long().cumprod(0).sum())
    last = int(torch.multinomial(target_probs[n], 1, generator=generator))
    return Verdict(n, tuple(draft_ids[:n].tolist()) + (last,))


@pytest.mark.parametrize("seed", [0, 1])
def test_rejection_sampler_follows_target_at_every_position(seed):
    target, draft = distributions(seed)
    by_position = draw_outputs(rejection_sample, target, draft, point_mass=False, seed=seed)
    assert all(len(tokens) >= 200 for tokens in by_position), "every position must be tested"
    assert positions_failing_chi_square(by_position, target) == []


def test_point_mass_drafts_follow_target():
    """Drafts drawn from the target itself but handed over as point masses: each position is accepted with
    probability sum(p^2), often enough that the bonus position gets its own test."""
    target, _ = distributions(3)
    by_position = draw_outputs(rejection_sample, target, target[:K], point_mass=True, seed=3)
    assert positions_failing_chi_square(by_position, target) == []


def bonus_from_the_last_draft_row(draft_ids, draft_probs, target_probs, generator) -> Verdict:
    """Wrong only at the bonus position: when every draft is accepted, the bonus comes from the last draft
    position's target row instead of the row after it."""
    verdict = rejection_sample(draft_ids, draft_probs, target_probs, generator)
    if verdict.num_accepted < len(draft_ids):
        return verdict
    bonus = int(torch.multinomial(target_probs[len(draft_ids) - 1], 1, generator=generator))
    return Verdict(verdict.num_accepted, verdict.tokens[:-1] + (bonus,))


def target_instead_of_the_last_residual(draft_ids, draft_probs, target_probs, generator) -> Verdict:
    """Wrong only at the last draft position: a rejection there recovers from the target, not the residual."""
    verdict = rejection_sample(draft_ids, draft_probs, target_probs, generator)
    if verdict.num_accepted != len(draft_ids) - 1:
        return verdict
    last = int(torch.multinomial(target_probs[len(draft_ids) - 1], 1, generator=generator))
    return Verdict(verdict.num_accepted, verdict.tokens[:-1] + (last,))


@pytest.mark.parametrize("wrong_sampler", [always_accept, accept_by_draft_ratio])
def test_negative_control_wrong_samplers_fail(wrong_sampler):
    target, draft = distributions(0)
    by_position = draw_outputs(wrong_sampler, target, draft, point_mass=False, seed=0)
    assert positions_failing_chi_square(by_position, target) != []


@pytest.mark.parametrize(
    "wrong_sampler, wrong_position", [(bonus_from_the_last_draft_row, K), (target_instead_of_the_last_residual, K - 1)]
)
def test_controls_wrong_only_at_a_late_position_fail_exactly_there(wrong_sampler, wrong_position):
    target, draft = distributions(0)
    by_position = draw_outputs(wrong_sampler, target, draft, point_mass=False, seed=0)
    assert positions_failing_chi_square(by_position, target) == [wrong_position]
