"""Tier 4: end-to-end exactness of the loop on tiny random-weight Llama and Gemma 3 models."""

from dataclasses import replace

import pytest

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.engine import Engine, Finished, TextDelta
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel, load_model_dir

PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):", "café 東京"]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


def engine_with(target: LoadedModel, drafter_dir=None, drafter_name: str = "ngram", k: int = 4) -> Engine:
    """An engine whose drafter `drafter_name` is either built-in or a draft model loaded from a dir."""
    engine = Engine(target, SpecConfig(drafter=drafter_name, k=k))
    if drafter_dir is not None:
        draft = load_model_dir(drafter_dir, runtime="hf")
        engine._drafters[drafter_name] = DraftModelDrafter(draft.runner, target.info.vocab_size, drafter_name)
    return engine


def baseline(target: LoadedModel, prompt, params: SamplingParams) -> Finished:
    return Engine(target, SpecConfig(drafter="none")).generate(prompt, params)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter", ["ngram", "self", "other"])
def test_greedy_output_identical_to_target_alone(tiny_models, tiny_dirs, arch, k, drafter):
    target = tiny_models[arch]
    draft_dir = {"ngram": None, "self": tiny_dirs[arch], "other": tiny_dirs["llama-other"]}[drafter]
    engine = engine_with(target, draft_dir, drafter_name=drafter if drafter == "ngram" else f"draft-{drafter}", k=k)
    for prompt in PROMPTS:
        expected = baseline(target, prompt, GREEDY)
        result = engine.generate(prompt, GREEDY)
        assert result.token_ids == expected.token_ids, prompt
        assert result.text == expected.text


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_draft_equal_to_target_accepts_everything(tiny_models, tiny_dirs, arch, k):
    engine = engine_with(tiny_models[arch], tiny_dirs[arch], drafter_name="self", k=k)
    steps = 5
    result = engine.generate("Once upon a time", SamplingParams(max_new_tokens=1 + steps * (k + 1), ignore_eos=True))
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.mean_accepted_length == k + 1
    assert result.stats.steps == steps
    assert result.stats.accepted_length_histogram[k] == steps
    assert result.stats.acceptance_by_position == [1.0] * k


def test_unrelated_draft_accepts_almost_nothing(tiny_models, tiny_dirs):
    engine = engine_with(tiny_models["llama"], tiny_dirs["llama-other"], drafter_name="other", k=4)
    result = engine.generate("The quick brown fox", SamplingParams(max_new_tokens=60, ignore_eos=True))
    assert result.stats.draft_tokens > 40
    assert result.stats.acceptance_rate < 0.25
    assert result.stats.mean_accepted_length < 1.5


def test_baseline_stats_are_plain_decoding(tiny_models):
    result = baseline(tiny_models["llama"], "Once upon a time", GREEDY)
    assert result.stats.draft_tokens == 0
    assert result.stats.mean_accepted_length == 1.0
    assert result.stats.target_forwards == result.stats.generated_tokens == 40
    assert result.finish_reason == "length"


def with_eos(target: LoadedModel, eos_token: int) -> LoadedModel:
    """The same model and cache, but with `eos_token` as its end-of-sequence token."""
    target.runner.info = replace(target.runner.info, eos_token_ids=frozenset({eos_token}))
    return target


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_eos_inside_an_accepted_draft_ends_exactly_where_target_alone_ends(tiny_dirs, arch):
    target = load_model_dir(tiny_dirs[arch], runtime="hf")
    free_run = baseline(target, "Once upon a time", GREEDY).token_ids
    position = 10 + free_run[10:].index(free_run[10])  # first occurrence at or after 10 of that token
    target = with_eos(target, free_run[position])
    first_eos = free_run.index(free_run[position])
    expected = baseline(target, "Once upon a time", SamplingParams(max_new_tokens=40))
    assert expected.token_ids == free_run[:first_eos] and expected.finish_reason == "stop"
    for k in (2, 4, 8):
        result = engine_with(target, tiny_dirs[arch], drafter_name="self", k=k).generate(
            "Once upon a time", SamplingParams(max_new_tokens=40)
        )
        assert result.token_ids == expected.token_ids
        assert result.finish_reason == "stop"


@pytest.mark.parametrize("k", [1, 4, 8])
def test_stop_string_inside_a_draft(tiny_models, tiny_dirs, k):
    target = tiny_models["llama"]
    full_text = baseline(target, "The quick brown fox", GREEDY).text
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    cut = full_text.index(stop)
    params = replace(GREEDY, stop=(stop, "never-appears"))
    engine = engine_with(target, tiny_dirs["llama"], drafter_name="self", k=k)
    events = list(engine.stream("The quick brown fox", params))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.finish_reason == "stop"
    assert finished.text == full_text[:cut]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == finished.text
    assert finished.text == baseline(target, "The quick brown fox", params).text


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5, 6, 9, 10])
def test_max_new_tokens_boundaries(tiny_models, tiny_dirs, max_new_tokens):
    target = tiny_models["gemma3"]
    full = baseline(target, "Once upon a time", GREEDY).token_ids
    engine = engine_with(target, tiny_dirs["gemma3"], drafter_name="self", k=4)
    result = engine.generate("Once upon a time", SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    assert result.token_ids == full[:max_new_tokens]
    assert result.finish_reason == "length"
    assert result.stats.generated_tokens == max_new_tokens


def test_context_limit_stops_generation_and_rejects_long_prompts(tiny_dirs):
    target = load_model_dir(tiny_dirs["llama"], runtime="hf")
    target.runner.info = replace(target.runner.info, max_context=24)
    engine = engine_with(target, tiny_dirs["llama"], drafter_name="self", k=4)
    prompt_ids = engine.encode("The quick brown fox")
    result = engine.generate(prompt_ids, SamplingParams(max_new_tokens=100, ignore_eos=True))
    assert len(prompt_ids) + len(result.token_ids) == 24
    assert result.finish_reason == "length"
    with pytest.raises(UsageError, match="context is 24; shorten the prompt"):
        engine.generate(list(range(3, 27)))


@pytest.mark.parametrize("drafter", ["ngram", "self", "other"])
def test_seeded_sampling_is_reproducible(tiny_models, tiny_dirs, drafter):
    draft_dir = {"ngram": None, "self": tiny_dirs["llama"], "other": tiny_dirs["llama-other"]}[drafter]
    engine = engine_with(tiny_models["llama"], draft_dir, drafter_name=drafter, k=4)
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=1234, max_new_tokens=30, ignore_eos=True)
    first = engine.generate("Once upon a time", params)
    second = engine.generate("Once upon a time", params)
    other_seed = engine.generate("Once upon a time", replace(params, seed=99))
    assert first.token_ids == second.token_ids
    assert first.token_ids != other_seed.token_ids


def test_chat_prompt_uses_template(tiny_models):
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="ngram"))
    ids = engine.encode("hello", chat=True)
    assert engine.target.tokenizer.decode(ids) == "<|user|>hello<|end|><|assistant|>"


def test_empty_prompt_is_a_usage_error(tiny_models):
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="ngram"))
    with pytest.raises(UsageError, match="prompt is empty"):
        engine.generate("   ")


def source_runs(events) -> list[tuple[str, int]]:
    """The sources of a stream's tokens, run-length encoded: every delta's spans joined, runs of one source merged."""
    runs: list[tuple[str, int]] = []
    for span in (span for event in events if isinstance(event, TextDelta) for span in event.spans):
        if runs and runs[-1][0] == span.source:
            runs[-1] = (span.source, runs[-1][1] + span.tokens)
        else:
            runs.append((span.source, span.tokens))
    return runs


@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_token_streams_with_the_drafter_that_proposed_it(tiny_models, tiny_dirs, prompt):
    """A draft equal to the target is accepted whole, so the tokens come as: the target's first, then per step k
    drafted and one written by the target; each delta's spans cover its text exactly."""
    k, steps = 4, 5
    engine = engine_with(tiny_models["llama"], tiny_dirs["llama"], drafter_name="self", k=k)
    events = list(engine.stream(prompt, SamplingParams(max_new_tokens=1 + steps * (k + 1), ignore_eos=True)))
    assert all("".join(s.text for s in e.spans) == e.text for e in events if isinstance(e, TextDelta))
    assert source_runs(events) == [("target", 1), *[("self", k), ("target", 1)] * steps]


def test_span_counts_match_the_stats_when_drafts_are_rejected_and_text_is_held_back(tiny_models, tiny_dirs):
    target = tiny_models["llama"]
    full_text = baseline(target, "The quick brown fox", GREEDY).text
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    engine = engine_with(target, tiny_dirs["llama-other"], drafter_name="other", k=4)
    for params in (GREEDY, replace(GREEDY, stop=(stop,))):
        events = list(engine.stream("The quick brown fox", params))
        finished = events[-1]
        assert "".join(s.text for e in events if isinstance(e, TextDelta) for s in e.spans) == finished.text
        counts = dict.fromkeys(("target", "other"), 0)
        for source, tokens in source_runs(events):
            counts[source] += tokens
        assert sum(counts.values()) == len(finished.token_ids)
        if not params.stop:  # a stop string drops the tail of its step; without one every step's tokens count
            assert counts == {"target": finished.stats.steps + 1, "other": finished.stats.accepted_tokens}
