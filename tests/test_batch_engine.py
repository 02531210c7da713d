"""The engine running many requests at once gives each one exactly its solo output.

Tiny random Llama and Gemma 3 targets on the native runtime (every dtype); requests of different prompt
lengths and budgets, more of them than slots (so some wait), prompts prefilled in small chunks between
other requests' decoding steps, fixed and adaptive drafting, greedy and sampled with seeds. Cancelling a
request mid-run leaves the others' outputs unchanged, and a request whose drafter raises fails alone.
"""

from dataclasses import replace

import pytest
from scipy.stats import chisquare

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.controller import ALONE, AdaptiveController, BatchLoad, DraftOption, choose, step_price
from quickdraft.costs import TargetCost
from quickdraft.drafters.ngram import NgramDrafter
from quickdraft.engine import Engine, Failed, Finished, TextDelta
from quickdraft.errors import UsageError
from quickdraft.models.loading import load_model_dir
from tests.test_exactness import SAMPLED, SAMPLING_PROMPT, target_joint_law

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a kingdom by the sea, and in it lived",
    "def add(a, b):",
    "café 東京",
    "a b c a b c a b c a b",
    "Tell me about the weather in the mountains in early spring",
]
BUDGETS = [12, 30, 7, 25, 40, 18]


def native_target(tiny_dirs, arch: str, dtype: str):
    return load_model_dir(tiny_dirs[arch], runtime="native", dtype=dtype, name=arch)


def solo_outputs(target, spec: SpecConfig, params: list[SamplingParams]) -> list[tuple[int, ...]]:
    engine = Engine(target, spec)
    return [engine.generate(prompt, p, spec=spec).token_ids for prompt, p in zip(PROMPTS, params)]


def batched_outputs(engine: Engine, params: list[SamplingParams]) -> list[tuple[int, ...]]:
    finished = {}
    for index, event in engine.stream_many(PROMPTS, params):
        assert not isinstance(event, Failed), event
        if isinstance(event, Finished):
            finished[index] = event.token_ids
    return [finished[i] for i in range(len(PROMPTS))]


def greedy_params() -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in BUDGETS]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("spec", [SpecConfig("none", k=0), SpecConfig("ngram", k=3), SpecConfig("ngram", k="auto")])
def test_each_request_of_a_batch_gets_its_solo_greedy_output(tiny_dirs, arch, dtype, spec):
    target = native_target(tiny_dirs, arch, dtype)
    expected = solo_outputs(target, spec, greedy_params())
    engine = Engine(target, spec, max_batch=4, step_tokens=8)  # 6 requests, 4 slots; prompts fed 8 tokens a step
    assert batched_outputs(engine, greedy_params()) == expected


def test_sampled_requests_with_seeds_get_their_solo_outputs(tiny_dirs):
    target = native_target(tiny_dirs, "llama", "int8")
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=seed, max_new_tokens=n) for seed, n in enumerate(BUDGETS)
    ]
    spec = SpecConfig("ngram", k=2)
    expected = solo_outputs(target, spec, params)
    assert batched_outputs(Engine(target, spec, max_batch=3, step_tokens=5), params) == expected


def test_sampled_outputs_of_a_batch_follow_the_target_law(tiny_dirs):
    """The joint law of the first 4 tokens, 2000 seeded requests run 16 at a time (see test_exactness)."""
    target = native_target(tiny_dirs, "llama", "float32")
    engine = Engine(target, SpecConfig("ngram", k=2), max_batch=16)
    prompt_ids = engine.encode(SAMPLING_PROMPT)
    law = target_joint_law(tiny_dirs["llama"], tuple(prompt_ids), SAMPLED)
    counts = dict.fromkeys(law, 0)
    params = [replace(SAMPLED, seed=seed) for seed in range(2000)]
    for _, event in engine.stream_many([prompt_ids] * len(params), params):
        if isinstance(event, Finished):
            counts[event.token_ids] += 1
    cells = sorted(law)
    expected = [law[c] / sum(law.values()) * len(params) for c in cells]
    assert chisquare([counts[c] for c in cells], expected).pvalue > 1e-3


def test_cancelling_a_request_mid_run_leaves_the_others_unchanged(tiny_dirs):
    target = native_target(tiny_dirs, "llama", "int8")
    spec = SpecConfig("ngram", k=3)
    expected = solo_outputs(target, spec, greedy_params())
    engine = Engine(target, spec, max_batch=6)
    ids = [engine.submit(prompt, p) for prompt, p in zip(PROMPTS, greedy_params())]
    finished, steps = {}, 0
    while engine.busy:
        for request_id, event in engine.step():
            if isinstance(event, Finished):
                finished[request_id] = event.token_ids
        steps += 1
        if steps == 3:
            engine.cancel(ids[1])
    assert ids[1] not in finished
    assert [finished[i] for i in ids if i != ids[1]] == [e for i, e in zip(ids, expected) if i != ids[1]]
    assert engine.request_counts == (0, 0)


class FailingDrafter(NgramDrafter):
    """Raises on its third proposal (a bug in one request's drafter)."""

    def begin(self, prompt_ids, params, generator):
        self.calls = 0

    def propose(self, context_ids, k):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("drafter broke")
        return super().propose(context_ids, k)


def test_a_request_whose_drafter_raises_fails_alone(tiny_dirs):
    target = native_target(tiny_dirs, "llama", "int8")
    engine = Engine(target, SpecConfig("ngram", k=3), max_batch=4)
    engine.add_drafter("failing", FailingDrafter(name="failing"))
    expected = Engine(target, SpecConfig("ngram", k=3)).generate(PROMPTS[0], greedy_params()[0]).token_ids
    good = engine.submit(PROMPTS[0], greedy_params()[0])
    bad = engine.submit(PROMPTS[1], greedy_params()[1], spec=SpecConfig("failing", k=3))
    last = {}
    while engine.busy:
        for request_id, event in engine.step():
            last[request_id] = event
    assert isinstance(last[bad], Failed) and "drafter broke" in str(last[bad].error)
    assert isinstance(last[good], Finished) and last[good].token_ids == expected
    with pytest.raises(RuntimeError, match="drafter broke"):  # one request alone: stream raises the error
        engine.generate(PROMPTS[1], greedy_params()[1], spec=SpecConfig("failing", k=3))


def test_events_stream_in_order_and_the_engine_refuses_stream_while_busy(tiny_dirs):
    target = native_target(tiny_dirs, "gemma3", "int8")
    engine = Engine(target, SpecConfig("ngram", k=2), max_batch=2)
    seen: dict[int, list] = {}
    for index, event in engine.stream_many(PROMPTS[:3], greedy_params()[:3]):
        seen.setdefault(index, []).append(event)
    for events in seen.values():
        assert all(isinstance(e, TextDelta) for e in events[:-1]) and isinstance(events[-1], Finished)
        assert "".join(e.text for e in events[:-1]) == events[-1].text
    engine.submit(PROMPTS[0])
    with pytest.raises(UsageError, match="running other requests"):
        engine.generate(PROMPTS[1])


def first_tokens_by_step(engine: Engine, arrivals: dict[int, list[list[int]]], steps: int) -> dict[int, int]:
    """Run `steps` engine steps, submitting `arrivals[step]`'s prompts (token ids, one new token each) before
    that step; {request id: the step that gave its first token}."""
    finished = {}
    for step in range(steps):
        for prompt in arrivals.get(step, []):
            engine.submit(prompt, SamplingParams(max_new_tokens=1, ignore_eos=True))
        for request_id, event in engine.step():
            assert not isinstance(event, Failed), event
            if isinstance(event, Finished):
                finished[request_id] = step
    return finished


def test_a_short_prompt_gets_its_first_token_before_a_long_prompt_ahead_of_it(tiny_dirs):
    """Prefill runs shortest remaining prompt first: a 20-token prompt arriving while a 640-token one is being
    prefilled (128 tokens a step) is answered at once, not after the long prompt's 5 steps."""
    target = native_target(tiny_dirs, "llama-long", "float32")
    engine = Engine(target, SpecConfig("none", k=0), max_batch=4, step_tokens=128)
    long_prompt, short_prompt = [i % 300 + 5 for i in range(640)], list(range(7, 27))
    first = first_tokens_by_step(engine, {0: [long_prompt], 1: [short_prompt]}, steps=6)
    assert first == {1: 1, 0: 4}  # the short one's step; the long one's 640 tokens in 5 steps (steps 0-4)


def test_a_stream_of_shorter_prompts_cannot_hold_a_long_prompt_back_until_it_ends(tiny_dirs):
    """A new 128-token prompt in each of 10 steps would take the whole budget from a 640-token one under pure
    shortest-first (its first token at step 14); a request's rank improves every step it waits, so the long one
    gets its turn while the stream goes on."""
    target = native_target(tiny_dirs, "llama-long", "float32")
    engine = Engine(target, SpecConfig("none", k=0), max_batch=64, step_tokens=128)
    long_prompt = [i % 300 + 5 for i in range(640)]
    shorts = {step: [[(7 * step + i) % 300 + 5 for i in range(128)]] for step in range(10)}
    first = first_tokens_by_step(engine, {**shorts, 0: [long_prompt, *shorts[0]]}, steps=20)
    assert len(first) == 11 and first[0] <= 10, first
    assert first[1] == 0  # the first short one before the long one


def test_a_transformers_target_runs_one_request_at_a_time(tiny_models):
    engine = Engine(tiny_models["llama"], SpecConfig("ngram", k=3), max_batch=8)
    assert engine.max_batch == 1
    solo = [engine.generate(p, q).token_ids for p, q in zip(PROMPTS, greedy_params())]
    assert batched_outputs(engine, greedy_params()) == solo


# --- speculation that knows the load ---


COMPUTE_BOUND = TargetCost(  # t(n), and 1 ms for each further sequence
    [0.010 + 0.0001 * n if n <= 4 else 0.010 + 0.0025 * (n - 4) for n in range(1, 257)], per_sequence=0.001
)


def test_a_draft_pays_alone_and_backs_off_in_a_full_batch():
    """Each fed row costs as much as another (a compute-bound batch): alone, verifying 3 more rows is nearly
    free; in a batch of 8 the same rows cost 3/8 more of the step, more than the draft is expected to add."""
    option = DraftOption("ngram", (0.6, 0.5, 0.4), 0.0)
    alone, _ = step_price(COMPUTE_BOUND, ALONE, 3)
    assert alone == pytest.approx([COMPUTE_BOUND.seconds(n) for n in range(1, 5)])
    assert choose([option], alone).k == 3
    loaded, tokens = step_price(COMPUTE_BOUND, BatchLoad(rows=7, sequences=7, tokens=7.0), 3)
    assert choose([option], loaded, tokens).k == 0
    lighter, tokens = step_price(COMPUTE_BOUND, BatchLoad(rows=1, sequences=1, tokens=1.0), 3)
    assert choose([option], lighter, tokens).k >= 2  # the load falls to two requests: drafting comes back


def test_a_prompt_chunk_in_the_step_does_not_make_a_draft_look_cheap():
    """Seven requests decode and a 120-token prompt chunk shares their step. Priced against that step's own rate
    (8 tokens over 130 rows), any draft would look worth its rows; priced against the step in which the
    prefilling request decodes too (8 rows, 8 tokens), the draft is as unwelcome as in a full batch."""
    option = DraftOption("ngram", (0.6, 0.5, 0.4), 0.0)
    chunk = BatchLoad(rows=6 + 120, sequences=7, tokens=6.0, prompt_rows=120, prompt_sequences=1, prefilling=1)
    seconds, tokens = step_price(COMPUTE_BOUND, chunk, 3)
    assert tokens == 7.0
    assert seconds[0] == pytest.approx(COMPUTE_BOUND.seconds(8, 8))  # the step as if every request decoded
    assert seconds[3] - seconds[0] == pytest.approx(COMPUTE_BOUND.seconds(130, 8) - COMPUTE_BOUND.seconds(127, 8))
    assert choose([option], seconds, tokens).k == 0
    own_rate = [COMPUTE_BOUND.seconds(chunk.rows + n, chunk.sequences + 1) for n in range(1, 5)]
    assert choose([option], own_rate, chunk.tokens).k == 3  # what the step's own rate would have chosen
    waiting = replace(chunk, rows=6, sequences=6, prompt_rows=0, prompt_sequences=0, prefilling=2)
    seconds, tokens = step_price(COMPUTE_BOUND, waiting, 3)  # two prompts wait for the budget: they count too
    assert (seconds[0], tokens) == (pytest.approx(COMPUTE_BOUND.seconds(9, 9)), 8.0)


def test_each_plan_sees_the_prompts_of_its_step_and_those_waiting_for_the_budget(tiny_dirs, monkeypatch):
    """A 20-token prompt and two 300-token ones arrive together. The short one decodes from step 1, where one
    long prompt reads a 128-token chunk and the other waits for the budget: its plan sees the chunk's rows and
    both prefilling requests."""
    loads = []
    plan = AdaptiveController.plan

    def recording(self, context, limit, load=ALONE):
        loads.append(load)
        return plan(self, context, limit, load)

    monkeypatch.setattr(AdaptiveController, "plan", recording)
    engine = Engine(
        native_target(tiny_dirs, "llama-long", "float32"), SpecConfig("ngram"), max_batch=4, step_tokens=128
    )
    for prompt in (
        [i % 50 + 5 for i in range(20)],
        [i % 300 + 5 for i in range(300)],
        [i % 200 + 7 for i in range(300)],
    ):
        engine.submit(prompt, SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()
    assert loads == []  # every request reads its prompt
    engine.step()
    assert loads == [BatchLoad(rows=128, sequences=1, tokens=0.0, prompt_rows=128, prompt_sequences=1, prefilling=2)]


def test_a_batch_engine_calibrates_its_batch_sizes_but_refines_only_those_timed_one_by_one(tiny_dirs):
    engine = Engine(native_target(tiny_dirs, "llama-long", "float32"), SpecConfig("ngram", k_max=4), max_batch=4)
    target = engine.calibrate().target
    assert (target.max_tokens, target.refined_sizes) == (20, 5)  # t(1..20) timed or interpolated, 1..5 refined
