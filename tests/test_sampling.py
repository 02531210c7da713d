import pytest
import torch

from quickdraft import sampling
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.errors import UsageError

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


def test_seeded_generator_is_reproducible_and_leaves_global_rng_alone():
    probs = torch.softmax(torch.randn(4, 50), dim=-1)
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    first = sampling.sample(probs, sampling.make_generator(7))
    second = sampling.sample(probs, sampling.make_generator(7))
    assert torch.equal(first, second)
    assert torch.equal(torch.get_rng_state(), global_state)


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
