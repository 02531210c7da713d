"""The adaptive controller: decision rule on synthetic numbers, estimators, simulated requests, and
end-to-end exactness and behaviour with k="auto" on tiny models."""

from dataclasses import replace

import pytest

from quickdraft.acceptance import AcceptanceEstimate, outcomes
from quickdraft.commands.arguments import parse_k
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.controller import AdaptiveController, ControllerMemory, DraftOption, choose
from quickdraft.costs import DraftCost, TargetCost, expected_tokens
from quickdraft.drafters.base import Draft, Drafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.ngram import NgramDrafter
from quickdraft.engine import Engine, Finished, TextDelta
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel, load_model_dir
from quickdraft.verify import Verdict

K_MAX = 8
LINEAR_TARGET = [1.0 + 0.05 * (n - 1) for n in range(1, K_MAX + 2)]  # t(1..9): each extra token costs 5% of t(1)
PLAIN_RATE = 1.0 / LINEAR_TARGET[0]  # tokens per second of plain decoding


def option(name: str, acceptance: float, seconds_per_token: float = 0.0, length: int = K_MAX) -> DraftOption:
    return DraftOption(name, (acceptance,) * length, seconds_per_token)


# --- decision rule on synthetic numbers ---


def test_expected_tokens_matches_closed_form():
    for a in (0.0, 0.3, 0.8, 0.99):
        for k in range(K_MAX + 1):
            assert expected_tokens((a,) * K_MAX, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    assert expected_tokens((1.0, 0.5, 0.0), 3) == 1 + 1 + 0.5 + 0


def test_picks_plain_decoding_when_drafting_cannot_pay():
    assert choose([option("model", 0.2, seconds_per_token=0.3)], LINEAR_TARGET).k == 0
    assert choose([option("ngram", 0.04)], LINEAR_TARGET).k == 0  # free drafting, but verifying costs 5%
    assert choose([], LINEAR_TARGET).drafter is None


def test_picks_a_large_k_when_acceptance_is_near_one_and_drafting_is_cheap():
    assert (
        choose([option("ngram", 0.98)], LINEAR_TARGET).drafter,
        choose([option("ngram", 0.98)], LINEAR_TARGET).k,
    ) == ("ngram", K_MAX)
    assert choose([option("model", 0.95, seconds_per_token=0.02)], LINEAR_TARGET).k >= 6


def test_k_grows_with_acceptance_and_shrinks_with_draft_cost():
    ks = [choose([option("m", a, 0.1)], LINEAR_TARGET).k for a in (0.1, 0.4, 0.7, 0.9, 0.97)]
    assert ks == sorted(ks) and ks[0] == 0 and ks[-1] >= 5
    ks = [choose([option("m", 0.8, c)], LINEAR_TARGET).k for c in (0.0, 0.1, 0.3, 1.0)]
    assert ks == sorted(ks, reverse=True) and ks[-1] == 0


def test_switches_drafters_when_their_acceptance_crosses():
    fixed = option("model", 0.6, seconds_per_token=0.1)
    picked = [
        choose([fixed, option("other", a, seconds_per_token=0.1)], LINEAR_TARGET).drafter for a in (0.3, 0.5, 0.7, 0.9)
    ]
    assert picked == ["model", "model", "other", "other"]


def test_a_lookup_is_cut_to_its_proposal_and_a_free_short_match_can_beat_a_good_model():
    short_match = option("ngram", 0.9, length=2)
    choice = choose([short_match, option("model", 0.9, seconds_per_token=0.3)], LINEAR_TARGET)
    assert (choice.drafter, choice.k) == ("ngram", 2)


def test_the_choice_maximises_tokens_per_second_and_uses_cheap_sizes():
    for a in (0.2, 0.5, 0.8, 0.95):
        for cost in (0.0, 0.05, 0.2):
            candidate = option("m", a, cost)
            rates = [expected_tokens(candidate.acceptance, k) / (k * cost + LINEAR_TARGET[k]) for k in range(K_MAX + 1)]
            assert rates[choose([candidate], LINEAR_TARGET).k] == pytest.approx(max(rates))
    bumpy = [1.0, 1.6, 2.0, 1.55, 1.75]  # measured on a CPU: 4 tokens cheaper than 3
    assert choose([option("ngram", 0.7)], bumpy).k == 3


# --- estimators ---


def test_acceptance_estimate_starts_at_the_prior_and_unseen_positions_follow_the_one_before():
    estimate = AcceptanceEstimate(4)
    assert estimate.means() == [0.5] * 4
    for _ in range(10):
        estimate.observe([False])
    means = estimate.means()
    assert means[0] < 0.15 and means[1:] == pytest.approx([means[0]] * 3, rel=0.5)
    assert AcceptanceEstimate(3, prior_means=(0.9, 0.8)).means() == pytest.approx([0.9, 0.8, 0.8])


def test_acceptance_estimate_follows_a_change_within_a_few_observations():
    estimate = AcceptanceEstimate(2)
    for _ in range(30):
        estimate.observe([False])
    for _ in range(15):
        estimate.observe([True, True])
    assert estimate.means()[0] > 0.7 and estimate.means()[1] > 0.7


def test_ngram_proposals_name_the_matched_suffix_length_and_keep_it_when_cut():
    drafter = NgramDrafter(min_n=1, max_n=3)
    assert drafter.propose([1, 2, 3, 4, 9, 9, 1, 2, 3], 3).source == "3-gram"
    assert drafter.propose([1, 2, 3, 4, 5, 7, 2, 3], 2).truncated(1) == Draft((4,), source="2-gram")


def test_outcomes_compare_a_proposal_with_the_target_tokens():
    assert outcomes([5, 6, 7], [5, 6, 9, 1]) == [True, True, False]
    assert outcomes([5, 6, 7], [5, 6]) == [True, True]  # positions the target did not reach are not observed
    assert outcomes([4], [5, 6]) == [False]
    assert outcomes([], [5]) == []


def test_target_cost_keeps_each_size_and_its_scale_follows_load():
    cost = TargetCost([1.0, 1.2, 1.1, 1.5])
    assert [cost.seconds(n) for n in (1, 2, 3, 4)] == [1.0, 1.2, 1.1, 1.5]
    for _ in range(300):
        cost.observe(1, 2.0)  # the machine got twice as slow; only plain steps are seen
    assert cost.seconds(1) == pytest.approx(2.0, rel=0.02)
    assert cost.seconds(4) > 1.5 * 1.3  # the other sizes were scaled up with it
    assert cost.seconds(4) / cost.seconds(1) == pytest.approx(1.5, rel=0.1)  # sizes keep their calibrated ratios
    before = cost.seconds(2)
    cost.observe(2, 1000.0)  # one stall moves an estimate by a bounded amount
    assert cost.seconds(2) < 1.2 * before
    for _ in range(100):
        cost.observe(1, 2.0)
    assert cost.seconds(2) / cost.seconds(1) == pytest.approx(1.2, rel=0.05)  # and is forgotten once not seen again


def test_target_cost_prices_a_run_of_sizes_as_each_size_alone():
    """`seconds_from` (each request prices its draft with it, every step) gives t at each size: the calibrated
    sizes, then the last two extended linearly, plus the further sequences' cost."""
    cost = TargetCost([1.0, 1.2, 1.1, 1.5], per_sequence=0.1)
    assert cost.seconds_from(1, 4) == [1.0, 1.2, 1.1, 1.5]
    assert cost.seconds_from(3, 4, sequences=3) == pytest.approx([1.3, 1.7, 2.1, 2.5])
    for _ in range(5):
        cost.observe(2, 3.0)  # the scale and size 2 move
    assert cost.seconds_from(2, 2, sequences=2) == [cost.seconds(n, 2) for n in (2, 3)]
    assert cost.seconds_from(1, 6, sequences=2) == [cost.seconds(n, 2) for n in range(1, 7)]


def test_target_cost_refines_only_the_sizes_timed_one_by_one():
    """Past the sizes calibrated one by one, t(n) is a sparse grid's interpolation: a step's timing there moves
    the scale only, so a slow step at 20 rows cannot make 21 rows look cheaper than 20 (a draft row for free)."""
    cost = TargetCost([1.0 + n for n in range(32)], refined_sizes=4)
    for _ in range(50):
        cost.observe(20, 40.0)
    assert cost.seconds(21) - cost.seconds(20) == pytest.approx(cost.scale)  # the grid's slope, scaled
    assert cost.scale > 1.5
    for size in (3, 4):  # the sizes timed one by one keep their own refinement, up to the last of them
        before = cost.seconds(size) / cost.seconds(size - 1)
        cost.observe(size, 100.0)
        assert cost.seconds(size) / cost.seconds(size - 1) > 1.05 * before  # one step moves it at most 7%


def test_draft_cost_learns_the_cost_per_token_and_of_catching_up():
    cost = DraftCost(1.0)
    for _ in range(40):
        cost.observe(4, 1, 0.8)
    assert cost.seconds_per_token == pytest.approx(0.2, rel=0.02)
    for _ in range(40):
        cost.observe(1, 20, 0.2 + 20 * 0.05)  # 20 tokens behind: 0.05 s each on top of the drafted token
    assert cost.seconds_per_catch_up_token == pytest.approx(0.05, rel=0.02)
    assert cost.seconds_per_token == pytest.approx(0.2, rel=0.02)


def test_draft_costs_follow_a_load_change_seen_only_by_the_target():
    memory = ControllerMemory(TargetCost(LINEAR_TARGET))
    memory.add_draft_cost("model", DraftCost(0.3, 0.02))
    assert memory.draft_seconds("model", 2, behind=10) == pytest.approx(0.8)
    for _ in range(300):
        memory.target.observe(1, 2.0)  # the machine got twice as slow; the draft model is not in use
    assert memory.draft_seconds("model", 1) == pytest.approx(0.6, rel=0.05)


# --- simulated requests: the controller against synthetic drafters and a synthetic clock ---


class FakeModel(Drafter):
    """A model drafter that always proposes token 7."""

    name = "model"

    def begin(self, prompt_ids, params, generator):
        pass

    def propose(self, context_ids, k):
        return Draft(token_ids=(7,) * k)


class FakeLookup(Drafter):
    """A lookup drafter whose proposal the test sets."""

    name = "lookup"
    lookup_only = True

    def __init__(self):
        self.proposal: tuple[int, ...] = ()

    def begin(self, prompt_ids, params, generator):
        pass

    def propose(self, context_ids, k):
        return Draft(token_ids=self.proposal[:k])


def simulate(controller, drafters, steps: int, target_token: int, catch_up: float = 0.0):
    """Run `steps` steps on a synthetic clock: t(n) = LINEAR_TARGET, model drafting 0.3 s per token
    plus `catch_up` s per token produced since it last drafted.

    Returns the plans' (drafter, k) and the tokens and seconds of the whole run.
    """
    choices, tokens, seconds, behind = [], 0, 0.0, 0
    for _ in range(steps):
        plan = controller.plan(list(range(tokens + 3)), K_MAX)
        if plan.drafter in plan.lookups:
            draft = plan.lookups[plan.drafter].truncated(plan.k)
        else:
            draft = drafters[plan.drafter].propose([], plan.k) if plan.k else Draft(())
        accepted = sum(outcomes(draft.token_ids, (target_token,) * len(draft)))
        draft_seconds = 0.3 * len(draft) + catch_up * behind if plan.drafter == "model" else 0.0
        controller.observe(plan, draft, Verdict(accepted, (target_token,) * (accepted + 1)), draft_seconds)
        behind = 1 if plan.drafter == "model" else behind + accepted + 1
        choices.append((plan.drafter, plan.k))
        tokens += accepted + 1
        seconds += draft_seconds + LINEAR_TARGET[len(draft)]
    return choices, tokens, seconds


def ks_of(choices) -> list[int]:
    return [k for _, k in choices]


def fresh_memory() -> ControllerMemory:
    return ControllerMemory(TargetCost(LINEAR_TARGET), {"model": DraftCost(0.3)})


def test_a_hopeless_model_drafter_is_dropped_at_once_and_probed_within_the_budget():
    drafters = {"model": FakeModel()}
    controller = AdaptiveController(drafters, fresh_memory(), K_MAX)
    choices, tokens, seconds = simulate(controller, drafters, 1000, target_token=3)
    ks = ks_of(choices)
    first_plain = ks.index(0)
    assert first_plain <= 2
    assert 0 < sum(k > 0 for k in ks[first_plain:]) <= 1000 // 15  # probes, and few of them
    assert tokens / seconds >= 0.97 * PLAIN_RATE


@pytest.mark.parametrize("catch_up", [0.01, 0.1])
def test_probes_stay_within_budget_when_the_drafter_must_catch_up(catch_up):
    drafters = {"model": FakeModel()}
    controller = AdaptiveController(drafters, fresh_memory(), K_MAX)
    choices, tokens, seconds = simulate(controller, drafters, 1000, target_token=3, catch_up=catch_up)
    assert tokens / seconds >= 0.97 * PLAIN_RATE


def test_a_model_drafter_that_becomes_good_is_found_again():
    drafters = {"model": FakeModel()}
    controller = AdaptiveController(drafters, fresh_memory(), K_MAX)
    simulate(controller, drafters, 300, target_token=3)
    ks = ks_of(simulate(controller, drafters, 200, target_token=7)[0])
    recovered = next(i for i, k in enumerate(ks) if k >= 2)
    assert recovered < 100
    assert min(ks[recovered + 10 :]) >= 2


def test_a_wrong_lookup_is_dropped_and_learnt_again_from_proposals_it_does_not_draft():
    lookup = FakeLookup()
    controller = AdaptiveController({"lookup": lookup}, fresh_memory(), K_MAX)
    lookup.proposal = (9,) * K_MAX
    assert sum(ks_of(simulate(controller, {}, 50, target_token=3)[0])[12:]) == 0
    lookup.proposal = ()
    assert ks_of(simulate(controller, {}, 5, target_token=3)[0]) == [0] * 5  # no match: nothing to draft
    lookup.proposal = (3,) * 5  # now right: seen by comparing its proposal with the target's tokens at k = 0
    ks = ks_of(simulate(controller, {}, 30, target_token=3)[0])
    assert ks[0] == 0 and ks[-1] == 5  # capped by the proposal


def test_with_two_drafters_the_one_that_is_accepted_wins():
    lookup = FakeLookup()
    drafters = {"lookup": lookup, "model": FakeModel()}
    controller = AdaptiveController(drafters, fresh_memory(), K_MAX)
    lookup.proposal = (3,) * K_MAX
    choices = simulate(controller, drafters, 40, target_token=7)[0]  # the model is right, the lookup wrong
    assert all(drafter == "model" and k >= 4 for drafter, k in choices[-10:])
    lookup.proposal = (7,) * K_MAX
    choices = simulate(controller, drafters, 40, target_token=7)[0]  # both right: the free one wins
    assert all(drafter == "lookup" and k == K_MAX for drafter, k in choices[-10:])


# --- end to end on tiny models ---

PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):", "café 東京"]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)
DRAFTERS = ["ngram", "draft-self", "draft-other", "ngram,draft-self", "ngram,draft-other"]


class PinnedTargetCost(TargetCost):
    def observe(self, tokens: int, seconds: float, sequences: int = 1) -> None:
        pass


class PinnedDraftCost(DraftCost):
    def observe(self, tokens: int, behind: int, seconds: float) -> None:
        pass


CHEAP_DRAFTING = (0.01, 0.05)  # seconds per verified token beyond the first (t(1) = 1), per drafted token
SMALL_DRAFT_MODEL = (0.05, 0.3)


def auto_engine(
    target: LoadedModel,
    draft_dirs: dict[str, object],
    drafter: str,
    pinned: tuple[float, float] | None = CHEAP_DRAFTING,
) -> Engine:
    """An engine with k="auto" whose draft models `draft-*` are loaded from `draft_dirs`.

    `pinned`: fixed synthetic costs instead of measured ones, so decisions do not depend on how
    busy the machine is; the default makes drafting cheap, so exactness is tested on real drafting.
    """
    engine = Engine(target, SpecConfig(drafter=drafter, k="auto"))
    for name, directory in draft_dirs.items():
        draft = load_model_dir(directory, runtime="hf")
        engine._drafters[name] = DraftModelDrafter(draft.runner, target.info.vocab_size, name)
    if pinned:
        verify_cost, draft_cost = pinned
        engine._memory = ControllerMemory(
            PinnedTargetCost([1.0 + verify_cost * n for n in range(K_MAX + 1)]),
            {name: PinnedDraftCost(draft_cost) for name in draft_dirs},
        )
    return engine


def baseline(target: LoadedModel, prompt, params: SamplingParams) -> Finished:
    return Engine(target, SpecConfig(drafter="none", k=0)).generate(prompt, params)


@pytest.fixture(scope="module")
def engines(tiny_models, tiny_dirs):
    """One auto engine per (architecture, drafter list)."""
    result = {}
    for arch in ("llama", "gemma3"):
        dirs = {"draft-self": tiny_dirs[arch], "draft-other": tiny_dirs["llama-other"]}
        for drafter in DRAFTERS:
            result[arch, drafter] = auto_engine(tiny_models[arch], dirs, drafter)
    return result


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_output_with_auto_is_identical_to_target_alone(tiny_models, engines, arch, drafter):
    engine = engines[arch, drafter]
    drafted = 0
    for prompt in PROMPTS:
        expected = baseline(tiny_models[arch], prompt, GREEDY)
        result = engine.generate(prompt, GREEDY)
        assert result.token_ids == expected.token_ids, prompt
        stats = result.stats
        assert sum(stats.k_histogram) == sum(stats.drafter_steps.values()) == stats.steps
        assert set(stats.drafter_steps) <= {"none", *drafter.split(",")}
        assert len(stats.k_histogram) <= K_MAX + 1
        drafted += stats.draft_tokens
    assert drafted > 0


def test_a_hopeless_drafter_ends_up_drafting_nothing_on_most_steps(tiny_models, tiny_dirs):
    engine = auto_engine(
        tiny_models["llama"], {"draft-other": tiny_dirs["llama-other"]}, "draft-other", SMALL_DRAFT_MODEL
    )
    result = engine.generate("The quick brown fox", SamplingParams(max_new_tokens=80, ignore_eos=True))
    stats = result.stats
    assert stats.k_histogram[0] >= 0.75 * stats.steps
    assert (
        result.token_ids
        == baseline(tiny_models["llama"], "The quick brown fox", replace(GREEDY, max_new_tokens=80)).token_ids
    )


@pytest.mark.parametrize("drafter", ["draft-self", "ngram,draft-other"])
def test_eos_stop_strings_and_length_limits_with_auto(tiny_models, engines, drafter):
    target = tiny_models["gemma3"]
    engine = engines["gemma3", drafter]
    full = baseline(target, "Once upon a time", GREEDY)
    for max_new_tokens in (1, 2, 3, 9):
        result = engine.generate("Once upon a time", SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
        assert result.token_ids == full.token_ids[:max_new_tokens] and result.finish_reason == "length"
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    events = list(engine.stream("Once upon a time", replace(GREEDY, stop=(stop,))))
    assert events[-1].text == full.text[: full.text.index(stop)] and events[-1].finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == events[-1].text


def test_eos_inside_a_draft_with_auto(tiny_dirs):
    target = load_model_dir(tiny_dirs["llama"], runtime="hf")
    free_run = baseline(target, "Once upon a time", GREEDY).token_ids
    target.runner.info = replace(target.runner.info, eos_token_ids=frozenset({free_run[12]}))
    expected = baseline(target, "Once upon a time", SamplingParams(max_new_tokens=40))
    result = auto_engine(target, {"draft-self": tiny_dirs["llama"]}, "ngram,draft-self").generate(
        "Once upon a time", SamplingParams(max_new_tokens=40)
    )
    assert result.token_ids == expected.token_ids and result.finish_reason == "stop"


def test_sampling_with_auto_runs_and_reports_its_choices(tiny_models, engines):
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_new_tokens=30, ignore_eos=True)
    stats = engines["llama", "ngram,draft-self"].generate("Once upon a time", params).stats
    assert stats.generated_tokens == 30
    assert sum(stats.k_histogram) == stats.steps
    assert "k_histogram" in stats.to_dict() and "drafter_steps" in stats.to_dict()


def test_calibration_is_done_once_per_engine(tiny_models, tiny_dirs):
    engine = auto_engine(
        tiny_models["llama"], {"draft-other": tiny_dirs["llama-other"]}, "ngram,draft-other", pinned=None
    )
    memory = engine.calibrate()
    assert memory.target.max_tokens == K_MAX + 1 and memory.target.seconds(1) > 0
    assert set(memory.draft_costs) == {"draft-other"} and memory.draft_costs["draft-other"].seconds_per_token > 0
    engine.generate("Once upon a time", SamplingParams(max_new_tokens=5))
    assert engine.calibrate() is memory
    assert (
        engine.calibrate(SpecConfig(drafter="ngram", k_max=12)).target.max_tokens == 13
    )  # a longer k_max recalibrates


def test_auto_with_no_drafter_is_plain_decoding(tiny_models):
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="none"))
    stats = engine.generate("Once upon a time", GREEDY).stats
    assert stats.k_histogram == [stats.steps] and stats.drafter_steps == {"none": stats.steps}


def test_spec_config_and_cli_accept_auto_and_reject_bad_combinations():
    assert SpecConfig().k == "auto" and SpecConfig().adaptive
    assert SpecConfig(drafter="ngram, model-x").drafters == ("ngram", "model-x")
    with pytest.raises(UsageError, match="several drafters"):
        SpecConfig(drafter="ngram,model-x", k=4)
    with pytest.raises(UsageError, match="integer or 'auto'"):
        SpecConfig(k="fast")
    with pytest.raises(UsageError, match="k_max"):
        SpecConfig(k_max=0)
    with pytest.raises(UsageError, match="empty name"):
        SpecConfig(drafter="ngram,")
    assert parse_k("auto") == "auto" and parse_k("3") == 3
