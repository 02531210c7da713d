"""The corpus drafter: a table of the target's own most frequent continuations, counted, stored and drafted from."""

from pathlib import Path

import pytest
import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters import corpus
from quickdraft.drafters.base import DrafterLoadOptions
from quickdraft.drafters.corpus import CorpusDrafter, count_table, load_table, save_table
from quickdraft.drafters.registry import make_drafter
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.models.loading import load_model_dir

# (sequence, answer start): answers follow a two-token prompt
ANSWERS = [
    ([90, 91, 1, 2, 3, 4], 2),
    ([90, 92, 1, 2, 3, 5], 2),
    ([93, 94, 1, 2, 3, 4], 2),
    ([95, 96, 7, 8], 2),
]


def test_a_table_keeps_each_contexts_most_frequent_next_token_and_its_share():
    table = count_table(ANSWERS, vocab_size=100, target="tiny", max_order=3, min_count=2)
    drafter = CorpusDrafter(table)
    assert table.answer_tokens == 14 and table.max_order == 3 and table.target == "tiny"
    assert drafter.propose([2, 3], 1).token_ids == (4,)  # 4 twice, 5 once after (1, 2, 3), (2, 3) and (3,)
    hit = drafter._longest_match([1, 2, 3])
    assert hit is not None and hit[0] == 4 and hit[1] == pytest.approx(2 / 3)
    # the prompt's last token is a context too: (91,) once, (92,) once -> below min_count; (1,) came after 3 prompts
    assert drafter._longest_match([91]) is None and drafter._longest_match([50, 1])[0] == 2
    assert drafter._longest_match([7]) is None  # seen once: dropped
    assert count_table(ANSWERS, 100, "tiny", min_count=1).keys.numel() > table.keys.numel()
    tied = count_table([([1, 5, 9], 1), ([1, 5, 8], 1)], 100, "tiny", max_order=1, min_count=1)
    assert CorpusDrafter(tied).propose([5], 1).token_ids == (8,)  # a tie goes to the lowest id


def test_a_proposal_chains_the_longest_known_tail_and_names_its_first_tokens_share():
    drafter = CorpusDrafter(count_table(ANSWERS, 100, "tiny", min_count=2))
    draft = drafter.propose([60, 61, 1], 8)
    assert draft.token_ids == (2, 3, 4) and draft.probs is None  # 4 has no known successor: the chain ends
    assert draft.source == "share-9"  # 1 -> 2 every time: share 1.0, in the top tenth
    assert drafter.propose([60, 61, 1], 2).token_ids == (2, 3)
    assert drafter.propose([2, 3], 1).source == "share-6"  # (2, 3) -> 4 in 2 of 3
    assert drafter.propose([60, 61, 1], 0).token_ids == () and drafter.propose([77], 4).token_ids == ()


def test_a_table_survives_its_file_and_a_foreign_file_is_refused(tmp_path):
    table = count_table(ANSWERS, 100, "tiny", min_count=1)
    save_table(table, tmp_path / "t.safetensors")
    loaded = load_table(tmp_path / "t.safetensors")
    for column in ("keys", "next_tokens", "best_counts", "totals"):
        assert torch.equal(getattr(loaded, column), getattr(table, column))
    assert (loaded.vocab_size, loaded.max_order, loaded.target, loaded.answer_tokens) == (100, 3, "tiny", 14)
    (tmp_path / "junk.safetensors").write_bytes(b"not a table")
    with pytest.raises(UsageError, match="is not a corpus table .*quickdraft distill table DATA --out FILE"):
        load_table(tmp_path / "junk.safetensors")
    with pytest.raises(UsageError, match="contexts must hold"):
        count_table(ANSWERS, 100, "tiny", max_order=0)


def test_the_drafter_is_found_by_name_and_refuses_another_vocabulary(tiny_models, tmp_path, monkeypatch):
    target = tiny_models["llama"]
    save_table(count_table(ANSWERS, target.info.vocab_size, "tiny"), tmp_path / "mine.safetensors")
    drafter = make_drafter(f"corpus:{tmp_path / 'mine.safetensors'}", target, DrafterLoadOptions())
    assert drafter.lookup_only and drafter.name == f"corpus:{tmp_path / 'mine.safetensors'}"
    save_table(count_table(ANSWERS, 100, "another-model"), tmp_path / "other.safetensors")
    with pytest.raises(UsageError, match="counts another-model's answers in a vocabulary of 100 tokens"):
        make_drafter(f"corpus:{tmp_path / 'other.safetensors'}", target, DrafterLoadOptions())
    with pytest.raises(UsageError, match="no corpus table at .*missing"):
        make_drafter(f"corpus:{tmp_path / 'missing'}", target, DrafterLoadOptions())
    monkeypatch.setattr(corpus, "SHIPPED_TABLES", tmp_path / "shipped")
    with pytest.raises(UsageError, match="no corpus table shipped for llama \\(shipped for: none\\)"):
        make_drafter("corpus", target, DrafterLoadOptions())
    save_table(count_table(ANSWERS, target.info.vocab_size, "llama"), tmp_path / "shipped" / "llama.safetensors")
    assert make_drafter("corpus", target, DrafterLoadOptions()).name == "corpus"


def test_drafting_from_the_targets_own_answers_is_exact_and_accepted(tiny_models):
    """A table counted over the target's own greedy answers drafts them back: accepted, and the output under
    k auto beside n-gram lookup is the target's alone."""
    target = tiny_models["llama-corpus"]
    alone = Engine(target, SpecConfig(drafter="none"))
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    prompts = ["Once upon a time", "The quick brown fox", "The dog sleeps."]
    answers = []
    for prompt in prompts:
        prompt_ids = alone.encode(prompt)
        answers.append(([*prompt_ids, *alone.generate(prompt_ids, params).token_ids], len(prompt_ids)))
    engine = Engine(target, SpecConfig(drafter="ngram,corpus"))
    engine.add_drafter("corpus", CorpusDrafter(count_table(answers, target.info.vocab_size, "llama-corpus")))
    for prompt, (sequence, start) in zip(prompts, answers):
        result = engine.generate(prompt, params)
        assert list(result.token_ids) == sequence[start:]
    fixed = Engine(target, SpecConfig(drafter="corpus", k=4))
    fixed.add_drafter("corpus", engine.drafter("corpus"))
    result = fixed.generate(prompts[0], params)
    assert list(result.token_ids) == answers[0][0][answers[0][1] :]
    assert result.stats.accepted_tokens > 0 and set(result.stats.drafter_steps) <= {"corpus", "none"}


def test_the_shipped_table_file_names_a_target_with_that_file_name():
    for path in Path(corpus.SHIPPED_TABLES).glob("*.safetensors"):
        table = load_table(path)
        assert table.target == path.stem and table.max_order == corpus.MAX_ORDER and table.answer_tokens > 100_000


@pytest.mark.real_model
def test_the_shipped_tables_draft_for_their_targets_by_default_and_refuse_another(builtin_model_dir):
    """With no drafter named, a built-in model speculates with n-gram lookup and its shipped table; a table is
    refused by a target with another vocabulary."""
    builtin_model_dir("smollm2-135m-instruct")
    engine = Engine.from_names("smollm2-135m-instruct")
    assert engine.spec.drafter == "ngram,corpus"
    prompt = engine.encode("Name three primary colours.", chat=True)
    params = SamplingParams(max_new_tokens=48)
    expected = engine.generate(prompt, params, spec=engine.spec_with(drafter="none")).token_ids
    assert engine.generate(prompt, params).token_ids == expected
    result = engine.generate(prompt, params, spec=SpecConfig(drafter="corpus", k=2))
    assert result.token_ids == expected and result.stats.accepted_tokens > 0
    gemma = Engine(load_model_dir(builtin_model_dir("gemma-3-270m"), name="gemma-3-270m"), SpecConfig(drafter="none"))
    assert gemma.drafter("corpus").name == "corpus"
    smollm2_table = corpus.SHIPPED_TABLES / "smollm2-135m-instruct.safetensors"
    with pytest.raises(UsageError, match="counts smollm2-135m-instruct's answers in a vocabulary of 49152 tokens"):
        gemma.drafter(f"corpus:{smollm2_table}")
