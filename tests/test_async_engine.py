"""The asyncio API: concurrent streams through one engine thread, each equal to its request alone."""

import asyncio
import threading

import pytest

from quickdraft.async_engine import AsyncEngine, QueueFull
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine, Finished, TextDelta
from quickdraft.models.loading import load_model_dir

PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):", "a b c a b c a b"]
PARAMS = SamplingParams(max_new_tokens=24, ignore_eos=True)


@pytest.fixture
def engine(tiny_dirs):
    target = load_model_dir(tiny_dirs["llama"], runtime="native", dtype="int8", name="llama")
    return Engine(target, SpecConfig("ngram", k=3), max_batch=4)


async def collect(async_engine: AsyncEngine, prompt_ids: list[int]) -> tuple[str, Finished]:
    text, finished = "", None
    async for event in async_engine.stream(prompt_ids, PARAMS):
        if isinstance(event, TextDelta):
            text += event.text
        else:
            finished = event
    return text, finished


async def stream_all(async_engine: AsyncEngine, prompts: list[list[int]]) -> list[tuple[str, Finished]]:
    """Start the engine thread, stream every prompt at once, stop the thread: each prompt's text and `Finished`."""
    async_engine.start()
    try:
        return await asyncio.gather(*(collect(async_engine, p) for p in prompts))
    finally:
        async_engine.stop(timeout=10)


def test_concurrent_streams_each_equal_the_request_alone(engine):
    prompts = [engine.encode(p) for p in PROMPTS]
    expected = [engine.generate(p, PARAMS) for p in prompts]
    results = asyncio.run(stream_all(AsyncEngine(engine, max_waiting=0), prompts))
    for (text, finished), alone in zip(results, expected):
        assert finished.token_ids == alone.token_ids and text == alone.text


def test_a_full_queue_refuses_at_once_and_leaving_early_cancels(engine):
    prompt = engine.encode(PROMPTS[0])
    async_engine = AsyncEngine(engine, max_waiting=0)

    async def main():
        async_engine.start()
        try:
            streams = [async_engine.stream(prompt, PARAMS) for _ in range(4)]
            firsts = await asyncio.gather(*(anext(s) for s in streams))  # four running: the batch is full
            with pytest.raises(QueueFull):
                await anext(async_engine.stream(prompt, PARAMS))
            for stream in streams:
                await stream.aclose()  # leaving early cancels the job
            for _ in range(100):
                if async_engine.load() == (0, 0):
                    break
                await asyncio.sleep(0.05)
            return firsts, async_engine.load()
        finally:
            async_engine.stop(timeout=10)

    firsts, load = asyncio.run(main())
    assert all(isinstance(e, TextDelta) for e in firsts) and load == (0, 0)


def test_a_step_hands_its_events_to_the_event_loop_in_one_call(engine):
    """Each call into the event loop from the engine thread wakes the loop and takes the GIL: a step's events for
    four streams go in one call, not one per event."""
    prompts = [engine.encode(p) for p in PROMPTS]
    steps, calls = [], []

    class Counting(AsyncEngine):
        def _on_step(self, sequences: int, rows: int) -> None:
            steps.append(sequences)

    async_engine = Counting(engine, max_waiting=0)

    async def main():
        loop = asyncio.get_running_loop()
        call = loop.call_soon_threadsafe

        def counted(*args, **kwargs):
            if threading.current_thread().name == "quickdraft-engine":
                calls.append(args)
            return call(*args, **kwargs)

        loop.call_soon_threadsafe = counted
        return await stream_all(async_engine, prompts)

    results = asyncio.run(main())
    assert all(finished is not None for _, finished in results)
    assert max(steps) == len(PROMPTS)  # the four ran together
    assert len(calls) <= len(steps) + 1
