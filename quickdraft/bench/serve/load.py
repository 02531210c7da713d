"""The measurement itself: find the endpoint's model, send one warm-up request, then run each concurrency
level as a closed loop.

At concurrency C, C workers share one numbered list of requests: each takes the next number, sends
that request and waits for its end, so C requests stay in flight until the list runs out. Request n
sends prompt n mod (number of prompts), in file order. Every request has a timeout and every loop
ends with its list, so a run ends by itself. A failed request is recorded, never raised; only a
warm-up that fails stops the run, with the reason (URL, key, model, request body) as a one-line error.

Python's garbage collector stays off while a level runs (`_collector_paused`): a full collection over this
process's heap took 190-410 ms, and a pause that long, landing while requests are in flight, was counted into their
times to first token as if the endpoint had been slow.
"""

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import httpx

from quickdraft.bench.dataset import Prompt
from quickdraft.bench.serve.client import (
    Endpoint,
    RequestResult,
    auth_headers,
    chat_body,
    one_line,
    stream_chat,
)
from quickdraft.errors import QuickdraftError, UsageError

WARMUP_MAX_TOKENS = 8
CONTROLLED_FIELDS = ("model", "messages", "max_tokens", "temperature", "stream")  # set by flags, not --extra-body


@dataclass(frozen=True)
class ServeBenchConfig:
    """One bench-serve run. `requests` None means max(C, number of prompts) at concurrency C."""

    base_url: str  # the API base, e.g. http://127.0.0.1:8000/v1 (see api_base)
    api_key: str | None
    model: str | None  # None: the first id GET /models lists
    prompts: tuple[Prompt, ...]
    concurrency: tuple[int, ...]  # levels, run in this order; the first is the exactness reference
    requests: int | None  # per level
    max_tokens: int
    temperature: float
    ttft_target: float  # seconds; goodput counts the requests whose TTFT is within it
    extra_body: dict  # merged into every request body
    timeout: float  # seconds per request, end to end

    def requests_at(self, concurrency: int) -> int:
        return self.requests or max(concurrency, len(self.prompts))


@dataclass(frozen=True)
class LevelRun:
    """Every request of one concurrency level, in request-number order."""

    concurrency: int
    wall_time: float  # seconds from the level's start to its last response
    requests: tuple[RequestResult, ...]


@dataclass(frozen=True)
class LoadRun:
    model: str  # the model every request named
    warmup: RequestResult
    levels: tuple[LevelRun, ...]


def api_base(url: str) -> str:
    """The API base URL requests are sent under: `url` without a trailing slash or a pasted
    /chat/completions, with /v1 added when it has no path (http://host:8000 -> http://host:8000/v1)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or not _valid_port(parts):
        raise UsageError(f"--url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {url!r}")
    path = parts.path.rstrip("/").removesuffix("/chat/completions")
    return f"{parts.scheme}://{parts.netloc}{path or '/v1'}"


def _valid_port(parts: SplitResult) -> bool:
    """Whether the URL's port, if it names one, is a number in 0-65535 (reading a bad one raises)."""
    try:
        return parts.port is None or parts.port >= 0
    except ValueError:
        return False


def check_extra_body(extra_body: object) -> dict:
    """--extra-body parsed: a JSON object that leaves the fields bench-serve sets to their flags."""
    if not isinstance(extra_body, dict):
        raise UsageError(
            f"--extra-body must be a JSON object, e.g. '{{\"top_p\": 0.9}}', got a {type(extra_body).__name__}"
        )
    if taken := [name for name in CONTROLLED_FIELDS if name in extra_body]:
        raise UsageError(
            f"--extra-body sets {', '.join(taken)}, which bench-serve sets itself; leave it out "
            "(--model, --max-tokens and --temperature set theirs)"
        )
    return extra_body


def run_load(config: ServeBenchConfig, on_level: Callable[[LevelRun], None] = lambda level: None) -> LoadRun:
    """Warm up, then run every level; `on_level` hears of each as it ends."""
    return asyncio.run(_run_load(config, on_level))


async def _run_load(config: ServeBenchConfig, on_level: Callable[[LevelRun], None]) -> LoadRun:
    limits = httpx.Limits(max_connections=max(config.concurrency), max_keepalive_connections=max(config.concurrency))
    async with httpx.AsyncClient(timeout=config.timeout, limits=limits) as client:
        model = config.model or await first_model(client, config)
        endpoint = Endpoint(config.base_url, config.api_key, model)
        warmup = await _warm_up(client, config, endpoint)
        levels = []
        for concurrency in config.concurrency:
            with _collector_paused():
                levels.append(await _run_level(client, config, endpoint, concurrency))
            on_level(levels[-1])
    return LoadRun(model, warmup, tuple(levels))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection inside the block: what is alive before it is collected and frozen out of later scans
    (`gc.freeze`), and the collector is off until the block ends (a level allocates a few megabytes)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def first_model(client: httpx.AsyncClient, config: ServeBenchConfig) -> str:
    """The first id of GET /models."""
    url = f"{config.base_url}/models"
    try:
        response = await client.get(url, headers=auth_headers(config.api_key))
    except httpx.HTTPError as exc:
        raise _unreachable(url, one_line(f"{type(exc).__name__}: {exc}")) from None
    if response.status_code in (401, 403):
        raise _refused_key(url, f"HTTP {response.status_code}")
    if response.status_code != 200:
        raise UsageError(f"GET {url} answered HTTP {response.status_code}; pass --model, or check --url")
    try:
        return response.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise UsageError(f"GET {url} lists no model ids; pass --model") from None


async def _warm_up(client: httpx.AsyncClient, config: ServeBenchConfig, endpoint: Endpoint) -> RequestResult:
    """One short request of the first prompt; its failure says what to fix."""
    prompt = config.prompts[0]
    max_tokens = min(config.max_tokens, WARMUP_MAX_TOKENS)
    body = chat_body(endpoint.model, prompt.first_turn, max_tokens, config.temperature, config.extra_body)
    result = await stream_chat(client, endpoint, body, config.timeout, prompt.question_id, started=0.0)
    if not result.ok:
        raise _warmup_error(endpoint, result)
    return result


def _warmup_error(endpoint: Endpoint, result: RequestResult) -> QuickdraftError:
    url = endpoint.chat_url
    if result.status is None:
        return _unreachable(url, result.error)
    if result.status in (401, 403):
        return _refused_key(url, result.error)
    if result.status == 404:
        return UsageError(
            f"the warm-up request to {url} failed ({result.error}); check --model "
            f"(GET {endpoint.base_url}/models lists the models) and --url"
        )
    if 400 <= result.status < 500:
        return UsageError(
            f"{url} rejected the warm-up request ({result.error}); check --extra-body, --max-tokens and --temperature"
        )
    return QuickdraftError(f"the warm-up request to {url} failed ({result.error}); the endpoint is not working")


def _unreachable(url: str, error: str) -> UsageError:
    return UsageError(f"no answer from {url} ({error}); check --url, that the server is running, and --timeout")


def _refused_key(url: str, error: str) -> UsageError:
    return UsageError(f"{url} refused the API key ({error}); pass the right --api-key or set OPENAI_API_KEY")


async def _run_level(
    client: httpx.AsyncClient, config: ServeBenchConfig, endpoint: Endpoint, concurrency: int
) -> LevelRun:
    count = config.requests_at(concurrency)
    numbers = iter(range(count))  # shared by the workers: each number is taken once
    results: list[RequestResult | None] = [None] * count
    level_start = time.perf_counter()

    async def worker() -> None:
        for number in numbers:
            prompt = config.prompts[number % len(config.prompts)]
            body = chat_body(
                endpoint.model, prompt.first_turn, config.max_tokens, config.temperature, config.extra_body
            )
            started = time.perf_counter() - level_start
            results[number] = await stream_chat(client, endpoint, body, config.timeout, prompt.question_id, started)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return LevelRun(concurrency, time.perf_counter() - level_start, tuple(results))
