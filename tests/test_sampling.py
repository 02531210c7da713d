import pytest
import torch
from scipy.stats import chisquare

from quickdraft import sampling
from quickdraft.categorical import DRAW_BLOCK, draw, inverse_cdf_in_torch
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.errors import UsageError
from quickdraft.models.native.kernels import kernels

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0, 0.0]])  # [1, 6]


def test_greedy_warp_is_one_hot_argmax():
    probs = sampling.warp(LOGITS, SamplingParams())
    assert probs.tolist() == [[0, 0, 0, 0, 1, 0]]


def test_temperature_scales_logits():
    probs = sampling.warp(LOGITS, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(LOGITS / 0.5, dim=-1))


def test_top_k_keeps_the_k_most_likely_renormalised():
    probs = sampling.warp(LOGITS, SamplingParams(temperature=1.0, top_k=2))[0]
    expected = torch.zeros(6)
    expected[[4, 0]] = torch.softmax(torch.tensor([3.0, 2.0]), dim=0)
    assert torch.allclose(probs, expected)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.7, 0.9, 0.999])
def test_top_p_keeps_smallest_prefix_reaching_mass(top_p):
    full = torch.softmax(LOGITS[0], dim=-1)
    order = torch.argsort(full, descending=True)
    kept, mass = [], 0.0
    for token in order.tolist():  # brute force: add tokens until the mass reaches top_p
        kept.append(token)
        mass += float(full[token])
        if mass >= top_p:
            break
    expected = torch.zeros(6)
    expected[kept] = full[kept] / full[kept].sum()
    probs = sampling.warp(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))[0]
    assert torch.allclose(probs, expected, atol=1e-6)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=40),
        SamplingParams(temperature=0.9, top_p=0.8),
        SamplingParams(temperature=0.6, top_k=100, top_p=0.95),
    ],
)
def test_rows_warped_on_demand_equal_the_rows_warped_together_bit_for_bit(params):
    """What the rejection sampler reads (`WarpedRows`, one row at a time) must be what warping the whole
    verification block gives: a row that differed would shift acceptance at that position."""
    logits = torch.randn(5, 4096, generator=torch.Generator().manual_seed(3)) * 4  # [k + 1, vocab]
    together = sampling.warp(logits, params)
    rows = sampling.WarpedRows(logits, params)
    assert all(torch.equal(rows[i], together[i]) for i in range(5))


def test_seeded_generator_is_reproducible_and_leaves_global_rng_alone():
    probs = torch.softmax(torch.randn(4, 50), dim=-1)
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    first = draw(probs, sampling.make_generator(7))
    second = draw(probs, sampling.make_generator(7))
    assert torch.equal(first, second)
    assert torch.equal(torch.get_rng_state(), global_state)


# Rows drawn in one call, not normalised (a residual's mass is whatever is left), with zero-probability tokens
# inside and at the end of the vocabulary; the last row's mass spread over three blocks of the cumulative sums,
# with whole blocks of zeros between them.
ROWS = torch.zeros(3, 4 * DRAW_BLOCK)
ROWS[:2, :8] = torch.tensor([[0.2, 0.0, 0.6, 0.1, 0.5, 0.0, 0.3, 0.0], [0.0, 0.9, 0.05, 0.0, 0.0, 0.35, 0.0, 0.7]])
ROWS[2, [3, 5, DRAW_BLOCK - 1, 2 * DRAW_BLOCK, 3 * DRAW_BLOCK + 6]] = torch.tensor([0.3, 0.1, 0.4, 0.25, 0.45])
DRAWS = 20_000


def law_p_values(draw_rows) -> list[float]:
    """Each row's chi-square p-value of DRAWS draws of `draw_rows` (all rows at once each time) against the row's
    own normalised law; a token of zero probability drawn even once fails at once (p-value 0)."""
    generator = torch.Generator().manual_seed(11)
    counts = torch.zeros_like(ROWS)
    for _ in range(DRAWS // 100):
        drawn = torch.stack([draw_rows(ROWS, generator) for _ in range(100)])  # [100, rows]
        counts += torch.nn.functional.one_hot(drawn, ROWS.shape[1]).sum(0)
    p_values = []
    for row, count in zip(ROWS, counts):
        if count[row == 0].sum() > 0:
            p_values.append(0.0)
            continue
        kept = row > 0
        p_values.append(float(chisquare(count[kept], row[kept] / row.sum() * DRAWS).pvalue))
    return p_values


def uniforms(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(probs.shape[0], generator=generator, dtype=torch.float64)


@pytest.mark.parametrize(
    "draw_rows",
    [
        draw,
        lambda probs, generator: inverse_cdf_in_torch(probs, uniforms(probs, generator)),
        lambda probs, generator: kernels().draw(probs, uniforms(probs, generator), DRAW_BLOCK),
    ],
    ids=["draw", "in-torch", "kernel"],
)
def test_draws_follow_each_rows_law_and_never_a_zero_probability_token(draw_rows):
    assert min(law_p_values(draw_rows)) > 1e-3


def test_negative_control_a_draw_that_assumes_normalised_rows_fails_the_law_test():
    def assumes_sum_one(probs, generator):
        cumulative = probs.double().cumsum(-1)
        uniform = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64)
        return torch.searchsorted(cumulative, uniform, right=True).squeeze(-1)

    assert min(law_p_values(assumes_sum_one)) < 1e-6


def test_negative_control_a_draw_that_restarts_each_block_at_the_point_fails_the_law_test():
    """The kernel's own slip: the rest within the chosen block left at the point instead of the point less the
    blocks before it. Only a row whose mass spans blocks can show it."""

    def forgets_the_blocks_before(probs, generator):
        uniform = uniforms(probs, generator)
        drawn = inverse_cdf_in_torch(probs, uniform)
        block_start = drawn // DRAW_BLOCK * DRAW_BLOCK  # [n]
        total = probs.double().sum(-1)  # [n]
        within = probs.double().view(probs.shape[0], -1, DRAW_BLOCK).cumsum(-1)  # [n, blocks, DRAW_BLOCK]
        block_rows = within[torch.arange(probs.shape[0]), drawn // DRAW_BLOCK]  # [n, DRAW_BLOCK]
        again = torch.searchsorted(block_rows, (uniform * total)[:, None], right=True)[:, 0]  # [n]
        return block_start + again.clamp(max=DRAW_BLOCK - 1)

    assert min(law_p_values(forgets_the_blocks_before)) < 1e-6


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(top_k=-1), "top_k must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
        (dict(stop=("",)), "stop strings must be non-empty"),
    ],
)
def test_invalid_sampling_params_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        SamplingParams(**kwargs)


def test_negative_k_is_a_usage_error():
    with pytest.raises(UsageError, match="k must be >= 0"):
        SpecConfig(k=-1)
