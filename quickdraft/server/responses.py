"""OpenAI response objects: whole completions and the chunks of an SSE stream.

Chat and text completions differ only in their object names and in how a choice carries text
(`message` / `delta` versus `text`); `ChatFormat` and `TextFormat` hold those differences and
the functions below build everything else the same way. Every response carries the extra field
`speculation`: what the drafter proposed and the target kept for this request. A stream asked for
spans (`"quickdraft": {"spans": true}`) carries in each text chunk the extra field `spans`: the
chunk's text cut by where it came from, `[{"text", "source", "tokens"}]`, `source` being the drafter
whose accepted draft it is or "target".
"""

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from functools import partial

from quickdraft.config import SpecConfig
from quickdraft.engine import Finished, TextDelta
from quickdraft.server.errors import APIError
from quickdraft.stats import GenerationStats


@dataclass(frozen=True)
class ResponseHeader:
    """Fields every object and chunk of one response shares."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> "ResponseHeader":
        return cls(id=f"{prefix}{uuid.uuid4().hex}", created=int(time.time()), model=model)


class ChatFormat:
    id_prefix = "chatcmpl-"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    @staticmethod
    def choice(finished: Finished) -> dict:
        message = {"role": "assistant", "content": finished.text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finished.finish_reason}

    @staticmethod
    def chunk_choice(delta: dict, finish_reason: str | None) -> dict:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    @staticmethod
    def delta(text: str | None, first: bool) -> dict:
        """The first delta names the role; the closing one is empty."""
        return ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})


class TextFormat:
    id_prefix = "cmpl-"
    object = "text_completion"
    chunk_object = "text_completion"

    @staticmethod
    def choice(finished: Finished) -> dict:
        return {"index": 0, "text": finished.text, "logprobs": None, "finish_reason": finished.finish_reason}

    @staticmethod
    def chunk_choice(delta: dict, finish_reason: str | None) -> dict:
        return {"index": 0, **delta, "logprobs": None, "finish_reason": finish_reason}

    @staticmethod
    def delta(text: str | None, first: bool) -> dict:
        return {"text": text or ""}


ResponseFormat = type[ChatFormat] | type[TextFormat]


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def speculation(stats: GenerationStats, spec: SpecConfig) -> dict:
    """Per-response speculation statistics (the `speculation` field of every response)."""
    return {
        "drafter": spec.drafter,
        "k": spec.k,
        "steps": stats.steps,
        "drafts": stats.drafted_by_position[0] if stats.drafted_by_position else 0,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
        "acceptance_by_position": stats.acceptance_by_position,
    }


def completion(form: ResponseFormat, header: ResponseHeader, finished: Finished, spec: SpecConfig) -> dict:
    """A whole `chat.completion` or `text_completion` object."""
    return {
        **_opening(header, form.object),
        "choices": [form.choice(finished)],
        "usage": usage(finished.stats),
        "speculation": speculation(finished.stats, spec),
    }


async def sse_stream(
    form: ResponseFormat,
    header: ResponseHeader,
    events: AsyncIterator[TextDelta | Finished],
    spec: SpecConfig,
    include_usage: bool,
    include_spans: bool = False,
) -> AsyncIterator[str]:
    """`data: {chunk}` lines: role first (chat), text deltas (with their spans when asked), the finish reason,
    optional usage, [DONE]."""
    chunk = partial(_chunk, form, header, include_usage)
    if form is ChatFormat:
        yield chunk([form.chunk_choice(form.delta("", first=True), None)])
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                if event.text:
                    extra = {"spans": [asdict(span) for span in event.spans]} if include_spans else {}
                    yield chunk([form.chunk_choice(form.delta(event.text, first=False), None)], **extra)
            else:
                stats = speculation(event.stats, spec)
                yield chunk([form.chunk_choice(form.delta(None, first=False), event.finish_reason)], speculation=stats)
                if include_usage:
                    yield chunk([], usage=usage(event.stats))
    except APIError as exc:
        yield _sse(exc.body())
    yield "data: [DONE]\n\n"


def _chunk(form: ResponseFormat, header: ResponseHeader, include_usage: bool, choices: list[dict], **fields) -> str:
    """One stream chunk; with include_usage every chunk has a `usage` field, null until the last."""
    usage_field = {"usage": None} if include_usage else {}
    return _sse({**_opening(header, form.chunk_object), "choices": choices, **usage_field, **fields})


def _opening(header: ResponseHeader, object_name: str) -> dict:
    return {
        "id": header.id,
        "object": object_name,
        "created": header.created,
        "model": header.model,
        "system_fingerprint": None,
    }


def _sse(payload: dict) -> str:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"
