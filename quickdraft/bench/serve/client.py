"""One streamed chat completion against an OpenAI-compatible endpoint, timed from the client.

The request asks for `stream: true` with `stream_options.include_usage`; the server-sent events are
read here (no OpenAI client library, so any server that speaks the protocol works) and every
non-empty content delta is timed from the moment the request was sent. A failure (no connection, an
HTTP error, an error event in the stream, the timeout) becomes a RequestResult carrying the error,
never an exception.
"""

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

DONE = "[DONE]"
ERROR_CHARS = 300  # an error's text is cut to this many characters, so it stays one readable line


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: the API base URL (as an OpenAI client's base_url, e.g. http://host:8000/v1)."""

    base_url: str
    api_key: str | None
    model: str

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class RequestResult:
    """One request as the client saw it. Times are seconds; `chunk_times` and `e2e` count from sending."""

    prompt_id: int | str
    started: float  # seconds from the start of the request's level to sending it
    status: int | None  # HTTP status; None when no response came
    error: str | None  # what went wrong, one line; None when the request succeeded
    text: str  # every content delta, joined
    finish_reason: str | None
    output_tokens: int  # usage.completion_tokens when the server sent it, else the number of content chunks
    tokens_from_usage: bool
    chunk_times: tuple[float, ...]  # one per non-empty content chunk (a chunk may hold several tokens)
    e2e: float  # to the end of the stream, or to the failure
    speculation: dict | None  # a quickdraft server's per-response speculation statistics; None elsewhere

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        """Time to first token: sending to the first non-empty content chunk."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def inter_token_latencies(self) -> list[float]:
        """Gaps between successive content chunks, seconds; len(chunk_times) - 1 of them."""
        return [later - earlier for earlier, later in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (output_tokens - 1), seconds."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @classmethod
    def from_dict(cls, record: dict) -> "RequestResult":
        return cls(**record | {"chunk_times": tuple(record["chunk_times"])})


class StreamReader:
    """Reads a response's SSE lines in arrival order and keeps what the measurements need.

    Follows the SSE rules: `data:` lines (one optional space after the colon) accumulate until a blank
    line dispatches the event; comments (`:` lines) and other fields are ignored.
    """

    def __init__(self) -> None:
        self._data_lines: list[str] = []
        self.pieces: list[str] = []
        self.chunk_times: list[float] = []
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.speculation: dict | None = None
        self.error: str | None = None
        self.done = False

    def feed_line(self, line: str, at: float) -> None:
        """One line of the body (without its line break), received `at` seconds after sending."""
        if not line:
            self.flush(at)
            return
        field, _, value = line.partition(":")
        if field == "data":
            self._data_lines.append(value.removeprefix(" "))

    def flush(self, at: float) -> None:
        """Dispatch the event read so far (at a blank line, or when the body ends without one)."""
        if self._data_lines:
            data, self._data_lines = "\n".join(self._data_lines), []
            self._read_event(data, at)

    def _read_event(self, data: str, at: float) -> None:
        if data == DONE:
            self.done = True
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"an event that is not JSON: {data[:ERROR_CHARS]!r}"
            return
        if not isinstance(event, dict):
            self.error = f"an event that is not a JSON object: {data[:ERROR_CHARS]!r}"
            return
        if "error" in event:
            self.error = f"error event: {_error_message(event)}"
        tokens = (event.get("usage") or {}).get("completion_tokens")
        if isinstance(tokens, int):
            self.completion_tokens = tokens
        self.speculation = event.get("speculation") or self.speculation
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.pieces.append(content)
                self.chunk_times.append(at)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def result(self, prompt_id: int | str, started: float, status: int | None, e2e: float) -> RequestResult:
        return RequestResult(
            prompt_id=prompt_id,
            started=started,
            status=status,
            error=self.error,
            text="".join(self.pieces),
            finish_reason=self.finish_reason,
            output_tokens=len(self.chunk_times) if self.completion_tokens is None else self.completion_tokens,
            tokens_from_usage=self.completion_tokens is not None,
            chunk_times=tuple(self.chunk_times),
            e2e=e2e,
            speculation=self.speculation,
        )


def chat_body(model: str, user_message: str, max_tokens: int, temperature: float, extra_body: dict) -> dict:
    """A streamed chat request with usage included; `extra_body` is merged in last."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": user_message}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    } | extra_body


async def stream_chat(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict, timeout: float, prompt_id: int | str, started: float
) -> RequestResult:
    """Send one streamed chat request and read it to [DONE], within `timeout` seconds end to end."""
    reader = StreamReader()
    status = None
    sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", endpoint.chat_url, json=body, headers=endpoint.headers) as response:
                status = response.status_code
                if status != 200:
                    reader.error = f"HTTP {status}: {_body_message(await response.aread())}"
                else:
                    await _read_stream(response, reader, sent)
    except TimeoutError:
        reader.error = f"timed out after {timeout:g} s"
    except httpx.HTTPError as exc:
        reader.error = one_line(f"{type(exc).__name__}: {exc}")
    return reader.result(prompt_id, started, status, time.perf_counter() - sent)


async def _read_stream(response: httpx.Response, reader: StreamReader, sent: float) -> None:
    async for line in response.aiter_lines():
        reader.feed_line(line, time.perf_counter() - sent)
        if reader.done or reader.error:
            return
    reader.flush(time.perf_counter() - sent)
    if not reader.done and not reader.error:
        reader.error = "the stream ended without data: [DONE]"


def one_line(text: str) -> str:
    return " ".join(text.split())[:ERROR_CHARS] or "(no message)"


def _body_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the body's text."""
    text = body.decode(errors="replace")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return one_line(text)
    return _error_message(payload) if isinstance(payload, dict) else one_line(text)


def _error_message(payload: dict) -> str:
    error = payload.get("error", payload.get("detail", payload))
    message = error.get("message", error) if isinstance(error, dict) else error
    return one_line(message if isinstance(message, str) else json.dumps(message))
