"""`quickdraft bench-serve`: its figures on known inputs and its SSE reading."""

from dataclasses import replace

import pytest

from quickdraft.bench.serve.client import RequestResult, StreamReader
from quickdraft.bench.serve.load import LevelRun, api_base
from quickdraft.bench.serve.summary import percentile, summarize
from quickdraft.errors import UsageError


def request(prompt_id=1, text="abc", chunk_times=(0.1, 0.2, 0.4), e2e=0.5, tokens=5, error=None) -> RequestResult:
    return RequestResult(
        prompt_id=prompt_id,
        started=0.0,
        status=200 if error is None else 500,
        error=error,
        text=text,
        finish_reason="length",
        output_tokens=tokens,
        tokens_from_usage=True,
        chunk_times=tuple(chunk_times),
        e2e=e2e,
        speculation=None,
    )


def test_percentile_interpolates_between_closest_ranks():
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([4, 1, 3, 2], 50) == 2.5  # unsorted input
    tens = list(range(1, 11))
    assert percentile(tens, 0) == 1 and percentile(tens, 100) == 10
    assert percentile(tens, 90) == pytest.approx(9.1)  # rank 0.9 * 9 = 8.1: 9 + 0.1 * (10 - 9)
    assert percentile(tens, 99) == pytest.approx(9.91)


def test_a_stream_with_several_tokens_per_chunk_and_a_usage_chunk():
    lines = [
        ('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', 0.05),
        ("", 0.05),
        (": a comment, as some providers send to keep the connection open", 0.06),
        ("", 0.06),
        ('data: {"choices":[{"delta":{"content":"The cat"}}]}', 0.2),  # two tokens in one chunk
        ("", 0.2),
        ('data:{"choices":[{"delta":{"content":" sat on"}}]}', 0.5),  # no space after the colon: allowed
        ("", 0.5),
        ('data: {"choices":[{"delta":{"content":" the mat"},', 0.9),  # one event over two data lines
        ('data:  "finish_reason":"stop"}],"speculation":{"drafter":"ngram"}}', 0.9),
        ("", 0.9),
        ('data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6}}', 1.0),
        ("", 1.0),
        ("data: [DONE]", 1.0),
        ("", 1.0),
    ]
    reader = StreamReader()
    for line, at in lines:
        reader.feed_line(line, at)
    result = reader.result(prompt_id="p", started=0.0, status=200, e2e=1.2)
    assert reader.done and result.ok
    assert result.text == "The cat sat on the mat"
    assert result.chunk_times == (0.2, 0.5, 0.9)  # the empty role delta is no token
    assert result.finish_reason == "stop" and result.speculation == {"drafter": "ngram"}
    assert result.output_tokens == 6 and result.tokens_from_usage
    assert result.ttft == 0.2
    assert result.inter_token_latencies == pytest.approx([0.3, 0.4])
    assert result.tpot == pytest.approx((1.2 - 0.2) / (6 - 1))  # per token, not per chunk


def test_without_usage_tokens_are_counted_chunks_and_an_error_event_fails_the_request():
    reader = StreamReader()
    for line, at in [('data: {"choices":[{"delta":{"content":"a"}}]}', 0.1), ("", 0.1)]:
        reader.feed_line(line, at)
    reader.flush(0.2)
    counted = reader.result(prompt_id=1, started=0.0, status=200, e2e=0.2)
    assert counted.output_tokens == 1 and not counted.tokens_from_usage and counted.tpot is None
    reader.feed_line('data: {"error": {"message": "generation failed: out of memory"}}', 0.3)
    reader.flush(0.3)
    failed = reader.result(prompt_id=1, started=0.0, status=200, e2e=0.3)
    assert not failed.ok and failed.error == "error event: generation failed: out of memory"


def test_level_figures_on_known_requests():
    reference = LevelRun(1, 1.0, (request(1, "same"), request(2, "two")))
    level = LevelRun(
        4,
        2.0,  # wall seconds
        (
            request(1, "same", chunk_times=(0.1, 0.3), e2e=0.5, tokens=5),
            request(2, "changed", chunk_times=(2.0, 2.5), e2e=3.0, tokens=3),  # TTFT over the 1 s target
            request(1, "same", chunk_times=(0.3,), e2e=0.3, tokens=1),  # one token: no TPOT, no ITL
            request(2, "", chunk_times=(), e2e=0.1, tokens=0, error="HTTP 500: boom"),
        ),
    )
    first, figures = summarize([reference, level], temperature=0, ttft_target=1.0)
    assert first.identical == 1.0 and first.compared == 2
    assert (figures.requests, figures.failed, figures.output_tokens) == (4, 1, 9)
    assert figures.output_tokens_per_second == pytest.approx(9 / 2.0)
    assert figures.requests_per_second == pytest.approx(3 / 2.0)
    assert figures.goodput == pytest.approx(2 / 2.0)  # TTFTs 0.1 and 0.3 are within 1 s, 2.0 is not
    assert figures.ttft_p50 == pytest.approx(0.3)
    assert figures.tpot_p50 == pytest.approx(((0.5 - 0.1) / 4 + (3.0 - 2.0) / 2) / 2)
    assert figures.itl_p50 == pytest.approx(0.35)  # gaps 0.2 and 0.5 pooled
    assert figures.e2e_p99 == pytest.approx(0.5 + 0.98 * (3.0 - 0.5))
    assert figures.identical == pytest.approx(2 / 3) and figures.compared == 3
    assert figures.differing_prompts == (2,)


def test_outputs_are_compared_at_temperature_zero_only():
    levels = [LevelRun(1, 1.0, (request(1, "a"),)), LevelRun(2, 1.0, (request(1, "b"),))]
    assert [s.identical for s in summarize(levels, temperature=0.7, ttft_target=1.0)] == [None, None]
    assert [s.identical for s in summarize(levels, temperature=0, ttft_target=1.0)] == [1.0, 0.0]
    failed_first = [replace(levels[0], requests=(request(1, "", error="timed out after 5 s"),)), levels[1]]
    assert summarize(failed_first, temperature=0, ttft_target=1.0)[1].compared == 0  # no reference: not compared


def test_the_url_is_an_api_base():
    assert api_base("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_base("https://api.example.com/openai/v1/") == "https://api.example.com/openai/v1"
    assert api_base("http://host:1/v1/chat/completions") == "http://host:1/v1"
    for bad in ("127.0.0.1:8000", "http://host:port/v1", "ftp://host/v1"):
        with pytest.raises(UsageError, match="--url must be an http"):
            api_base(bad)
