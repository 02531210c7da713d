"""`quickdraft bench-runtime` end to end on a tiny random model: every field the issue names, with sane values."""

import json

from quickdraft.bench.runtime import VERIFY_KS
from quickdraft.cli import main
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
    for key in ("hf_tokens_per_second", "native_fp32_tokens_per_second", "native_tokens_per_second"):
        assert summary[key] > 0
    assert (
        summary["native_tokens_per_second"] == summary["native_by_dtype"][summary["default_dtype"]]["tokens_per_second"]
    )
    assert [int(k) for k in summary["verify_cost"]] == list(VERIFY_KS)
    assert all(v > 0 for v in summary["verify_cost"].values())
    assert all(r["matmul_ceiling_tokens_per_second"] > 0 for r in summary["native_by_dtype"].values())
    ngram = summary["ngram_dev"]
    assert ngram["prompts"] == 2 and ngram["max_new_tokens"] == 12  # two categories, one prompt each
    assert set(ngram["tokens_per_second"]) == {"hf float32", "native float32", f"native {summary['default_dtype']}"}
    assert all(v > 0 for v in ngram["tokens_per_second"].values())
    assert ngram["identical_to_hf"] == 1.0  # same weights, same dtype, greedy: the same tokens


def test_table_shows_ratios_against_the_transformers_runner(tiny_dirs, capsys):
    assert main(["bench-runtime", "--models", str(tiny_dirs["llama-long"]), "--repeats", "1", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert "hf float32" in table and "native float32" in table and "1.00x" in table
    assert "ngram" not in table  # no dev prompts given


def test_a_missing_dev_prompt_file_is_a_usage_error_before_loading_anything(tmp_path, capsys):
    code = main(["bench-runtime", "--models", "smollm2-135m-instruct", "--prompts", str(tmp_path / "none.jsonl")])
    assert code == 2
    assert "cannot read dataset" in capsys.readouterr().err
