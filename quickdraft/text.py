"""Text in and out: prompt encoding (with chat templates), incremental detokenisation, stop strings."""

from transformers import PreTrainedTokenizerBase

from quickdraft.errors import UsageError

Messages = list[dict[str, str]]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | Messages, chat: bool, model_name: str) -> list[int]:
    """Token ids of a plain prompt, or of chat messages rendered through the model's chat template.

    A string with `chat=True` becomes one user message; a list of messages always uses the template.
    """
    if isinstance(prompt, str) and not prompt.strip():
        raise UsageError("the prompt is empty; pass some text to continue")
    if isinstance(prompt, str) and not chat:
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not messages:
        raise UsageError("messages is empty; send at least one message")
    if not tokenizer.chat_template:
        raise UsageError(f"model {model_name} has no chat template; send a plain prompt instead (drop --chat)")
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting UTF-8 characters.

    Decodes a short window of recent ids twice (with and without the newest ones) and emits the
    difference, so tokenizers that merge spaces or bytes across tokens stream correctly; a
    window that ends in an incomplete character (U+FFFD) waits for the next token.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
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

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


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
