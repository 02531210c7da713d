"""Tier 5: speculative greedy output equals target-alone output on the built-in pretrained models.

Where a token differs, the test accepts it only if the target's own top-2 logits at that position
were within floating-point noise of each other (a numerical tie that batched evaluation may flip);
anything else is an exactness bug.
"""

import pytest
import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.models.loading import load_model
from tests.real_prompts import REAL_PROMPTS

pytestmark = pytest.mark.real_model

TIE_TOLERANCE = 1e-3  # logit gap below which fp32 batched-vs-sequential rounding can flip the argmax
NEW_TOKENS = 64


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma-3-270m"])
def real_engine(request):
    return Engine(load_model(request.param), SpecConfig(drafter="ngram", k=4))


def top2_gap(engine: Engine, token_ids: list[int]) -> float:
    """Gap between the target's two largest logits for the token after `token_ids`."""
    logits = engine.target.runner.prefill(token_ids)  # [vocab]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def assert_identical_or_tied(engine: Engine, prompt_ids: list[int], expected: tuple, got: tuple) -> None:
    if got == expected:
        return
    position = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    gap = top2_gap(engine, prompt_ids + list(expected[:position]))
    assert gap < TIE_TOLERANCE, f"outputs differ at token {position} where the target's top-2 gap is {gap:.2e}: a bug"


def test_ngram_speculation_is_identical_to_target_alone(real_engine):
    chat = real_engine.target.tokenizer.chat_template is not None
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    drafted = 0
    for prompt in REAL_PROMPTS:
        prompt_ids = real_engine.encode(prompt, chat=chat)
        expected = real_engine.generate(prompt_ids, params, spec=real_engine.spec_with(drafter="none"))
        result = real_engine.generate(prompt_ids, params)
        assert_identical_or_tied(real_engine, prompt_ids, expected.token_ids, result.token_ids)
        drafted += result.stats.draft_tokens
    assert drafted > 0, "the ngram drafter must have proposed something on these prompts"
