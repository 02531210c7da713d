"""`quickdraft bench-serve`: its figures on known inputs, its SSE reading, and runs against a real
`quickdraft serve` on a tiny model (results, report, plots, --extra-body, --combine, one-line errors)."""

import contextlib
import gc
import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from quickdraft.bench.serve import load as load_module
from quickdraft.bench.serve.client import RequestResult, StreamReader
from quickdraft.bench.serve.load import LevelRun, api_base
from quickdraft.bench.serve.results import mask_api_key
from quickdraft.bench.serve.summary import percentile, summarize
from quickdraft.cli import main
from quickdraft.errors import UsageError
from tests.server_process import free_port, start_server

API_KEY = "bench-key-456"
PROMPTS = [
    {"question_id": 1, "category": "writing", "turns": ["The quick brown fox", "and then?"]},
    {"question_id": 2, "category": "writing", "turns": ["Once upon a time"]},
    {"question_id": "c1", "category": "coding", "turns": ["def add(a, b):"]},
]
NO_DRAFTER = '{"quickdraft": {"drafter": "none"}}'
PLOT_PIXELS = (450, 1100)  # rows, columns: figsize (11, 4.5) at 100 dpi


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


def test_the_url_is_an_api_base_and_the_key_is_masked():
    assert api_base("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_base("https://api.example.com/openai/v1/") == "https://api.example.com/openai/v1"
    assert api_base("http://host:1/v1/chat/completions") == "http://host:1/v1"
    for bad in ("127.0.0.1:8000", "http://host:port/v1", "ftp://host/v1"):
        with pytest.raises(UsageError, match="--url must be an http"):
            api_base(bad)
    assert (
        mask_api_key("quickdraft bench-serve --api-key sk-1 --url u")
        == "quickdraft bench-serve --api-key MASKED --url u"
    )
    assert mask_api_key("quickdraft bench-serve --api-key=sk-1") == "quickdraft bench-serve --api-key=MASKED"


def quickdraft(*args: str) -> tuple[int, str, str]:
    """The CLI in this process (no second torch import): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    log = tmp_path_factory.mktemp("bench-serve-server") / "server.log"
    extra = ("--runtime", "hf", "--threads", "1", "--drafter", "ngram", "--k", "4", "--served-model-name", "tiny")
    process = start_server(tiny_dirs["llama"], log, *extra, api_key=API_KEY)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-serve-prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(prompt) + "\n" for prompt in PROMPTS))
    return path


@pytest.fixture(scope="module")
def runs(server, prompts_file, tmp_path_factory):
    """Two runs at concurrency 1,2 on the server: its speculation, then --extra-body drafter none."""
    root = tmp_path_factory.mktemp("bench-serve-runs")
    measured = {}
    for name, extra in (("speculation", []), ("none", ["--extra-body", NO_DRAFTER, "--label", "no drafter"])):
        argv = ["bench-serve", "--url", server.base_url, "--api-key", API_KEY, "--prompts", str(prompts_file)]
        argv += ["--per-category", "2", "--concurrency", "1,2", "--max-tokens", "12", *extra, "--out", str(root / name)]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.argv", ["quickdraft", *argv])  # what provenance records as the command line
            code, stdout, stderr = quickdraft(*argv)
        assert code == 0, stderr
        measured[name] = (root / name, stdout, stderr)
    return measured


def test_levels_run_with_the_garbage_collector_off(server, prompts_file, tmp_path, monkeypatch):
    """A collection pausing the client mid-level would count into the endpoint's latencies: each level runs with
    the collector off, and it is back on once the run ends."""
    collector_on_during_levels = []
    run_level = load_module._run_level

    async def watched(client, config, endpoint, concurrency):
        collector_on_during_levels.append(gc.isenabled())
        return await run_level(client, config, endpoint, concurrency)

    monkeypatch.setattr(load_module, "_run_level", watched)
    argv = ["bench-serve", "--url", server.base_url, "--api-key", API_KEY, "--prompts", str(prompts_file)]
    code, _, stderr = quickdraft(
        *argv, "--per-category", "1", "--concurrency", "1,2", "--max-tokens", "4", "--out", str(tmp_path / "run")
    )
    gc.unfreeze()  # what the levels froze goes back to the collector
    assert code == 0, stderr
    assert collector_on_during_levels == [False, False] and gc.isenabled()


def test_the_load_generator_needs_neither_torch_nor_transformers(server, prompts_file, tmp_path):
    """A person measuring a provider runs `bench-serve` against a remote endpoint: it neither imports the model
    stack (seconds of start-up on every run) nor needs it installed, and `quickdraft --help` does not either."""
    blocked = "import sys, runpy; sys.modules.update(torch=None, transformers=None); "
    run = "sys.argv = ['quickdraft', *sys.argv[1:]]; runpy.run_module('quickdraft', run_name='__main__')"
    argv = ["bench-serve", "--url", server.base_url, "--api-key", API_KEY, "--prompts", str(prompts_file)]
    argv += ["--per-category", "1", "--concurrency", "1", "--max-tokens", "4", "--out", str(tmp_path / "run")]
    for words, expected in ((argv, "| concurrency | TTFT p50 ms |"), (["--help"], "bench-serve")):
        done = subprocess.run(
            [sys.executable, "-c", blocked + run, *words], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout


def assert_plots_drawn(out):
    for name in ("latency.png", "throughput.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
        assert plt.imread(out / name).shape[:2] == PLOT_PIXELS


def test_a_run_writes_results_report_and_plots(runs, server):
    out, stdout, stderr = runs["speculation"]
    results = json.loads((out / "results.json").read_text())
    assert results["label"] == f"127.0.0.1:{server.port} tiny"  # the model from GET /v1/models
    assert results["endpoint"] == {"base_url": f"{server.base_url}/v1", "model": "tiny"}
    assert results["config"]["prompt_ids"] == [1, 2, "c1"]  # --per-category 2: both writing prompts, one coding
    assert results["config"]["requests_per_level"] == [3, 3]  # max(C, 3 prompts)
    assert API_KEY not in (out / "results.json").read_text()
    assert "--api-key MASKED" in results["provenance"]["command_line"]
    assert results["warmup"]["error"] is None
    for level, concurrency in zip(results["levels"], (1, 2)):
        requests = [RequestResult.from_dict(record) for record in level["requests"]]
        assert level["concurrency"] == concurrency
        assert [r.prompt_id for r in requests] == [1, 2, "c1"]  # in order, each once
        assert all(r.ok and r.status == 200 and r.output_tokens > 0 and r.tokens_from_usage for r in requests)
        assert all(r.finish_reason in ("stop", "length") and r.ttft <= r.e2e for r in requests)
    for summary in results["summary"]["levels"]:
        assert summary["failed"] == 0 and summary["identical"] == 1.0 and summary["compared"] == 3
        assert summary["output_tokens_per_second"] > 0 and summary["ttft_p50"] > 0
    report = (out / "report.md").read_text()
    assert report.startswith(f"# bench-serve: 127.0.0.1:{server.port} tiny")
    assert "| concurrency | TTFT p50 ms |" in report and "| 2 | 3 | 0 |" in report and "100% of 3" in report
    assert "| concurrency | TTFT p50 ms |" in stdout and "concurrency 2: 3 requests in" in stderr
    assert_plots_drawn(out)


def test_the_extra_body_reaches_the_server(runs):
    def drafters(name: str) -> set[str]:
        results = json.loads((runs[name][0] / "results.json").read_text())
        return {request["speculation"]["drafter"] for level in results["levels"] for request in level["requests"]}

    assert drafters("speculation") == {"ngram"}
    assert drafters("none") == {"none"}
    assert json.loads((runs["none"][0] / "results.json").read_text())["label"] == "no drafter"


def test_combine_puts_runs_side_by_side(runs, tmp_path):
    files = [str(runs[name][0] / "results.json") for name in ("speculation", "none")]
    code, stdout, stderr = quickdraft("bench-serve", "--combine", *files, "--out", str(tmp_path))
    assert code == 0, stderr
    report = (tmp_path / "report.md").read_text()
    speculation = json.loads((runs["speculation"][0] / "results.json").read_text())
    assert f"| concurrency | {speculation['label']} | no drafter |" in report
    first_row = next(line for line in stdout.splitlines() if line.startswith("| 1 |"))
    assert first_row.count("x)") == 2 and "(1.00x)" in first_row.split("|")[2]  # the first run against itself
    assert "Identical to the run's first level" in report
    assert_plots_drawn(tmp_path)


def test_combine_compares_rounds_round_by_round(runs, tmp_path):
    """Runs that share a label are rounds: each round of a configuration is compared with the first configuration's
    same round, and the table gives the median and range of those ratios. Round 2 here is the same pair of runs made
    2x (speculation) and 3x (none) as fast: its ratio is 1.5 times round 1's."""

    def written(name: str, speedup: float, round_: int) -> str:
        results = json.loads((runs[name][0] / "results.json").read_text())
        for level in results["summary"]["levels"]:
            level["output_tokens_per_second"] *= speedup
        path = tmp_path / f"{name}-{round_}.json"
        path.write_text(json.dumps(results))
        return str(path)

    files = [
        written("speculation", 1.0, 1),
        written("none", 1.0, 1),
        written("speculation", 2.0, 2),
        written("none", 3.0, 2),
    ]
    code, stdout, stderr = quickdraft("bench-serve", "--combine", *files, "--out", str(tmp_path / "out"))
    assert code == 0, stderr
    report = (tmp_path / "out" / "report.md").read_text()
    label = json.loads(Path(files[0]).read_text())["label"]
    assert f"| concurrency | {label} (2 rounds) | no drafter (2 rounds) |" in report
    rounds = report[report.index("## Over rounds") :].split("\n\n")[1]
    for level in json.loads(Path(files[0]).read_text())["summary"]["levels"]:
        concurrency, speculation = level["concurrency"], level["output_tokens_per_second"]
        none = next(
            other["output_tokens_per_second"]
            for other in json.loads(Path(files[1]).read_text())["summary"]["levels"]
            if other["concurrency"] == concurrency
        )
        ratio = none / speculation
        row = next(line for line in rounds.splitlines() if line.startswith(f"| {concurrency} |"))
        assert f"{1.5 * speculation:.1f} (1.00x, 1.00-1.00x)" in row  # the median of 1x and 2x
        assert f"{2 * none:.1f} ({1.25 * ratio:.2f}x, {ratio:.2f}-{1.5 * ratio:.2f}x)" in row
    code, _, stderr = quickdraft("bench-serve", "--combine", *files[:2], "--out", str(tmp_path / "single"))
    assert code == 0, stderr
    assert "## Over rounds" not in (tmp_path / "single" / "report.md").read_text()  # no label repeats


def test_merge_joins_a_configurations_levels_measured_apart(runs, tmp_path):
    """serve_sweep.sh measures a level at a time, alternating configurations: one run's levels 1 and 2 written as
    two runs, then merged, give that run's own summary (the first level still the exactness reference); runs of
    another configuration are refused."""
    whole = json.loads((runs["speculation"][0] / "results.json").read_text())
    parts = []
    for i, level in enumerate(whole["levels"]):
        part = whole | {"levels": [level], "config": whole["config"] | {"concurrency": [level["concurrency"]]}}
        part["summary"] = {"levels": [whole["summary"]["levels"][i]]}
        if i:  # a later level measured alone compared its outputs with its own, not with level 1's
            part["levels"][0] = level | {"requests": [r | {"text": r["text"] + "!"} for r in level["requests"]]}
        parts.append(tmp_path / f"part-{i}.json")
        parts[-1].write_text(json.dumps(part))
    code, stdout, stderr = quickdraft("bench-serve", "--merge", *map(str, parts), "--out", str(tmp_path / "merged"))
    assert code == 0, stderr
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["config"]["concurrency"] == whole["config"]["concurrency"] == [1, 2]
    first, second = merged["summary"]["levels"]
    assert first == whole["summary"]["levels"][0]
    assert second["identical"] == 0.0 and second["compared"] > 0  # the changed texts differ from level 1's
    expected = whole["summary"]["levels"][1] | {k: second[k] for k in ("identical", "differing_prompts")}
    assert second == expected
    assert_plots_drawn(tmp_path / "merged")
    other = json.loads(parts[1].read_text()) | {"label": "another configuration"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    message = one_line_error(
        ["bench-serve", "--merge", str(parts[0]), str(tmp_path / "other.json"), "--out", str(tmp_path / "x")]
    )
    assert "--merge joins runs of one configuration" in message


def one_line_error(args: list[str]) -> str:
    code, _, stderr = quickdraft(*args)
    assert code != 0 and "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("quickdraft: error: ")]
    assert len(errors) == 1 and len(stderr.strip().splitlines()) == 1, stderr
    return errors[0]


@pytest.mark.parametrize(
    "case, message",
    [
        ("unreachable", "no answer from http://127.0.0.1:"),
        ("wrong key", "refused the API key (HTTP 401"),
        ("unknown model", "does not exist here"),
        ("bad extra body", "--extra-body is not valid JSON"),
        ("extra body not an object", "--extra-body must be a JSON object"),
        ("missing prompts", "cannot read dataset"),
        ("bad concurrency", "--concurrency takes positive integers"),
        ("no prompts per category", "--per-category must be > 0"),
    ],
)
def test_bad_input_gives_one_line_error(server, prompts_file, tmp_path, case, message):
    url, key, prompts, extra = server.base_url, API_KEY, str(prompts_file), []
    if case == "unreachable":
        url = f"http://127.0.0.1:{free_port()}"
    if case == "wrong key":
        key = "wrong"
    if case == "unknown model":
        extra = ["--model", "nope"]
    if case == "bad extra body":
        extra = ["--extra-body", "{not json"]
    if case == "extra body not an object":
        extra = ["--extra-body", "[1]"]
    if case == "missing prompts":
        prompts = str(tmp_path / "missing.jsonl")
    if case == "bad concurrency":
        extra = ["--concurrency", "1,zero"]
    if case == "no prompts per category":
        extra = ["--per-category", "0"]
    args = ["bench-serve", "--url", url, "--api-key", key, "--prompts", prompts, "--max-tokens", "4", *extra]
    assert message in one_line_error([*args, "--timeout", "30", "--out", str(tmp_path / "out")])


def test_combine_refuses_a_file_that_is_no_results_json(tmp_path):
    stray = tmp_path / "other.json"
    stray.write_text('{"label": "x"}')
    assert "is not a bench-serve results.json" in one_line_error(
        ["bench-serve", "--combine", str(stray), "--out", str(tmp_path / "out")]
    )
