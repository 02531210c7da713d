"""The CLI end to end on a tiny model directory: JSON report, exit codes, one-line errors."""

import json
import shutil
import subprocess
import sys

import pytest


def quickdraft(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quickdraft", *args], capture_output=True, text=True, timeout=300)


def test_generate_json_with_compare(tiny_dirs):
    out = quickdraft(
        "generate",
        "The quick brown fox",
        "--model",
        str(tiny_dirs["llama"]),
        "--runtime",
        "hf",
        "--drafter",
        "ngram",
        "--k",
        "3",
        "--max-new-tokens",
        "24",
        "--compare",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for key in (
        "generated_tokens",
        "target_forwards",
        "draft_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "mean_accepted_length",
        "tokens_per_second",
    ):
        assert key in report["stats"], key
    assert report["identical"] is True
    assert report["text"] == report["baseline_text"]
    assert report["speedup"] > 0


def test_generate_streams_text_and_prints_stats(tiny_dirs):
    out = quickdraft(
        "generate", "Once upon a time", "--model", str(tiny_dirs["gemma3"]), "--runtime", "hf", "--max-new-tokens", "12"
    )
    assert out.returncode == 0, out.stderr
    assert "mean accepted length tau" in out.stdout
    assert "acceptance by draft position" in out.stdout


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--temperature", "-1"], 2, "temperature must be >= 0"),
        (["--top-p", "1.5"], 2, "top_p must be in (0, 1]"),
        (["--top-k", "-3"], 2, "top_k must be >= 0"),
        (["--k", "-1"], 2, "k must be >= 0"),
        (["--model", "no-such-model"], 2, "unknown model 'no-such-model'"),
        (
            ["--model", "/nonexistent/model.gguf"],
            1,
            "no such file or directory: /nonexistent/model.gguf; check the path",
        ),
    ],
)
def test_bad_input_gives_one_line_error_and_exit_code(tiny_dirs, args, code, message):
    model_args = [] if "--model" in args else ["--model", str(tiny_dirs["llama"]), "--runtime", "hf"]
    out = quickdraft("generate", "hello", *model_args, *args)
    assert out.returncode == code, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if line.startswith("quickdraft: error")]) == 1


def test_chat_without_a_template_is_a_usage_error(tiny_dirs, tmp_path):
    plain = shutil.copytree(tiny_dirs["llama"], tmp_path / "plain")
    (plain / "chat_template.jinja").unlink()
    out = quickdraft("generate", "hello", "--model", str(plain), "--runtime", "hf", "--chat")
    assert out.returncode == 2 and "has no chat template; send a plain prompt" in out.stderr


def test_empty_prompt_is_a_usage_error():
    out = quickdraft("generate", "  ")
    assert out.returncode == 2 and "prompt is empty" in out.stderr


def test_corrupted_model_file_is_a_runtime_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    out = quickdraft("generate", "hello", "--model", str(bad))
    assert out.returncode == 1
    assert "not a valid GGUF file" in out.stderr and "Traceback" not in out.stderr


def test_help_explains_every_flag():
    out = quickdraft("generate", "--help")
    for flag in (
        "--model",
        "--drafter",
        "--k",
        "--temperature",
        "--top-k",
        "--top-p",
        "--seed",
        "--max-new-tokens",
        "--stop",
        "--chat",
        "--compare",
        "--json",
        "--runtime",
    ):
        assert flag in out.stdout
