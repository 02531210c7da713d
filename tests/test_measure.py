"""The measurement toolkit the benchmarks share: the interleaved loop and the per-generation record."""

import json
from collections import Counter

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.measure import Generation, Trial, interleave, measure

METHODS = ["a", "b", "c"]
CATEGORIES = ["writing", "coding", "math", "qa"]


def fake(method: str, index: int, repeat: int) -> Generation:
    return Generation((index, repeat), "length", 1.0, 1.0, 0.1, 3, 2, 2, 1, 0.5)


def test_every_method_runs_once_per_prompt_and_repeat_starting_one_further_each_time():
    seen = []
    trials = interleave(METHODS, CATEGORIES, 2, fake, on_trial=seen.append)
    assert seen == trials and len(trials) == len(METHODS) * len(CATEGORIES) * 2
    runs = Counter((t.repeat, t.prompt, t.method) for t in trials)
    assert set(runs.values()) == {1} and len(runs) == len(trials)
    firsts = [t.method for t in trials if t.order == 0]  # prompt by prompt, repeat after repeat
    assert firsts == [METHODS[i % len(METHODS)] for i in range(2 * len(CATEGORIES))]
    assert all(t.category == CATEGORIES[t.prompt] and t.generation.token_ids == (t.prompt, t.repeat) for t in trials)
    assert [t.order for t in trials[:3]] == [0, 1, 2]


def test_a_trial_survives_its_json_record():
    trial = interleave(METHODS, CATEGORIES, 1, fake)[5]
    record = json.loads(json.dumps(trial.to_dict()))
    assert Trial.from_dict(record) == trial
    assert record["tokens_per_second"] == 2.0 and record["mean_accepted_length"] == 1.5


def test_a_measured_generation_records_what_the_engine_did(tiny_models):
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="ngram", k=3))
    prompt_ids = engine.encode("Once upon a time", chat=False)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    result = engine.generate(prompt_ids, params)
    generation = measure(engine, prompt_ids, params)
    stats = result.stats
    assert generation.token_ids == tuple(result.token_ids) and generation.finish_reason == result.finish_reason
    assert (generation.steps, generation.draft_tokens, generation.accepted_tokens) == (
        stats.steps,
        stats.draft_tokens,
        stats.accepted_tokens,
    )
    assert generation.k_per_step == tuple(stats.k_per_step) and generation.drafter_steps == stats.drafter_steps
    assert generation.mean_accepted_length == stats.mean_accepted_length
    assert generation.wall_seconds >= generation.time_to_first_token > 0 and generation.cpu_seconds > 0
    alone = measure(engine, prompt_ids, params, engine.spec_with(drafter="none"))
    assert alone.token_ids == generation.token_ids and alone.draft_tokens == 0
