"""What a request produces: its events (`TextDelta`s, then one `Finished`) and the committed output behind them.

`RequestOutput` appends a step's tokens one by one until EOS, a stop string or the budget ends the
request, and hands out text only once it can no longer be part of a stop string. Each delta also says
where its text came from, in `TextSpan`s: a drafter's accepted draft, or the target itself.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from quickdraft.config import SamplingParams
from quickdraft.stats import GenerationStats
from quickdraft.text import IncrementalDetokenizer, StopMatcher

FinishReason = Literal["stop", "length"]
TARGET = "target"  # the source of a token the target wrote itself: the first, a recovered or a bonus token


@dataclass(frozen=True)
class TextSpan:
    """A run of a delta's text whose tokens came from one source."""

    text: str
    source: str  # the drafter whose accepted draft it is ("ngram", "head", ...), or TARGET
    tokens: int  # tokens that end inside this run (a token whose text is split across deltas counts once)


@dataclass(frozen=True)
class TextDelta:
    """Output of one step: new text, safe to show (never part of a stop string).

    One is yielded after every step, even when the text is empty (held back as a possible stop
    string or an incomplete character), so a consumer can cancel within one step.
    """

    text: str
    spans: tuple[TextSpan, ...] = ()  # `text` by source, in order: their texts joined are `text`


@dataclass(frozen=True)
class Finished:
    """The last event of a stream."""

    text: str  # the whole output text
    token_ids: tuple[int, ...]  # the output tokens (EOS excluded)
    finish_reason: FinishReason  # "stop": EOS or a stop string; "length": max_new_tokens or context full
    stats: GenerationStats


@dataclass(frozen=True)
class Failed:
    """The last event of a request the engine could not finish: what went wrong."""

    error: Exception


Event = TextDelta | Finished | Failed


class RequestOutput:
    """Committed output of one request: tokens, text, stop handling, what has been streamed."""

    def __init__(
        self, tokenizer, eos_token_ids: frozenset[int], prompt_ids: list[int], params: SamplingParams, budget: int
    ) -> None:
        self.prompt_ids = prompt_ids
        self.budget = budget  # most tokens this request may generate (max_new_tokens and context)
        self.generated: list[int] = []
        self._sources: list[str] = []  # per generated token: TARGET or the drafter that proposed it
        self._text_ends: list[int] = []  # per generated token: the length of the text once it was added
        self._spanned = 0  # generated tokens already counted in a span
        self.finish_reason: FinishReason | None = None
        self._eos = frozenset() if params.ignore_eos else eos_token_ids
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stop = StopMatcher(params.stop)
        self._text_end: int | None = None  # set when a stop string cuts the text
        self._streamed = 0  # characters already handed out as deltas

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def pending(self) -> int:
        return self.generated[-1]

    @property
    def remaining(self) -> int:
        return self.budget - len(self.generated)

    def commit(self, tokens: tuple[int, ...], sources: tuple[str, ...] | None = None) -> None:
        """Append tokens one by one until EOS, a stop string or the budget ends the request; `sources` names
        where each came from (default: the target)."""
        for token, source in zip(tokens, sources or (TARGET,) * len(tokens), strict=True):
            if token in self._eos:
                self.finish_reason = "stop"
                return
            self.generated.append(token)
            new_from = len(self._detokenizer.text)
            self._detokenizer.add(token)
            self._sources.append(source)
            self._text_ends.append(len(self._detokenizer.text))
            stop_at = self._stop.find(self._detokenizer.text, new_from)
            if stop_at is not None:
                self._text_end = stop_at
                self.finish_reason = "stop"
                return
            if self.remaining == 0:
                self.finish_reason = "length"
                return

    def visible_text(self) -> str:
        return self._detokenizer.text[: self._text_end]

    def deltas(self) -> Iterator[TextDelta]:
        """The step's delta; at the end only if text or uncounted tokens are left, so every delta precedes
        `Finished`."""
        text = self.visible_text()
        end = len(text) if self.finish_reason else self._stop.safe_length(text)
        if end > self._streamed or not self.finish_reason or self._spanned < len(self.generated):
            yield TextDelta(text[self._streamed : end], self._spans(text, self._streamed, end))
            self._streamed = max(end, self._streamed)

    def _spans(self, text: str, start: int, end: int) -> tuple[TextSpan, ...]:
        """`text[start:end]` cut by the source of each character's token, adjacent runs of one source merged."""
        runs: list[TextSpan] = []
        position = start
        while self._spanned < len(self.generated) and (self._text_ends[self._spanned] <= end or self.finish_reason):
            token_end = min(self._text_ends[self._spanned], end)
            runs.append(TextSpan(text[position:token_end], self._sources[self._spanned], 1))
            position = max(position, token_end)
            self._spanned += 1
        if position < end:  # the start of a token whose text is held back in part
            runs.append(TextSpan(text[position:end], self._sources[self._spanned], 0))
        merged: list[TextSpan] = []
        for run in runs:
            if merged and merged[-1].source == run.source:
                previous = merged.pop()
                run = TextSpan(previous.text + run.text, run.source, previous.tokens + run.tokens)
            merged.append(run)
        return tuple(merged)

    def finished(self, stats: GenerationStats) -> Finished:
        return Finished(self.visible_text(), tuple(self.generated), self.finish_reason, stats)
