import pytest

from quickdraft.drafters.draft_model import check_vocab_compatible
from quickdraft.drafters.ngram import NgramDrafter
from quickdraft.errors import UsageError
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
