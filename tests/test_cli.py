"""The CLI end to end on a tiny model directory: JSON report, exit codes, one-line errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quickdraft.cli import COMMANDS, main
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.drafters.head.files import save_head
from quickdraft.drafters.head.identity import target_identity
from quickdraft.engine import Engine
from tests.test_head import random_head


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
        "--raw",
        "--compare",
        "--json",
        "--runtime",
    ):
        assert flag in out.stdout


def only_error_line(capsys) -> str:
    """The one `quickdraft: error` line on stderr (transformers may print progress bars beside it)."""
    errors = [line for line in capsys.readouterr().err.splitlines() if "quickdraft: error" in line]
    assert len(errors) == 1, errors
    return errors[0][errors[0].index("quickdraft: error") :]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damaged_model(tiny_dirs, tmp_path, damage: str) -> Path:
    model = shutil.copytree(tiny_dirs["llama"], tmp_path / "model")
    if damage == "truncated-weights":
        truncate(model / "model.safetensors")
    if damage == "config-types":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps(config | {"hidden_size": "64"}))
    return model


@pytest.mark.parametrize(
    "damage, runtime, message",
    [
        ("truncated-weights", "auto", "model.safetensors is truncated or not a safetensors file"),
        ("truncated-weights", "hf", "model.safetensors is truncated or not a safetensors file"),
        ("config-types", "auto", "config.json is not a valid model config (Validation error for field 'hidden_size'"),
    ],
)
def test_a_damaged_model_directory_gives_one_line_naming_the_file(
    tiny_dirs, tmp_path, capsys, damage, runtime, message
):
    model = damaged_model(tiny_dirs, tmp_path, damage)
    assert main(["generate", "hello", "--model", str(model), "--runtime", runtime, "--max-new-tokens", "2"]) == 1
    error = only_error_line(capsys)
    assert error.startswith(f"quickdraft: error: the model's {model}") and message in error, error
    assert "fetch or save the model again" in error and "--debug" not in error


def test_a_truncated_head_gives_one_line_naming_the_file(tiny_dirs, tiny_models, tmp_path, capsys):
    head_dir = tmp_path / "head"
    save_head(head_dir, random_head(tiny_models["llama"]), target_identity(tiny_models["llama"]), verifier="llama")
    truncate(head_dir / "model.safetensors")
    args = ["generate", "hello", "--model", str(tiny_dirs["llama"]), "--runtime", "hf", "--drafter", f"head:{head_dir}"]
    assert main(args) == 1
    error = only_error_line(capsys)
    assert error.startswith(f"quickdraft: error: the draft head's {head_dir / 'model.safetensors'} is truncated"), error
    assert "quickdraft distill" in error and "--debug" not in error


def test_a_device_file_as_model_is_named_for_what_it_is(capsys):
    assert main(["generate", "hello", "--model", "/dev/zero"]) == 1
    error = only_error_line(capsys)
    assert error.startswith("quickdraft: error: /dev/zero is not a directory or a regular file"), error


def generate_json(capsys, *args: str) -> dict:
    assert main(["generate", *args, "--runtime", "hf", "--drafter", "none", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_speaks_through_the_chat_template_unless_raw(tiny_dirs, tiny_models, capsys):
    """An instruction-tuned model fed a bare question often ends at once: a template, when the model has one."""
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="none"))
    prompt, params = "The quick brown fox", SamplingParams(max_new_tokens=8)
    chat, raw = engine.generate(prompt, params, chat=True).text, engine.generate(prompt, params).text
    assert chat != raw
    model = ["--model", str(tiny_dirs["llama"]), "--max-new-tokens", "8"]
    assert generate_json(capsys, prompt, *model)["text"] == chat
    assert generate_json(capsys, prompt, *model, "--chat")["text"] == chat
    assert generate_json(capsys, prompt, *model, "--raw")["text"] == raw


def test_an_answer_that_ends_at_once_says_why(tiny_dirs, tiny_models, tmp_path, capsys):
    """The model's first token made its end of sequence, for the chat and the raw prompt: 0 tokens, and a reason."""
    prompt = "The quick brown fox"
    engine = Engine(tiny_models["llama"], SpecConfig(drafter="none"))
    first = {
        int(tiny_models["llama"].runner.prefill(engine.encode(prompt, chat=chat)).argmax()) for chat in (True, False)
    }
    model = shutil.copytree(tiny_dirs["llama"], tmp_path / "ends-at-once")
    generation = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(generation | {"eos_token_id": [1, *first]}))
    for flag, hint in (("--chat", "try another wording"), ("--raw", "drop --raw to send the prompt through it")):
        report = generate_json(capsys, prompt, "--model", str(model), flag)
        assert report["stats"]["generated_tokens"] == 0
        assert main(["generate", prompt, "--model", str(model), "--runtime", "hf", "--drafter", "none", flag]) == 0
        note = capsys.readouterr().err
        assert "quickdraft: the model ended its answer at once (end of sequence), so there is no text" in note, note
        assert hint in note, note


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--help"], 0),
        *[([command, "--help"], 0) for command in COMMANDS if command != "distill"],
        (["generate", "--k", "x", "hello"], 2),
        (["serve", "--max-batch", "many"], 2),
    ],
)
def test_help_and_usage_errors_wait_for_neither_torch_nor_transformers(argv, code):
    """Every command's module imports the model stack (seconds of start-up) only when the command runs: help and a
    mistyped flag answer at once. distill's defaults come from its training code, so its help still loads it."""
    blocked = "import sys, runpy; sys.modules.update(torch=None, transformers=None); "
    run = "sys.argv = ['quickdraft', *sys.argv[1:]]; runpy.run_module('quickdraft', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", blocked + run, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert "usage: quickdraft" in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_generating_needs_no_web_framework(tiny_dirs):
    """Only `serve` loads fastapi and uvicorn: `generate` runs where they are missing (a GPU machine's image)."""
    blocked = "import sys, runpy; sys.modules.update(fastapi=None, uvicorn=None, starlette=None); "
    run = "sys.argv = ['quickdraft', *sys.argv[1:]]; runpy.run_module('quickdraft', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", blocked + run, "generate", "--model", str(tiny_dirs["llama"]), "--max-new-tokens", "4"]
        + ["--raw", "hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "4 tokens" in done.stdout
