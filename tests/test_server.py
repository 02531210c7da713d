"""The HTTP server as clients see it: a real `quickdraft serve` process on 127.0.0.1, a tiny model.

Covers the official `openai` client (chat and completions, streamed and not, include_usage) with
outputs identical to the engine's own, /metrics after requests, a table of invalid requests,
disconnects, a burst beyond the queue, a bounded load test and a SIGTERM shutdown.
"""

import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.models.loading import load_model_dir
from tests.conftest import LONG_CONTEXT
from tests.server_process import ServerProcess, start_server

API_KEY = "test-key-123"
MAX_QUEUE = 8
MAX_BODY = 64 * 1024
READ_TIMEOUT = 2.0  # seconds the fixture's server gives a client to send a whole request
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    process = start_server(
        tiny_dirs["llama-long"],
        log,
        "--runtime",
        "hf",
        "--threads",
        "1",
        "--drafter",
        "ngram",
        "--k",
        "4",
        "--served-model-name",
        "tiny",
        "--max-queue",
        str(MAX_QUEUE),
        "--max-body-bytes",
        str(MAX_BODY),
        "--read-timeout",
        str(READ_TIMEOUT),
        api_key=API_KEY,
    )
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def engine(tiny_models):
    return Engine(tiny_models["llama-long"], SpecConfig(drafter="ngram", k=4))


def test_prints_where_it_listens_and_lists_the_model(server, client):
    assert (
        f"quickdraft: serving tiny (drafter ngram, k 4, max batch 1) at http://127.0.0.1:{server.port}/v1"
        in server.log()
    )
    assert [model.id for model in client.models.list()] == ["tiny"]
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}


def test_a_model_is_retrieved_by_id_and_health_answers_head(server, client):
    """What the openai client's models.retrieve and a load balancer's HEAD probe ask for."""
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="does not exist here; this server serves 'tiny'"):
        client.models.retrieve("gpt-4")
    probe = httpx.head(f"{server.base_url}/health")
    assert probe.status_code == 200 and probe.content == b""


def test_chat_greedy_is_identical_to_the_engine(client, engine):
    expected = engine.generate(MESSAGES, SamplingParams(temperature=0, max_new_tokens=30), chat=True)
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=30, temperature=0)
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].finish_reason == expected.finish_reason
    assert response.usage.prompt_tokens == expected.stats.prompt_tokens
    assert response.usage.completion_tokens == expected.stats.generated_tokens
    speculation = response.model_extra["speculation"]
    assert speculation["drafter"] == "ngram" and speculation["k"] == 4
    assert speculation["draft_tokens"] == expected.stats.draft_tokens
    assert speculation["accepted_tokens"] == expected.stats.accepted_tokens
    assert speculation["mean_accepted_length"] == pytest.approx(expected.stats.mean_accepted_length)


def test_chat_stream_with_usage_is_identical_to_the_engine(client, engine):
    expected = engine.generate(MESSAGES, SamplingParams(temperature=0.8, seed=11, max_new_tokens=40), chat=True)
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_completion_tokens=40,
            temperature=0.8,
            seed=11,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.role for c in chunks[1:] if c.choices] == [None] * (len(chunks) - 2)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == expected.text
    finish_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish_chunks) == 1 and finish_chunks[0] is chunks[-2]
    assert finish_chunks[0].choices[0].finish_reason == expected.finish_reason
    assert finish_chunks[0].model_extra["speculation"]["draft_tokens"] == expected.stats.draft_tokens
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert usage_chunks == [chunks[-1]] and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == expected.stats.generated_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_completion_with_seed_and_stop_is_identical_to_the_engine(client, engine, stream):
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=3, max_new_tokens=40, stop=("e",))
    expected = engine.generate("Once upon a time", params)
    extra = {"extra_body": {"top_k": 50}, "temperature": 0.9, "top_p": 0.95, "seed": 3, "stop": "e", "max_tokens": 40}
    response = client.completions.create(model="tiny", prompt="Once upon a time", stream=stream, **extra)
    if stream:
        chunks = list(response)
        text = "".join(chunk.choices[0].text for chunk in chunks)
        finish_reason = chunks[-1].choices[0].finish_reason
        assert all(chunk.usage is None for chunk in chunks)
    else:
        text, finish_reason = response.choices[0].text, response.choices[0].finish_reason
        assert response.object == "text_completion"
        assert response.usage.total_tokens == expected.stats.prompt_tokens + expected.stats.generated_tokens
    assert text == expected.text
    assert finish_reason == expected.finish_reason


def test_per_request_drafter_override_keeps_the_output(client, engine):
    expected = engine.generate("The dog sleeps. The dog", SamplingParams(max_new_tokens=30))
    for options in ({"drafter": "none"}, {"drafter": "ngram", "k": 1}, {"k": 0}):
        response = client.completions.create(
            model="tiny",
            prompt="The dog sleeps. The dog",
            max_tokens=30,
            temperature=0,
            extra_body={"quickdraft": options},
        )
        assert response.choices[0].text == expected.text, options
        speculation = response.model_extra["speculation"]
        assert speculation["drafter"] == options.get("drafter", "ngram")
        assert speculation["k"] == options.get("k", 4)
    assert speculation["draft_tokens"] == 0


def test_metrics_count_what_a_request_did(server, client):
    before = server.metrics()
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=25, temperature=0, extra_body={"ignore_eos": True}
    )
    after = server.metrics()
    speculation = response.model_extra["speculation"]
    reason = response.choices[0].finish_reason

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew(f'quickdraft_request_success_total{{finished_reason="{reason}"}}') == 1
    assert grew("quickdraft_prompt_tokens_total") == response.usage.prompt_tokens
    assert grew("quickdraft_generation_tokens_total") == response.usage.completion_tokens
    assert grew("quickdraft_spec_decode_num_drafts_total") == speculation["drafts"]
    assert grew("quickdraft_spec_decode_num_draft_tokens_total") == speculation["draft_tokens"]
    assert grew("quickdraft_spec_decode_num_accepted_tokens_total") == speculation["accepted_tokens"]
    per_position = sum(
        v - before.get(k, 0.0)
        for k, v in after.items()
        if k.startswith("quickdraft_spec_decode_num_accepted_tokens_per_pos_total")
    )
    assert per_position == speculation["accepted_tokens"]
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        assert grew(f"quickdraft_{histogram}_count") == 1
        assert after[f'quickdraft_{histogram}_bucket{{le="+Inf"}}'] == after[f"quickdraft_{histogram}_count"]
    assert after["quickdraft_num_requests_running"] == 0 and after["quickdraft_num_requests_waiting"] == 0


def chat(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def text(**fields) -> dict:
    return {"model": "tiny", "prompt": "hi", "max_tokens": 4, **fields}


CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
USER_HI = {"role": "user", "content": "hi"}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
KEY = {"Authorization": f"Bearer {API_KEY}"}
# (id, method, path, body: dict | bytes | None, headers, expected status, expected param, expected code)
INVALID = [
    ("malformed-json", "POST", CHAT, b'{"model": "tiny",', KEY, 400, None, "invalid_json"),
    ("empty-body", "POST", CHAT, b"", KEY, 400, None, "invalid_json"),
    ("not-utf8", "POST", TEXT, b'{"prompt": "\xff\xfe"}', KEY, 400, None, "invalid_json"),
    ("array-body", "POST", CHAT, b"[1, 2]", KEY, 400, None, None),
    ("model-missing", "POST", CHAT, {"messages": [{"role": "user", "content": "hi"}]}, KEY, 400, "model", None),
    ("model-wrong-type", "POST", CHAT, chat(model=5), KEY, 400, "model", None),
    ("model-unknown", "POST", CHAT, chat(model="gpt-4o"), KEY, 404, "model", "model_not_found"),
    ("model-path", "POST", TEXT, text(model="/etc/passwd"), KEY, 404, "model", "model_not_found"),
    ("messages-missing", "POST", CHAT, {"model": "tiny"}, KEY, 400, "messages", None),
    ("messages-empty", "POST", CHAT, chat(messages=[]), KEY, 400, "messages", None),
    ("messages-string", "POST", CHAT, chat(messages="hi"), KEY, 400, "messages", None),
    (
        "role-unknown",
        "POST",
        CHAT,
        chat(messages=[{"role": "robot", "content": "hi"}]),
        KEY,
        400,
        "messages[0].role",
        None,
    ),
    (
        "content-number",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": 5}]),
        KEY,
        400,
        "messages[0].content",
        None,
    ),
    (
        "content-image",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        KEY,
        400,
        "messages[0].content",
        None,
    ),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), KEY, 400, "temperature", None),
    ("temperature-negative", "POST", CHAT, chat(temperature=-0.5), KEY, 400, "temperature", None),
    ("temperature-too-high", "POST", TEXT, text(temperature=2.5), KEY, 400, "temperature", None),
    ("top-p-zero", "POST", CHAT, chat(top_p=0), KEY, 400, "top_p", None),
    ("top-p-above-one", "POST", TEXT, text(top_p=1.5), KEY, 400, "top_p", None),
    ("top-k-negative", "POST", CHAT, chat(top_k=-5), KEY, 400, "top_k", None),
    ("top-k-float", "POST", CHAT, chat(top_k=2.5), KEY, 400, "top_k", None),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), KEY, 400, "max_tokens", None),
    ("max-tokens-string", "POST", TEXT, text(max_tokens="10"), KEY, 400, "max_tokens", None),
    ("max-tokens-float", "POST", TEXT, text(max_tokens=10.5), KEY, 400, "max_tokens", None),
    ("max-tokens-huge", "POST", CHAT, chat(max_tokens=10**12), KEY, 400, "max_tokens", "context_length_exceeded"),
    (
        "max-completion-tokens-negative",
        "POST",
        CHAT,
        chat(max_completion_tokens=-1),
        KEY,
        400,
        "max_completion_tokens",
        None,
    ),
    (
        "prompt-too-long",
        "POST",
        TEXT,
        text(prompt="fox " * (LONG_CONTEXT + 100)),
        KEY,
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "prompt-fills-context",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": "fox " * (LONG_CONTEXT + 100)}], max_tokens=None),
        KEY,
        400,
        "messages",
        "context_length_exceeded",
    ),
    ("n-two", "POST", CHAT, chat(n=2), KEY, 400, "n", None),
    ("stop-number", "POST", CHAT, chat(stop=5), KEY, 400, "stop", None),
    ("stop-too-many", "POST", TEXT, text(stop=["a", "b", "c", "d", "e"]), KEY, 400, "stop", None),
    ("stop-empty-string", "POST", CHAT, chat(stop=[""]), KEY, 400, "stop", None),
    ("seed-string", "POST", CHAT, chat(seed="abc"), KEY, 400, "seed", None),
    ("seed-too-big", "POST", CHAT, chat(seed=2**70), KEY, 400, "seed", None),
    ("stream-string", "POST", CHAT, chat(stream="yes"), KEY, 400, "stream", None),
    (
        "stream-options-without-stream",
        "POST",
        CHAT,
        chat(stream_options={"include_usage": True}),
        KEY,
        400,
        "stream_options",
        None,
    ),
    (
        "include-usage-string",
        "POST",
        CHAT,
        chat(stream=True, stream_options={"include_usage": "x"}),
        KEY,
        400,
        "stream_options.include_usage",
        None,
    ),
    ("logprobs", "POST", CHAT, chat(logprobs=True), KEY, 400, "logprobs", None),
    ("tools", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), KEY, 400, "tools", None),
    ("presence-penalty", "POST", CHAT, chat(presence_penalty=1.0), KEY, 400, "presence_penalty", None),
    ("tool-choice-required", "POST", CHAT, chat(tool_choice="required"), KEY, 400, "tool_choice", None),
    (
        "tool-choice-function",
        "POST",
        CHAT,
        chat(tool_choice={"type": "function", "function": {"name": "f"}}),
        KEY,
        400,
        "tool_choice",
        None,
    ),
    ("modalities-audio", "POST", CHAT, chat(modalities=["text", "audio"]), KEY, 400, "modalities", None),
    ("audio-output", "POST", CHAT, chat(audio={"voice": "alloy", "format": "wav"}), KEY, 400, "audio", None),
    (
        "content-null",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": None}]),
        KEY,
        400,
        "messages[0].content",
        None,
    ),
    (
        "content-missing",
        "POST",
        CHAT,
        chat(messages=[{"role": "system", "content": "Be brief."}, {"role": "user"}]),
        KEY,
        400,
        "messages[1].content",
        None,
    ),
    (
        "assistant-content-null",
        "POST",
        CHAT,
        chat(messages=[USER_HI, {"role": "assistant", "content": None}, USER_HI]),
        KEY,
        400,
        "messages[1].content",
        None,
    ),
    (
        "assistant-tool-calls",
        "POST",
        CHAT,
        chat(messages=[USER_HI, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}, USER_HI]),
        KEY,
        400,
        "messages[1].tool_calls",
        None,
    ),
    ("logit-bias-wrong-type", "POST", CHAT, chat(logit_bias=[1, 2]), KEY, 400, "logit_bias", None),
    ("drafter-path", "POST", CHAT, chat(quickdraft={"drafter": "/etc/passwd"}), KEY, 400, "quickdraft.drafter", None),
    ("draft-k-too-big", "POST", CHAT, chat(quickdraft={"k": 100}), KEY, 400, "quickdraft.k", None),
    ("quickdraft-not-object", "POST", CHAT, chat(quickdraft="fast"), KEY, 400, "quickdraft", None),
    ("prompt-missing", "POST", TEXT, {"model": "tiny"}, KEY, 400, "prompt", None),
    ("prompt-number", "POST", TEXT, text(prompt=5), KEY, 400, "prompt", None),
    ("prompt-empty-list", "POST", TEXT, text(prompt=[]), KEY, 400, "prompt", None),
    ("prompt-batch", "POST", TEXT, text(prompt=["a", "b"]), KEY, 400, "prompt", None),
    ("prompt-token-out-of-range", "POST", TEXT, text(prompt=[5, 10**9]), KEY, 400, "prompt", None),
    ("prompt-blank", "POST", TEXT, text(prompt="   "), KEY, 400, "prompt", None),
    ("echo", "POST", TEXT, text(echo=True), KEY, 400, "echo", None),
    ("best-of", "POST", TEXT, text(best_of=3), KEY, 400, "best_of", None),
    ("key-missing", "POST", CHAT, chat(), {}, 401, None, "invalid_api_key"),
    ("key-wrong", "POST", CHAT, chat(), {"Authorization": "Bearer wrong"}, 401, None, "invalid_api_key"),
    ("key-wrong-scheme", "POST", TEXT, text(), {"Authorization": f"Basic {API_KEY}"}, 401, None, "invalid_api_key"),
    ("key-prefix", "POST", TEXT, text(), {"Authorization": f"Bearer {API_KEY[:-1]}"}, 401, None, "invalid_api_key"),
    ("metrics-without-key", "GET", "/metrics", None, {}, 401, None, "invalid_api_key"),
    ("models-without-key", "GET", "/v1/models", None, {}, 401, None, "invalid_api_key"),
    ("wrong-method", "GET", CHAT, None, KEY, 405, None, "method_not_allowed"),
    ("unknown-route", "GET", "/v1/engines", None, KEY, 404, None, "not_found"),
    ("body-too-large", "POST", TEXT, text(prompt="x" * (MAX_BODY + 1)), KEY, 413, None, "request_too_large"),
    (
        "body-text-plain",
        "POST",
        CHAT,
        chat(),
        {**KEY, "Content-Type": "text/plain"},
        415,
        None,
        "unsupported_media_type",
    ),
    (
        "body-form",
        "POST",
        TEXT,
        b"model=tiny&prompt=hi",
        {**KEY, "Content-Type": "application/x-www-form-urlencoded"},
        415,
        None,
        "unsupported_media_type",
    ),
    ("host-rebound", "POST", TEXT, text(), {**KEY, "Host": "evil.example:8000"}, 400, None, "host_not_allowed"),
]


@pytest.mark.parametrize("case", INVALID, ids=[case[0] for case in INVALID])
def test_invalid_requests_get_openai_errors(server, case):
    _, method, path, body, headers, status, param, code = case
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = httpx.request(
        method,
        f"{server.base_url}{path}",
        content=content,
        headers={"Content-Type": "application/json", **headers},
        timeout=30,
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(response.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == code
    assert isinstance(error["message"], str) and error["message"]


def test_chunked_body_over_the_limit_is_refused(server):
    def chunks():
        for _ in range(4):
            yield b" " * (MAX_BODY // 2)

    headers = {**KEY, "Content-Type": "application/json"}
    response = httpx.post(f"{server.base_url}{TEXT}", content=chunks(), headers=headers, timeout=30)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_unknown_fields_of_any_type_are_ignored(server):
    body = text(foo={"bar": [1, None]}, logit_bias={}, user="u", metadata=[1], presence_penalty=0)
    response = httpx.post(f"{server.base_url}{TEXT}", json=body, headers=KEY, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_requests_that_ask_for_nothing_unsupported_are_answered(server):
    """tool_choice none or auto with no tools, text-only modalities, an empty message: nothing to refuse."""
    for body in (
        chat(tool_choice="none"),
        chat(tool_choice="auto"),
        chat(modalities=["text"], audio=None),
        chat(messages=[{"role": "system", "content": ""}, USER_HI]),
    ):
        response = httpx.post(f"{server.base_url}{CHAT}", json=body, headers=KEY, timeout=30)
        assert response.status_code == 200, (body, response.text)


def test_server_stays_healthy_after_bad_requests(server, client):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    response = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
    assert response.choices[0].finish_reason in ("stop", "length")


HEAD = f"POST {TEXT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n".encode()
HALF_BODY = HEAD + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b'{"prompt": "The quick'


def raw_exchange(server: ServerProcess, *pieces: bytes, pause: float = 0.0, wait: float = 10.0) -> tuple[bytes, float]:
    """Send `pieces` on one raw connection, `pause` seconds apart until the server answers, then read until it
    closes the connection; returns what it answered and the seconds from connecting to the close."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        started = time.monotonic()
        for piece in pieces:
            sock.sendall(piece)
            if select.select([sock], [], [], pause)[0]:
                break
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer, time.monotonic() - started


def new_log_lines(server: ServerProcess, since: int, expected: str, timeout: float = 10) -> str:
    """The log written after character `since`, once it holds `expected`."""
    deadline = time.monotonic() + timeout
    while expected not in server.log()[since:] and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.log()[since:]


@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param([HEAD[:30]], id="half-sent-headers"),
        pytest.param([HALF_BODY], id="half-sent-body"),
        pytest.param([bytes([byte]) for byte in HEAD], id="headers-dripped-a-byte-at-a-time"),
    ],
)
def test_a_request_not_sent_whole_in_time_gets_408_and_the_connection_closes(server, pieces):
    since = len(server.log())
    answer, seconds = raw_exchange(server, *pieces, pause=4 * READ_TIMEOUT / len(pieces))
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"
    assert READ_TIMEOUT - 0.5 < seconds < READ_TIMEOUT + 3, "the deadline counts from the connection, not per byte"
    log = new_log_lines(server, since, "did not send a whole request")
    assert "did not send a whole request within 2 s; closed" in log and "Traceback" not in log, log


def test_an_idle_connection_is_closed_without_an_answer(server):
    answer, seconds = raw_exchange(server)
    assert answer == b"" and seconds < READ_TIMEOUT + 3


def test_a_client_leaving_mid_body_gets_one_log_line(server):
    since = len(server.log())
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(HALF_BODY)
            time.sleep(0.2)
    log = new_log_lines(server, since, "disconnected before sending its whole request")
    assert log.count("disconnected before sending its whole request") >= 1, log
    assert "Traceback" not in log and len(log.splitlines()) <= 3, log


def test_a_one_mebibyte_header_gets_431_not_a_reset(server):
    request = HEAD.replace(b"POST", b"GET", 1) + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    answer, _ = raw_exchange(server, request)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "headers_too_large"
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def long_request(**fields) -> dict:
    """A request that runs for seconds: almost the whole long context, EOS ignored, no drafting."""
    return text(
        **{
            "prompt": "The quick brown fox",
            "max_tokens": LONG_CONTEXT - 100,
            "ignore_eos": True,
            "temperature": 0,
            "quickdraft": {"drafter": "none"},
            **fields,
        }
    )


def wait_for_idle(server: ServerProcess, timeout: float = 20) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = server.metrics()
        if metrics["quickdraft_num_requests_running"] == 0 and metrics["quickdraft_num_requests_waiting"] == 0:
            return metrics
        time.sleep(0.05)
    raise AssertionError(f"the server still had requests after {timeout} s: {metrics}")


def test_disconnect_mid_stream_cancels_the_generation(server):
    aborted = 'quickdraft_request_success_total{finished_reason="abort"}'
    before = server.metrics()[aborted]
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.base_url}{TEXT}", json=long_request(stream=True), headers=KEY) as response:
            assert response.status_code == 200
            first = next(line for line in response.iter_lines() if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
    metrics = wait_for_idle(server)
    assert metrics[aborted] == before + 1
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_client_giving_up_on_a_whole_response_cancels_the_generation(server):
    aborted = 'quickdraft_request_success_total{finished_reason="abort"}'
    before = server.metrics()[aborted]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}{TEXT}", json=long_request(), headers=KEY, timeout=httpx.Timeout(10, read=0.2))
    assert wait_for_idle(server)[aborted] == before + 1


def test_burst_beyond_the_queue_gets_429_and_nothing_hangs(server):
    rejected = 'quickdraft_request_rejected_total{reason="queue_full"}'
    before = server.metrics()[rejected]
    burst = 3 * (MAX_QUEUE + 1)
    tokens = 400  # about 0.3 s a request here: the burst arrives while the first ones still run
    with ThreadPoolExecutor(burst) as pool:
        responses = list(
            pool.map(
                lambda _: httpx.post(
                    f"{server.base_url}{TEXT}", json=long_request(max_tokens=tokens), headers=KEY, timeout=120
                ),
                range(burst),
            )
        )
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 1 and statuses.count(429) >= 1
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "queue_full" and response.headers["Retry-After"] == "1"
        else:
            assert response.json()["usage"]["completion_tokens"] == tokens
    assert wait_for_idle(server)[rejected] == before + statuses.count(429)


def valid_response(kind: str, stream: bool, response: httpx.Response) -> bool:
    """A complete, well-formed chat or text completion (whole or streamed)."""
    if response.status_code != 200:
        return False
    if not stream:
        body = response.json()
        return body["object"] in ("chat.completion", "text_completion") and body["choices"][0]["finish_reason"] in (
            "stop",
            "length",
        )
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    return (
        lines[-1] == "[DONE]"
        and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        and not any("error" in c for c in chunks)
    )


def test_bounded_load_test_has_no_errors(server):
    clients, requests_each = 8, 10

    def one_client(index: int) -> list[tuple[int, bool]]:
        results = []
        with httpx.Client(base_url=server.base_url, headers=KEY, timeout=120) as http:
            for request in range(requests_each):
                kind, stream = ("chat", "text")[(index + request) % 2], request % 3 == 0
                body = (
                    chat(max_tokens=12, stream=stream, seed=request)
                    if kind == "chat"
                    else text(max_tokens=12, stream=stream, seed=request)
                )
                response = http.post(CHAT if kind == "chat" else TEXT, json=body)
                results.append((response.status_code, valid_response(kind, stream, response)))
        return results

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        results = [result for client_results in pool.map(one_client, range(clients)) for result in client_results]
    assert len(results) == clients * requests_each
    assert [status for status, _ in results if status >= 500] == []
    assert all(valid for _, valid in results), [status for status, _ in results]
    assert time.monotonic() - started < 300
    wait_for_idle(server)


def test_sigterm_finishes_in_flight_work_and_exits_zero(tiny_dirs, tmp_path):
    # a grace period far longer than the request, so a slow machine still finishes it (the 10 s default did not on one)
    server = start_server(
        tiny_dirs["llama-long"],
        tmp_path / "server.log",
        "--runtime",
        "hf",
        "--threads",
        "1",
        "--shutdown-timeout",
        "120",
    )
    lines: list[str] = []
    request = long_request(model=str(tiny_dirs["llama-long"]), stream=True, max_tokens=1000)

    def stream_one() -> None:
        with httpx.stream("POST", f"{server.base_url}{TEXT}", json=request, timeout=60) as response:
            lines.extend(line for line in response.iter_lines() if line)

    reader = threading.Thread(target=stream_one)
    reader.start()
    while not lines and reader.is_alive():
        time.sleep(0.01)
    assert server.stop(timeout=150) == 0, server.log()
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert not any("error" in event for event in events), events[-1]  # a cancelled stream ends with an error
    finishes = [c["finish_reason"] for event in events for c in event.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["length"]  # the whole 1000 tokens were written: the work finished, it was not cut
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.base_url}/health", timeout=2)


def test_streams_outliving_the_grace_period_end_with_an_error_and_done(tiny_dirs, tmp_path):
    """SIGTERM with a 2 s grace period: a running stream and a queued one (it already has its role chunk) both
    end with an error event and [DONE], not cut mid-text; the server exits 0 with no traceback in its log."""
    server = start_server(
        tiny_dirs["llama-long"], tmp_path / "server.log", "--runtime", "hf", "--threads", "1", "--shutdown-timeout", "2"
    )
    streams: dict[str, list[str]] = {"running": [], "queued": []}
    bodies = {
        "running": (TEXT, long_request(model=str(tiny_dirs["llama-long"]), stream=True, max_tokens=3500)),
        "queued": (CHAT, {"model": str(tiny_dirs["llama-long"]), "messages": MESSAGES, "stream": True}),
    }

    def stream_one(name: str) -> None:
        path, body = bodies[name]
        with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=60) as response:
            streams[name].extend(line for line in response.iter_lines() if line)

    readers = {name: threading.Thread(target=stream_one, args=(name,)) for name in streams}
    readers["running"].start()
    while len(streams["running"]) < 3 and readers["running"].is_alive():
        time.sleep(0.01)
    readers["queued"].start()
    while not streams["queued"] and readers["queued"].is_alive():
        time.sleep(0.01)
    assert server.stop(timeout=30) == 0, server.log()
    for name, reader in readers.items():
        reader.join(timeout=30)
        lines = streams[name]
        assert lines[-1] == "data: [DONE]", (name, lines[-3:])
        error = json.loads(lines[-2].removeprefix("data: "))["error"]
        assert error["code"] == "cancelled" and "shutting down" in error["message"], (name, error)
    assert "Traceback" not in server.log()


@pytest.mark.real_model
def test_real_model_stream_is_identical_to_the_engine(tmp_path, builtin_model_dir):
    model_dir = builtin_model_dir("smollm2-135m-instruct")
    messages = [
        {"role": "user", "content": "Rewrite in the past tense: The cat sits on the mat and looks at the bird."}
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's thread count, so both sides run the same kernels
    try:
        target = load_model_dir(model_dir, runtime="hf")
        expected = Engine(target, SpecConfig(drafter="ngram", k=4)).generate(
            messages, SamplingParams(max_new_tokens=48), chat=True
        )
    finally:
        torch.set_num_threads(threads)
    server = start_server(
        model_dir,
        tmp_path / "server.log",
        "--runtime",
        "hf",
        "--k",
        "4",
        "--threads",
        "1",
        "--served-model-name",
        "smollm2",
    )
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        chunks = list(
            client.chat.completions.create(
                model="smollm2", messages=messages, max_tokens=48, temperature=0, stream=True
            )
        )
    finally:
        assert server.stop() == 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert chunks[-1].model_extra["speculation"]["accepted_tokens"] == expected.stats.accepted_tokens
