"""`quickdraft bench-runtime` end to end on a tiny random model: every field the issue names, with sane values."""

import json
import stat
import sys
from pathlib import Path

import pytest

from quickdraft.bench.llama_cpp import decode_tokens_per_second, greedy_continuations
from quickdraft.bench.runtime import VERIFY_KS, top1_agreement
from quickdraft.cli import main
from quickdraft.commands.bench_runtime_cmd import NATIVE_DTYPE_NAMES
from quickdraft.errors import UsageError
from quickdraft.models.native import NATIVE_DTYPES, native_runner_for
from quickdraft.models.native.kernels import built_instruction_set
from quickdraft.models.store import gguf_source
from tests.test_bench import PROMPTS, write_jsonl


def test_json_has_decode_speeds_verify_costs_and_ngram_speeds_per_runner(tmp_path, tiny_dirs, capsys):
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    argv = [
        "bench-runtime",
        "--models",
        str(tiny_dirs["llama-long"]),
        "--repeats",
        "1",
        "--threads",
        "1",
        "--prompts",
        str(dataset),
        "--per-category",
        "1",
        "--max-new-tokens",
        "12",
        "--json",
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["model"] == str(tiny_dirs["llama-long"]) and summary["threads"] == 1
    assert summary["cpu_kernels"] == built_instruction_set()  # which of the kernels' instruction sets ran
    for key in ("hf_tokens_per_second", "native_fp32_tokens_per_second", "native_tokens_per_second"):
        assert summary[key] > 0
    assert (
        summary["native_tokens_per_second"] == summary["native_by_dtype"][summary["default_dtype"]]["tokens_per_second"]
    )
    assert [int(k) for k in summary["verify_cost"]] == list(VERIFY_KS)
    assert all(v > 0 for v in summary["verify_cost"].values())
    assert all(r["matmul_ceiling_tokens_per_second"] > 0 for r in summary["native_by_dtype"].values())
    assert summary["read_bandwidth_gb_per_second"] > 0
    by_dtype = summary["native_by_dtype"]
    assert by_dtype["float32"]["weight_bytes_per_token"] > 3 * by_dtype["int8"]["weight_bytes_per_token"]
    for r in by_dtype.values():
        ceiling = summary["read_bandwidth_gb_per_second"] * 1e9 / r["weight_bytes_per_token"]
        assert r["bandwidth_ceiling_tokens_per_second"] == pytest.approx(ceiling)
        assert r["of_bandwidth_ceiling"] == pytest.approx(r["tokens_per_second"] / ceiling)
    assert "llama_cpp" not in summary
    ngram = summary["ngram_dev"]
    assert ngram["prompts"] == 2 and ngram["max_new_tokens"] == 12  # two categories, one prompt each
    assert set(ngram["tokens_per_second"]) == {"hf float32", "native float32", f"native {summary['default_dtype']}"}
    assert all(v > 0 for v in ngram["tokens_per_second"].values())
    assert ngram["identical_to_hf"] == 1.0  # same weights, same dtype, greedy: the same tokens


def test_table_shows_ratios_against_the_transformers_runner(tiny_dirs, capsys):
    assert main(["bench-runtime", "--models", str(tiny_dirs["llama-long"]), "--repeats", "1", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert "hf float32" in table and "native float32" in table and "1.00x" in table
    assert f"(cpu, {built_instruction_set()} kernels, 1 threads" in table
    assert "ngram" not in table  # no dev prompts given


def test_a_missing_dev_prompt_file_is_a_usage_error_before_loading_anything(tmp_path, capsys):
    code = main(["bench-runtime", "--models", "smollm2-135m-instruct", "--prompts", str(tmp_path / "none.jsonl")])
    assert code == 2
    assert "cannot read dataset" in capsys.readouterr().err


def test_an_unknown_dtype_is_a_usage_error_naming_the_native_ones(capsys):
    """The command checks --dtypes against names it holds without importing the runtime: they must be the runtime's."""
    assert NATIVE_DTYPE_NAMES == tuple(NATIVE_DTYPES)
    assert main(["bench-runtime", "--dtypes", "int4"]) == 2
    assert "unknown native dtypes int4; choose from float32, bfloat16, int8, gguf" in capsys.readouterr().err


def fake_llama_bench(bin_dir: Path, script: str) -> Path:
    """A stand-in `llama-bench` (the real one is a peer build the tests must not need) that logs its arguments."""
    bin_dir.mkdir()
    binary = bin_dir / "llama-bench"
    binary.write_text(f'#!/bin/sh\necho "$@" > {bin_dir}/args\n{script}\n')
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_llama_cpp_decode_runs_llama_bench_generation_only_and_takes_the_median(tmp_path):
    output = '[{"samples_ts": [140.0, 150.0, 160.0, 10.0, 155.0], "avg_ts": 123.0}]'
    bin_dir = fake_llama_bench(tmp_path / "bin", f"echo '{output}'")
    assert decode_tokens_per_second(bin_dir, tmp_path / "m.gguf", threads=2, tokens=64, repeats=5) == 150.0
    args = (bin_dir / "args").read_text().split()
    assert args == [
        "-m",
        str(tmp_path / "m.gguf"),
        "-p",
        "0",
        "-n",
        "64",
        "-r",
        "5",
        "-t",
        "2",
        "-fa",
        "0",
        "-o",
        "json",
    ]


def test_a_failing_or_missing_llama_bench_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no llama-bench in"):
        decode_tokens_per_second(tmp_path, tmp_path / "m.gguf", 2, 64, 5)
    bin_dir = fake_llama_bench(tmp_path / "bin", "echo 'error: failed to load model' >&2; exit 1")
    with pytest.raises(UsageError, match="exit 1.*failed to load model"):
        decode_tokens_per_second(bin_dir, tmp_path / "m.gguf", 2, 64, 5)
    crashing = fake_llama_bench(tmp_path / "crashing", "echo 'llama_model_load: loaded' >&2; kill -SEGV $$")
    crash = r"llama-bench crashed \(SIGSEGV\) while running .*last line: llama_model_load"
    with pytest.raises(UsageError, match=crash):
        decode_tokens_per_second(crashing, tmp_path / "m.gguf", 2, 64, 5)


def test_the_gguf_source_of_a_model_is_its_file_or_none(tmp_path, tiny_dirs, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "model.gguf"
    local.write_bytes(b"GGUF")
    assert gguf_source(str(local)) == local
    assert gguf_source(str(tiny_dirs["llama"])) is None
    assert gguf_source("smollm2-135m-instruct") is None  # not fetched into this cache
    fetched = tmp_path / "cache" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fetched.parent.mkdir(parents=True)
    fetched.write_bytes(b"GGUF")
    assert gguf_source("smollm2-135m-instruct") == fetched


FAKE_SERVER = """#!{python}
# A stand-in llama-server: /health, and /completion answering each prompt with its stored continuation.
import http.server, json, sys
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
stored = {{tuple(p): c for p, c in json.load(open("{answers}"))}}
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self._send({{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open("{log}", "a") as log: log.write(json.dumps([argv, body]) + "\\n")
        self._send({{"tokens": stored[tuple(body["prompt"])]}})
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_greedy_continuations_come_from_a_llama_server_and_agreement_counts_matching_positions(tmp_path, tiny_dirs):
    """llama-server is a peer build the tests must not need: a stand-in serves stored continuations (the int8
    runner's own greedy tokens, so its agreement is exactly 1; one changed last token costs one position)."""
    runner = native_runner_for(tiny_dirs["llama"], "int8")
    prompts = [[5, 9, 13, 2], [7, 7, 30]]
    continuations = []
    for prompt in prompts:
        tokens = [int(runner.prefill(prompt).argmax())]
        while len(tokens) < 12:
            tokens.append(int(runner.forward([tokens[-1]])[0].argmax()))
        continuations.append(tokens)
    answers, log, bin_dir = tmp_path / "answers.json", tmp_path / "log", tmp_path / "bin"
    answers.write_text(json.dumps([[p, c] for p, c in zip(prompts, continuations)]))
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text(FAKE_SERVER.format(python=sys.executable, answers=answers, log=log))
    server.chmod(server.stat().st_mode | stat.S_IEXEC)

    assert greedy_continuations(bin_dir, tmp_path / "m.gguf", prompts, tokens=12, threads=2) == continuations
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    argv, body = requests[0]
    assert argv[argv.index("-m") + 1] == str(tmp_path / "m.gguf") and argv[argv.index("-t") + 1] == "2"
    assert [r[1]["prompt"] for r in requests] == prompts
    assert (body["n_predict"], body["temperature"], body["ignore_eos"]) == (12, 0.0, True)

    assert top1_agreement(runner, prompts, continuations) == 1.0
    changed = [continuations[0], continuations[1][:-1] + [continuations[1][-1] + 1]]
    assert top1_agreement(runner, prompts, changed) == 23 / 24
    with pytest.raises(UsageError, match="no llama-server in"):
        greedy_continuations(tmp_path, tmp_path / "m.gguf", prompts, tokens=12, threads=2)
