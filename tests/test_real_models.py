"""Tier 5: speculative greedy output equals target-alone output on the built-in pretrained models.

On the default runtime (native, on the GGUF's own 4-bit blocks where the file stores a matrix in them and
int8 weights elsewhere, whose matrix kernels compute every row on their own),
a k-token verification row is bit-identical to a 1-token row, so equality is exact: no tolerance,
no tie forgiven. Checked with n-gram lookup at several k and under auto, the shipped corpus table, the
model's default drafters, and on gemma-3-270m past its 512-token sliding window (the case that once diverged).
"""

import pytest

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.models.loading import load_model
from quickdraft.models.registry import default_drafter
from tests.real_prompts import REAL_PROMPTS

pytestmark = pytest.mark.real_model

NEW_TOKENS = 64
SPECS = [SpecConfig(drafter="ngram", k=k) for k in (1, 4, 8)] + [SpecConfig(drafter="ngram", k="auto")]


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma-3-270m"])
def real_engine(request):
    return Engine(load_model(request.param), SpecConfig(drafter="ngram", k=4))


def test_speculation_is_identical_to_target_alone(real_engine):
    chat = real_engine.target.tokenizer.chat_template is not None
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    default = default_drafter(real_engine.target.info.name)
    specs = [*SPECS, SpecConfig(drafter="corpus", k=4), SpecConfig(drafter=default, k="auto")]
    drafted = {spec: 0 for spec in specs}
    for prompt in REAL_PROMPTS:
        prompt_ids = real_engine.encode(prompt, chat=chat)
        expected = real_engine.generate(prompt_ids, params, spec=real_engine.spec_with(drafter="none"))
        for spec in specs:
            result = real_engine.generate(prompt_ids, params, spec=spec)
            assert result.token_ids == expected.token_ids, (prompt, spec)
            drafted[spec] += result.stats.draft_tokens
    assert all(drafted.values()), f"the drafters must have proposed something at every setting: {drafted}"


def test_gemma_speculation_is_identical_past_its_sliding_window():
    engine = Engine(load_model("gemma-3-270m"), SpecConfig(drafter="ngram", k=8))
    prompt_ids = engine.encode(" ".join(REAL_PROMPTS * 3))  # base model: plain text
    assert 560 < len(prompt_ids) < 900  # every generated token attends across the 512-token window's edge
    params = SamplingParams(max_new_tokens=96, ignore_eos=True)
    expected = engine.generate(prompt_ids, params, spec=engine.spec_with(drafter="none"))
    for spec in (SpecConfig(drafter="ngram", k=8), SpecConfig(drafter="ngram", k="auto")):
        result = engine.generate(prompt_ids, params, spec=spec)
        assert result.token_ids == expected.token_ids, spec
        assert result.stats.accepted_tokens > 0, spec
