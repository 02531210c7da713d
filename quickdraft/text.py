"""Text in and out: prompt encoding (with chat templates), incremental detokenisation, stop strings."""

import functools
import re
import secrets
from collections.abc import Callable

from transformers import PreTrainedTokenizerBase, TokenizersBackend

from quickdraft.errors import UsageError

Messages = list[dict[str, str]]
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters around a placeholder (see `encode_chat`)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | Messages, chat: bool, model_name: str) -> list[int]:
    """Token ids of a plain prompt, or of chat messages rendered through the model's chat template.

    A string with `chat=True` becomes one user message; a list of messages always uses the template.
    Text from the caller never becomes a control token: see `encode_text` and `encode_chat`.
    """
    if isinstance(prompt, str) and not prompt.strip():
        raise UsageError("the prompt is empty; pass some text to continue")
    if isinstance(prompt, str) and not chat:
        return encode_text(tokenizer, prompt)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not messages:
        raise UsageError("messages is empty; send at least one message")
    if not tokenizer.chat_template:
        raise UsageError(f"model {model_name} has no chat template; send a plain prompt instead (drop --chat)")
    return encode_chat(tokenizer, messages)


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The ids of `text` as text (the tokenizer's own start tokens added): a special token's string in it,
    such as `<|im_start|>`, is spelled out in ordinary tokens, never read as that control token."""
    return list(tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: Messages) -> list[int]:
    """The ids of `messages` rendered through the chat template, where only the template makes control tokens.

    Every special token's string inside a message's content is swapped for a placeholder no client can
    guess before rendering; the rendered text is then tokenized as usual (the template's own control
    tokens parsed) with each placeholder encoded as the text it replaced. Content without such strings
    has no placeholders: its ids are exactly those of tokenizing the rendered text.
    """
    specials = _special_strings(tokenizer)
    nonce = secrets.token_hex(8)
    replaced: list[str] = []
    masked = [{**message, "content": _mask(message["content"], specials, nonce, replaced)} for message in messages]
    rendered = tokenizer.apply_chat_template(masked, add_generation_prompt=True, tokenize=False)
    pieces = re.split(f"{_OPEN}{nonce}:([0-9]+){_CLOSE}", rendered)  # text, index, text, index, ..., text
    ids: list[int] = []
    for position, piece in enumerate(pieces):
        if position % 2:
            ids += tokenizer(replaced[int(piece)], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids


def _special_strings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The strings the tokenizer reads as special tokens, longest first (so the longest match wins, as it does)."""
    return _special_strings_of(tokenizer, len(tokenizer))


@functools.lru_cache(maxsize=8)
def _special_strings_of(tokenizer: PreTrainedTokenizerBase, vocabulary_size: int) -> tuple[str, ...]:
    """Cached per tokenizer and vocabulary size (a token added later is seen): Gemma's tokenizer has 6000 of them."""
    added = (token.content for token in tokenizer.added_tokens_decoder.values() if token.special)
    return tuple(sorted(set(added) | set(tokenizer.all_special_tokens), key=len, reverse=True))


def _mask(content: str, specials: tuple[str, ...], nonce: str, replaced: list[str]) -> str:
    """`content` with each special token's string replaced by a numbered placeholder; the strings go to `replaced`."""
    present = [special for special in specials if special in content]
    if not present:
        return content

    def placeholder(match: re.Match) -> str:
        replaced.append(match.group())
        return f"{_OPEN}{nonce}:{len(replaced) - 1}{_CLOSE}"

    return re.sub("|".join(map(re.escape, present)), placeholder, content)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting UTF-8 characters.

    Decodes a short window of recent ids twice (with and without the newest ones) and emits the
    difference, so tokenizers that merge spaces or bytes across tokens stream correctly; a
    window that ends in an incomplete character (U+FFFD) waits for the next token.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._decode = _decoder(tokenizer)  # ids -> text, special tokens skipped
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0  # start of the decoding window
        self._read_offset = 0  # ids before this are already in self.text

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly completed text (possibly empty)."""
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self.token_ids[self._prefix_offset :])
        if len(window_text) <= len(prefix_text) or window_text.endswith("\ufffd"):
            return ""
        delta = window_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self.text += delta
        return delta


def _decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)` as a function of ids:
    straight through the `tokenizers` backend where the tokenizer's own decoding is that call and nothing more
    (the detokenizer decodes twice per generated token, and the wrapper's handling of its arguments costs more
    than the decoding), else through `decode`."""
    if isinstance(tokenizer, TokenizersBackend) and type(tokenizer)._decode is TokenizersBackend._decode:
        return functools.partial(tokenizer.backend_tokenizer.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class StopMatcher:
    """Finds text-level stop strings and says how much text is safe to stream.

    Text that might be the beginning of a stop string is held back until it is clear either way.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self._longest = max((len(s) for s in stop), default=0)

    def find(self, text: str, new_from: int) -> int | None:
        """Index where the earliest stop string starts, searching text that ends after `new_from`."""
        start = max(0, new_from - self._longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """Length of the prefix of `text` that cannot turn into a stop string with more text."""
        for held in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-held:]
            if any(s.startswith(tail) for s in self.stop):
                return len(text) - held
        return len(text)
