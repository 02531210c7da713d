"""A real `quickdraft serve` on the native runtime serving many streams at once (--max-batch 8).

The official `openai` client streams 8 greedy requests at the same moment: each one's text equals the
engine's output for that request alone; a short request sent while a long one runs gets its first token
before the long one ends; /metrics shows steps that batched several sequences.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.models.loading import load_model_dir
from tests.server_process import start_server

TOPICS = ["the sea", "a red fox", "bread", "rain at night", "old trains", "a chess game", "winter", "music"]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    log = tmp_path_factory.mktemp("server-batch") / "server.log"
    process = start_server(
        tiny_dirs["llama-long"],
        log,
        "--threads",
        "1",
        "--drafter",
        "ngram",
        "--k",
        "auto",
        "--max-batch",
        "8",
        "--served-model-name",
        "tiny",
    )
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def stream_text(client, prompt: str, max_tokens: int, started_event=None, **extra) -> tuple[str, float, float]:
    """(text, perf_counter() at the first content, at the end) of one streamed greedy completion."""
    first, pieces = None, []
    stream = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True, extra_body=extra
    )
    for chunk in stream:
        text = chunk.choices[0].text if chunk.choices else ""
        if text and first is None:
            first = time.perf_counter()
            if started_event is not None:
                started_event.set()
        pieces.append(text)
    return "".join(pieces), first, time.perf_counter()


def test_eight_streams_at_once_each_equal_the_request_alone(server, client, tiny_dirs):
    prompts = [f"Write about {topic}:" for topic in TOPICS]
    barrier = threading.Barrier(len(prompts))

    def one(prompt: str) -> str:
        barrier.wait()
        return stream_text(client, prompt, 48)[0]

    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(one, prompts))
    target = load_model_dir(tiny_dirs["llama-long"], runtime="native", dtype="int8", name="tiny")
    engine = Engine(target, SpecConfig("none", k=0))
    assert texts == [engine.generate(p, SamplingParams(max_new_tokens=48)).text for p in prompts]
    samples = server.metrics()
    assert samples["quickdraft_batch_size_count"] > samples['quickdraft_batch_size_bucket{le="1"}']  # batched steps
    assert samples["quickdraft_inter_token_latency_seconds_count"] > 0


def test_a_short_request_during_a_long_one_gets_its_first_token_first(server, client):
    long_started, long_done = threading.Event(), {}

    def long_request() -> None:
        long_done["at"] = stream_text(client, "Tell a long story", 1500, long_started, ignore_eos=True)[2]

    thread = threading.Thread(target=long_request)
    thread.start()
    assert long_started.wait(60)
    _, first, _ = stream_text(client, "Hi", 4)
    thread.join()
    assert first is not None and first < long_done["at"]
