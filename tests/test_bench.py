"""`quickdraft bench` end to end on tiny random models, plus the dataset loader and the cost model."""

import json
from pathlib import Path

import pytest
from PIL import Image

from quickdraft.bench import prediction
from quickdraft.bench.dataset import load_prompts, select_prompts
from quickdraft.bench.runner import BenchConfig
from quickdraft.bench.summary import BASELINE, HF_BASELINE, OVERALL
from quickdraft.cli import main
from quickdraft.costs import expected_tokens
from quickdraft.errors import UsageError

PROMPTS = [
    {"question_id": 1, "category": "writing", "turns": ["The quick brown fox jumps over the lazy dog. The dog"]},
    {"question_id": 2, "category": "coding", "turns": ["def add(a, b):\n    return a + b\n\nprint(add(1, 2))"]},
    {"question_id": "q3", "category": "coding", "turns": ["Once upon a time there was a small model", "And then?"]},
]
PLOTS = ["speedup_by_category.png", "acceptance_by_position.png", "speedup_vs_k.png"]
MAX_NEW_TOKENS = 8
REPEATS = 2


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def run_bench(tmp_path: Path, model_dir: Path, drafters: str, k: str = "1,2") -> dict:
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    out = tmp_path / "out"
    argv = [
        "bench",
        "--model",
        str(model_dir),
        "--drafters",
        drafters,
        "--ks",
        k,
        "--prompts",
        str(dataset),
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--repeats",
        str(REPEATS),
        "--peers",
        "hf",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def ngram_run(tmp_path_factory, tiny_dirs):
    tmp_path = tmp_path_factory.mktemp("bench")
    return tmp_path / "out", run_bench(tmp_path, tiny_dirs["llama"], "none,ngram")


def test_every_prompt_method_and_repeat_is_measured(ngram_run):
    _, results = ngram_run
    names = [m["name"] for m in results["methods"]]
    assert names == [BASELINE, "qd:ngram k=1", "qd:ngram k=2", HF_BASELINE, "hf:lookup n=4"]
    rows = results["measurements"]
    assert len(rows) == REPEATS * len(PROMPTS) * len(names)
    assert {(r["repeat"], r["prompt"], r["method"]) for r in rows} == {
        (repeat, prompt, name) for repeat in range(REPEATS) for prompt in range(len(PROMPTS)) for name in names
    }
    first_methods = {r["method"] for r in rows if r["order"] == 0}
    assert len(first_methods) > 1  # the order rotates


def test_baseline_is_plain_decoding(ngram_run):
    _, results = ngram_run
    for row in results["measurements"]:
        if row["method"] in (BASELINE, HF_BASELINE):
            assert row["mean_accepted_length"] == 1.0
            assert row["draft_tokens"] == row["accepted_tokens"] == 0
            assert row["target_forwards"] == row["new_tokens"] + (row["finish_reason"] == "stop")
    overall = results["summary"]["groups"][OVERALL]
    assert overall[BASELINE]["tau"] == 1.0
    assert overall[BASELINE]["speedup"]["by_repeat"] == [1.0] * REPEATS
    assert overall[HF_BASELINE]["speedup_vs_hf"]["median"] == 1.0


def test_greedy_outputs_are_identical_to_the_baseline(ngram_run):
    _, results = ngram_run
    for row in results["measurements"]:
        if row["method"] != "hf:lookup n=4":  # transformers' batched verification may flip near-ties
            assert row["identical_to_baseline"] is True, row["method"]
    for name, figures in results["summary"]["groups"][OVERALL].items():
        if name != "hf:lookup n=4":
            assert figures["identical"] == 1.0


def test_counts_add_up(ngram_run):
    _, results = ngram_run
    rows = results["measurements"]
    for row in rows:
        assert 0 < row["new_tokens"] <= MAX_NEW_TOKENS or row["finish_reason"] == "stop"
        assert row["accepted_tokens"] <= row["draft_tokens"]
        if row["method"].startswith("qd:"):
            assert sum(row["accepted_length_histogram"]) == row["steps"] == row["target_forwards"] - 1
            assert sum(row["accepted_by_position"]) == row["accepted_tokens"]
            assert sum(row["drafted_by_position"]) == row["draft_tokens"]
            assert row["draft_seconds"] + row["verify_seconds"] <= row["wall_seconds"]
    groups = results["summary"]["groups"]
    for name in groups[OVERALL]:
        total = sum(r["new_tokens"] for r in rows if r["method"] == name)
        assert groups[OVERALL][name]["new_tokens"] == total
        assert sum(groups[c][name]["new_tokens"] for c in ("writing", "coding")) == total
        assert groups["coding"][name]["prompts"] == 2


def test_speedup_is_the_ratio_of_mean_tokens_per_second(ngram_run):
    _, results = ngram_run
    rows = results["measurements"]

    def mean_rate(method: str, repeat: int) -> float:
        rates = [r["new_tokens"] / r["wall_seconds"] for r in rows if r["method"] == method and r["repeat"] == repeat]
        return sum(rates) / len(rates)

    speedup = results["summary"]["groups"][OVERALL]["qd:ngram k=2"]["speedup"]
    expected = [mean_rate("qd:ngram k=2", r) / mean_rate(BASELINE, r) for r in range(REPEATS)]
    assert speedup["by_repeat"] == pytest.approx(expected)
    assert speedup["min"] <= speedup["median"] <= speedup["max"]


def test_results_carry_provenance_and_costs(ngram_run):
    _, results = ngram_run
    meta = results["meta"]
    assert meta["command_line"] and meta["versions"]["torch"] and meta["dataset"]["sha256"]
    assert "commit" in meta["git"] and meta["machine"]["cpu_count"] >= 1
    assert isinstance(meta["runner"], str) and meta["runner"]  # the class that ran the target
    assert meta["weights"] == {"dense": 9}  # the tiny checkpoint's 2 layers x 4 matrices + output layer
    assert results["verify_cost"]["0"] == 1.0 and set(results["verify_cost"]) == {"0", "1", "2"}
    assert results["cost_context_tokens"] == sorted(p["prompt_tokens"] for p in results["prompts"])[1]
    cost = results["summary"]["costs"]["qd:ngram k=2"]
    assert cost["k"] == 2 and cost["verify_cost"] == results["verify_cost"]["2"]
    assert sum(cost["draft_length_shares"].values()) == pytest.approx(1.0)


def test_report_and_plots_are_written(ngram_run):
    out, results = ngram_run
    report = (out / "report.md").read_text()
    assert "## Overall" in report and "### writing (prompts: 1)" in report and "### coding (prompts: 2)" in report
    assert "dtype float32 (matrices: dense 9)" in report  # auto beside the hf peers runs float32
    for method in results["methods"]:
        assert f"| {method['name']} |" in report
    assert "predicted (i.i.d.)" in report
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        with Image.open(out / name) as image:
            image.verify()
        assert f"]({name})" in report


def test_from_results_rerenders_the_same_report_without_measuring(ngram_run, tmp_path):
    out, _ = ngram_run
    assert main(["bench", "--from-results", str(out / "results.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == (out / "report.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads((out / "results.json").read_text())
    assert all((tmp_path / name).exists() for name in PLOTS)


def test_draft_model_runs_in_quickdraft_and_as_transformers_assistant(tmp_path, tiny_dirs):
    results = run_bench(tmp_path, tiny_dirs["llama"], f"none,{tiny_dirs['llama']}", k="2")
    names = [m["name"] for m in results["methods"]]
    assert names == [BASELINE, "qd:llama k=2", HF_BASELINE, "hf:lookup n=4", "hf:assistant llama"]
    overall = results["summary"]["groups"][OVERALL]
    assert overall["qd:llama k=2"]["acceptance"] == 1.0  # the draft is the target itself
    assert overall["qd:llama k=2"]["identical"] == 1.0
    assert overall["hf:assistant llama"]["tau"] > 1.5


def test_joined_drafters_run_once_under_auto_and_stay_exact(tmp_path, tiny_dirs):
    results = run_bench(tmp_path, tiny_dirs["llama"], f"none,ngram+{tiny_dirs['llama-other']}", k="2,auto")
    names = [m["name"] for m in results["methods"]]
    assert names[:2] == [BASELINE, "qd:ngram+llama-other k=auto"]  # no fixed k for a joined pair
    assert "hf:assistant llama-other" in names
    assert results["summary"]["groups"][OVERALL]["qd:ngram+llama-other k=auto"]["identical"] == 1.0


def test_joined_drafters_without_auto_are_refused_before_loading_models(tmp_path, capsys):
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    code = main(
        [
            "bench",
            "--model",
            str(tmp_path / "no-model"),
            "--drafters",
            "ngram+head",
            "--ks",
            "4",
            "--prompts",
            str(dataset),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    assert "ngram+head joins drafters for --k auto" in capsys.readouterr().err


@pytest.mark.parametrize(
    "lines, expected",
    [
        ([PROMPTS[0], "{not json"], ":2: not valid JSON"),
        ([{"question_id": 1, "category": "writing"}], ":1: missing turns"),
        (
            [PROMPTS[0], {"question_id": 2, "category": "writing", "turns": "hello"}],
            ":2: turns must be a non-empty list",
        ),
        ([{"question_id": 1, "category": "writing", "turns": []}], ":1: turns must be a non-empty list"),
        ([{"question_id": 1.5, "category": "writing", "turns": ["hi"]}], ":1: question_id must be"),
        ([{"question_id": 1, "category": 7, "turns": ["hi"]}], ":1: category must be a non-empty string"),
        (["[1, 2]"], ":1: expected a JSON object"),
        ([PROMPTS[0], PROMPTS[0]], ":2: question_id 1 is already used on line 1"),
        ([], ": no prompts"),
        (["", "  "], ": no prompts"),
    ],
)
def test_malformed_datasets_are_rejected_naming_the_line(tmp_path, lines, expected):
    path = write_jsonl(tmp_path / "prompts.jsonl", lines)
    with pytest.raises(UsageError) as caught:
        load_prompts(path)
    assert str(caught.value).startswith(f"{path}{expected}")
    assert "\n" not in str(caught.value)


def test_cli_reports_a_bad_dataset_in_one_line_before_loading_models(tmp_path, capsys):
    path = write_jsonl(tmp_path / "prompts.jsonl", [PROMPTS[0], "{oops"])
    code = main(
        ["bench", "--model", str(tmp_path / "no-model"), "--prompts", str(path), "--out", str(tmp_path / "out")]
    )
    error = capsys.readouterr().err
    assert code == 2
    assert error.count("\n") == 1 and f"{path}:2: not valid JSON" in error


def test_selection_takes_the_first_prompts_of_each_category(tmp_path):
    prompts = load_prompts(write_jsonl(tmp_path / "prompts.jsonl", PROMPTS))
    assert [p.question_id for p in select_prompts(prompts, limit=1)] == [1, 2]
    assert [p.question_id for p in select_prompts(prompts, categories=["coding"])] == [2, "q3"]
    assert select_prompts(prompts)[2].first_turn == PROMPTS[2]["turns"][0]
    with pytest.raises(UsageError, match="unknown categories math; the dataset has: writing, coding"):
        select_prompts(prompts, categories=["math"])


def test_expected_tokens_per_step():
    assert expected_tokens([0.0] * 4, 4) == 1.0
    assert expected_tokens([1.0] * 4, 4) == 5.0
    assert expected_tokens([0.5] * 2, 2) == pytest.approx(1.75)


def test_predicted_speedups():
    verify_cost = {0: 1.0, 1: 1.2, 2: 1.5}
    assert prediction.predicted_speedup(0.5, 2, 0.1, verify_cost) == pytest.approx(1.75 / (0.2 + 1.5))
    assert prediction.predicted_speedup(0.5, 3, 0.1, verify_cost) is None
    shares = prediction.draft_length_shares(10, [6, 3])  # 4 steps drafted 0 tokens, 3 drafted 1, 3 drafted 2
    assert shares == pytest.approx({0: 0.4, 1: 0.3, 2: 0.3})
    expected_verify = 0.4 * 1.0 + 0.3 * 1.2 + 0.3 * 1.5
    assert prediction.step_mix_speedup(1.4, 0.05, shares, verify_cost) == pytest.approx(1.4 / (0.05 + expected_verify))
    assert prediction.step_mix_speedup(1.4, 0.05, {3: 1.0}, verify_cost) is None


def test_k_list_passes_words_through():
    from quickdraft.commands.arguments import k_list

    assert k_list("1, 2,auto") == [1, 2, "auto"]


def test_auto_dtype_beside_transformers_peers_runs_their_float32_and_int8_is_refused(tmp_path):
    """`--peers hf --dtype auto` used to stop with AttributeError (torch has no dtype 'auto')."""
    dataset = tmp_path / "prompts.jsonl"
    assert BenchConfig(model="m", dataset=dataset, peers=("hf",)).run_dtype == "float32"
    assert BenchConfig(model="m", dataset=dataset).run_dtype == "auto"  # the runtime's default: native int8
    assert BenchConfig(model="m", dataset=dataset, peers=("hf",), dtype="bfloat16").run_dtype == "bfloat16"
    with pytest.raises(UsageError, match="no int8 weights; pass --dtype auto, float32 or bfloat16"):
        BenchConfig(model="m", dataset=dataset, peers=("hf",), dtype="int8")


FAKE_LLAMA_SERVER = '''#!{python}
"""A stand-in for llama-server (no llama.cpp build here): /health, and /completion answering with the prompt's
ids cycled, logging every request to $FAKE_LLAMA_LOG."""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
speculative = "--spec-type" in args


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{{}}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(os.environ["FAKE_LLAMA_LOG"], "a") as log:
            log.write(json.dumps({{"args": args, **body}}) + "\\n")
        time.sleep(0.0 if speculative else 0.05)  # the n-gram mode is the faster one
        prompt, n = body["prompt"], body["n_predict"]
        tokens = [prompt[i % len(prompt)] for i in range(n)]
        timings = {{"prompt_ms": 1.0, "predicted_ms": 2.0, "draft_n": 6 if speculative else 0,
                    "draft_n_accepted": 3 if speculative else 0}}
        reply = json.dumps({{"tokens": tokens, "timings": timings}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply)


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def fake_llama_cpp(tmp_path: Path, script: str = FAKE_LLAMA_SERVER) -> Path:
    """A bin/ folder whose llama-server is `script` (`FAKE_LLAMA_SERVER` unless said), run by this Python."""
    import sys

    bin_dir = tmp_path / "llama-bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text(script.format(python=sys.executable))
    server.chmod(0o755)
    return bin_dir


def gguf_converted_copy(tmp_path: Path, model_dir: Path) -> Path:
    """The tiny model as if converted from a GGUF file (its marker names one; only the fake server reads it)."""
    import shutil

    from quickdraft.models.store import MARKER

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    (copy / MARKER).write_text(json.dumps({"source": str(gguf), "gguf": str(gguf)}))
    return copy


def llama_cpp_bench(tmp_path: Path, model_dir: Path, bin_dir: Path, *extra: str) -> list[str]:
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    return ["bench", "--model", str(model_dir), "--drafters", "none,ngram", "--ks", "2", "--prompts", str(dataset)] + [
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--repeats",
        str(REPEATS),
        "--dtype",
        "int8",
        "--llama-cpp",
        str(bin_dir),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        *extra,
    ]


def test_llama_cpp_runs_plain_and_with_its_ngram_speculation_on_the_same_prompt_ids(tmp_path, tiny_dirs, monkeypatch):
    model_dir = gguf_converted_copy(tmp_path, tiny_dirs["llama"])
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    assert main(llama_cpp_bench(tmp_path, model_dir, fake_llama_cpp(tmp_path))) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    names = [m["name"] for m in results["methods"]]
    assert names == [BASELINE, "qd:ngram k=2", "llama.cpp:plain", "llama.cpp:ngram-simple"]
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    # warm-up once per server, then every prompt in every repeat, each from its own server, prompt cache off
    assert len(requests) == 2 + 2 * len(PROMPTS) * REPEATS
    assert {("--spec-type" in r["args"], r["temperature"], r["cache_prompt"]) for r in requests} == {
        (False, 0.0, False),
        (True, 0.0, False),
    }
    assert {len(r["prompt"]) for r in requests[2:]} == {p["prompt_tokens"] for p in results["prompts"]}
    rows = [r for r in results["measurements"] if r["method"].startswith("llama.cpp:")]
    for row in rows:
        sent = next(
            r["prompt"] for r in requests if len(r["prompt"]) == results["prompts"][row["prompt"]]["prompt_tokens"]
        )
        assert row["token_ids"] == [sent[i % len(sent)] for i in range(MAX_NEW_TOKENS)]  # the server's ids, untouched
    ngram = [r for r in rows if r["method"] == "llama.cpp:ngram-simple"]
    assert all((r["draft_tokens"], r["accepted_tokens"], r["steps"]) == (6, 3, MAX_NEW_TOKENS - 1 - 3) for r in ngram)
    overall = results["summary"]["groups"][OVERALL]
    assert overall["llama.cpp:ngram-simple"]["speedup_vs_llama_cpp"]["median"] == 1.0  # the fastest llama.cpp mode
    assert overall["llama.cpp:plain"]["speedup_vs_llama_cpp"]["median"] < 1.0
    assert overall[BASELINE]["identical"] == 1.0 and overall["qd:ngram k=2"]["identical"] == 1.0
    assert "| vs fastest llama.cpp |" in (tmp_path / "out" / "report.md").read_text()


def test_llama_cpp_generations_stop_at_the_models_end_of_sequence():
    from quickdraft.bench.methods import LlamaCppGenerate
    from quickdraft.config import SamplingParams

    class Server:  # what LlamaCppGenerate reads of a LlamaServer
        def complete(self, prompt, tokens, temperature):
            return {"tokens": [5, 6, 2, 7], "timings": {"prompt_ms": 30.0, "predicted_ms": 10.0}}

    generation = LlamaCppGenerate(Server(), "plain", frozenset({2})).run([1, 2, 3], SamplingParams(max_new_tokens=4))
    assert generation.token_ids == (5, 6) and generation.finish_reason == "stop"
    assert (generation.steps, generation.target_forwards) == (2, 3)  # the prompt's forward yields token 1
    assert generation.time_to_first_token == min(0.03, generation.wall_seconds)  # its prompt_ms, within the call


def test_a_llama_server_that_crashes_at_start_is_named_in_one_line(tmp_path, tiny_dirs, capsys):
    """llama.cpp's AMX repacking segfaults llama-server at start on some Xeons (stop 61): the bench stops with a
    line that names the crash, not a bare negative exit code, and the exit code of a usage error."""
    crash = "#!{python}\nimport os, signal, sys\nprint('loading model', file=sys.stderr, flush=True)\n"
    crash += "os.kill(os.getpid(), signal.SIGSEGV)\n"
    model_dir = gguf_converted_copy(tmp_path, tiny_dirs["llama"])
    assert main(llama_cpp_bench(tmp_path, model_dir, fake_llama_cpp(tmp_path, crash))) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "llama-server crashed (SIGSEGV) while loading" in error and error.endswith("(its last line: loading model)")


def test_llama_cpp_needs_a_build_with_llama_server_and_a_model_from_a_gguf_file(tmp_path, tiny_dirs, capsys):
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    assert main(llama_cpp_bench(tmp_path, tmp_path / "no-model", empty_bin)) == 2  # before any model loads
    assert "no llama-server in" in capsys.readouterr().err
    assert main(llama_cpp_bench(tmp_path, tiny_dirs["llama"], fake_llama_cpp(tmp_path))) == 2
    assert "comes from none on this machine; pass a built-in model or a .gguf path" in capsys.readouterr().err
