import pytest
import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters import registry
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.drafters.draft_model import check_vocab_compatible
from quickdraft.drafters.ngram import NgramDrafter
from quickdraft.drafters.registry import loads_model, make_drafter, register_drafter
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from tests.test_engine import baseline
from tests.tiny_models import build_tokenizer


@pytest.mark.parametrize(
    "context, k, expected",
    [
        ([1, 2, 3, 4, 9, 9, 1, 2, 3], 3, (4, 9, 9)),  # the 3-gram [1, 2, 3] occurred before
        ([1, 2, 3, 4, 5, 7, 2, 3], 2, (4, 5)),  # falls back to the 2-gram [2, 3]
        ([5, 6, 7, 8], 4, ()),  # no repetition: nothing to propose
        ([1, 2, 3, 1, 2, 3, 8, 1, 2, 3], 4, (8, 1, 2, 3)),  # most recent occurrence with k successors
        ([7, 7, 7, 7], 3, (7,)),  # only the latest occurrence matches; its single successor is proposed
        ([1, 2, 3, 1, 2], 8, (3, 1, 2)),  # fewer than k successors available
    ],
)
def test_ngram_proposals(context, k, expected):
    assert NgramDrafter(min_n=1, max_n=3).propose(context, k).token_ids == expected


def reference_ngram_proposal(context: list[int], k: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """The rule written as a plain scan: for n from max_n down, the most recent earlier occurrence of the last n
    tokens that has k successors, else the most recent one with any; the tokens after it."""
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        hits = [s for s in range(len(context) - n) if context[s : s + n] == context[-n:]]
        if hits:
            full = [s for s in hits if s + n + k <= len(context)]
            start = (full or hits)[-1]
            return tuple(context[start + n : start + n + k])
    return ()


def test_ngram_proposals_on_a_growing_context_follow_the_rule_at_every_step():
    """The drafter indexes its context as it grows (a request's committed tokens); every proposal, for every k,
    equals the plain scan's, and a context that does not continue the last one (a new request) starts over."""
    generator = torch.Generator().manual_seed(0)
    drafter = NgramDrafter(min_n=1, max_n=4)
    for alphabet in (3, 12):
        drafter.begin([], SamplingParams(), generator)
        context = []
        for _ in range(120):
            context.append(int(torch.randint(alphabet, (1,), generator=generator)))
            for k in (1, 3, 8):
                assert drafter.propose(context, k).token_ids == reference_ngram_proposal(context, k, 1, 4), context
        shuffled = context[::-1]  # does not continue the indexed context
        assert drafter.propose(shuffled, 5).token_ids == reference_ngram_proposal(shuffled, 5, 1, 4)


def test_forks_drafting_interleaved_requests_each_get_their_own_proposals():
    parent = NgramDrafter()
    first, second = parent.fork(), parent.fork()
    for fork in (first, second):
        fork.begin([], SamplingParams(), torch.Generator())
    assert first.propose([1, 2, 3, 1, 2], 2).token_ids == (3, 1)
    assert second.propose([7, 8, 9, 7, 8], 2).token_ids == (9, 7)
    assert first.propose([1, 2, 3, 1, 2, 3, 4, 1], 3).token_ids == (2, 3, 4)


def test_ngram_proposals_have_no_distribution_and_respect_k_zero():
    drafter = NgramDrafter()
    assert drafter.propose([1, 2, 1], 2).probs is None
    assert drafter.propose([1, 2, 1], 0).token_ids == ()


def test_same_tokenizer_is_compatible():
    check_vocab_compatible(build_tokenizer(320), build_tokenizer(320), "same")


def test_different_tokenizer_is_refused():
    with pytest.raises(UsageError, match="different tokenizer|vocabulary"):
        other = build_tokenizer(320, corpus=["zebra quartz jam", "völlig ändern", "1234 5678"])
        check_vocab_compatible(build_tokenizer(320), other, "other")


# --- drafter names: each kind parses its own options; the registry builds them ---


@pytest.mark.parametrize(
    "name, sizes",
    [("ngram", (1, 4)), ("ngram:6", (1, 6)), ("ngram:2-3", (2, 3)), ("ngram:16-16", (16, 16))],
)
def test_ngram_sizes_come_from_its_name(tiny_models, name, sizes):
    drafter = make_drafter(name, tiny_models["llama"], DrafterLoadOptions())
    assert isinstance(drafter, NgramDrafter) and (drafter.min_n, drafter.max_n) == sizes


@pytest.mark.parametrize("name", ["ngram:0", "ngram:3-2", "ngram:17", "ngram:two", "ngram:1-2-3", "none:1"])
def test_bad_drafter_options_are_refused_with_the_forms_that_work(tiny_models, name):
    with pytest.raises(UsageError, match="ngram:MIN-MAX|takes no options"):
        make_drafter(name, tiny_models["llama"], DrafterLoadOptions())


def test_a_request_with_other_ngram_sizes_drafts_with_those_sizes(tiny_models):
    """Options live in the drafter's name, so a per-request spec gets a drafter of its own (a per-request
    SpecConfig(ngram_max=...) used to be ignored in favour of the engine's cached drafter)."""
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="ngram", k=4))
    prompt, params = "one two three four one two three four one two", SamplingParams(max_new_tokens=16)
    default = engine.generate(prompt, params)
    trigram = engine.generate(prompt, params, spec=engine.spec_with(drafter="ngram:3-3"))
    assert (engine.drafter("ngram").max_n, engine.drafter("ngram:3-3").min_n) == (4, 3)
    assert set(trigram.stats.drafter_steps) <= {"ngram:3-3", "none"}
    assert trigram.token_ids == default.token_ids


def test_a_plug_in_kind_is_built_by_name_and_inherits_the_capability_defaults(tiny_models, monkeypatch):
    class Repeat(Drafter):
        """Proposes the last token again, k times."""

        def __init__(self, times: str) -> None:
            self.name = f"repeat:{times}"

        def begin(self, prompt_ids, params, generator) -> None:
            pass

        def propose(self, context_ids, k):
            return Draft(token_ids=(context_ids[-1],) * k)

    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))  # the plug-in stays in this test
    register_drafter("repeat", lambda argument, target, options: Repeat(argument), loads_model=False)
    drafter = make_drafter("repeat:2", tiny_models["llama"], DrafterLoadOptions())
    assert drafter.name == "repeat:2" and not drafter.lookup_only and not drafter.target_layers
    assert not loads_model("repeat:2") and loads_model("head") and loads_model("some/draft-model")
    with pytest.raises(NotImplementedError, match="reads no target states"):
        drafter.observe_target(torch.zeros(1, 4))
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="repeat:2", k=2))
    params = SamplingParams(max_new_tokens=12)
    assert engine.generate("a b a b", params).token_ids == baseline(tiny_models["llama"], "a b a b", params).token_ids
