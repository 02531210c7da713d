import random

import pytest

from quickdraft.text import IncrementalDetokenizer, StopMatcher
from tests.tiny_models import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize("seed", range(10))
def test_streamed_text_equals_decoding_all_tokens(tokenizer, seed):
    rng = random.Random(seed)
    ids = tokenizer("café 東京 🙂 naïve text", add_special_tokens=False)["input_ids"]
    ids = ids + [rng.randrange(4, len(tokenizer)) for _ in range(40)]
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.add(token) for token in ids]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == detokenizer.text
    assert full.startswith(detokenizer.text) and full.rstrip("\ufffd") == detokenizer.text.rstrip("\ufffd")


def test_multibyte_characters_are_never_split(tokenizer):
    byte_ids = [
        tokenizer.convert_tokens_to_ids(t)
        for t in tokenizer.convert_ids_to_tokens(tokenizer("🙂", add_special_tokens=False)["input_ids"])
    ]
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.add(token) for token in byte_ids]
    assert deltas[-1] == "🙂" and all(delta == "" for delta in deltas[:-1])


def test_stop_matcher_finds_earliest_stop_in_new_text():
    matcher = StopMatcher(("END", "ND!"))
    assert matcher.find("abc END!", new_from=6) == 4
    assert matcher.find("abc", new_from=0) is None


@pytest.mark.parametrize(
    "text, safe",
    [("hello E", 6), ("hello EN", 6), ("hello", 5), ("hello X", 7), ("", 0)],
)
def test_stop_matcher_holds_back_possible_stop_prefixes(text, safe):
    assert StopMatcher(("END",)).safe_length(text) == safe
