"""`quickdraft batch` end to end on a tiny model: every line answered as the engine answers it alone,
per-line overrides honoured, bad lines refused with one line naming file:line before anything runs."""

import argparse
import json

import pytest

from quickdraft.commands.arguments import load_engine
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.models.loading import load_model_dir
from tests.test_cli import quickdraft

LINES = [
    {"prompt": "The quick brown fox", "id": "fox"},
    {"prompt": "Once upon a time", "max_tokens": 5},
    {"messages": [{"role": "user", "content": "def add(a, b):"}], "id": 7},
    {"prompt": "café 東京", "temperature": 0.8, "seed": 3},
]


def test_every_line_gets_the_answer_the_engine_gives_it_alone(tiny_dirs, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in LINES) + "\n\n")
    model = str(tiny_dirs["llama"])
    run = quickdraft(
        "batch",
        str(source),
        "--out",
        str(out),
        "--model",
        model,
        "--drafter",
        "ngram",
        "--k",
        "3",
        "--max-batch",
        "3",
        "--step-tokens",
        "5",
        "--max-new-tokens",
        "20",
        "--raw",
    )
    assert run.returncode == 0, run.stderr
    results = {r["index"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(results) == [0, 1, 2, 3] and results[0]["id"] == "fox" and results[2]["id"] == 7
    engine = Engine(load_model_dir(tiny_dirs["llama"], runtime="native", dtype="int8"), SpecConfig("ngram", k=3))
    expected = [
        engine.generate("The quick brown fox", SamplingParams(max_new_tokens=20)),
        engine.generate("Once upon a time", SamplingParams(max_new_tokens=5)),
        engine.generate(LINES[2]["messages"], SamplingParams(max_new_tokens=20), chat=True),
        engine.generate("café 東京", SamplingParams(temperature=0.8, seed=3, max_new_tokens=20)),
    ]
    for index, finished in enumerate(expected):
        assert results[index]["text"] == finished.text
        assert results[index]["completion_tokens"] == finished.stats.generated_tokens
    assert results[1]["completion_tokens"] <= 5
    assert "4/4" in run.stderr  # the progress bar reached the end


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "in.jsonl:2: not JSON"),
        ('{"prompt": "a", "messages": []}', "exactly one of prompt (text) or messages"),
        ('{"prompt": "a", "colour": 1}', "unknown fields colour"),
        ('{"prompt": "a", "temperature": -1}', "in.jsonl:2: temperature must be >= 0"),
    ],
)
def test_a_bad_line_is_refused_before_anything_runs(tmp_path, line, message):
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "fine"}\n' + line + "\n")
    run = quickdraft("batch", str(source), "--out", str(tmp_path / "out.jsonl"), "--model", "no-such-model")
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_step_tokens_reach_the_engine_and_a_bad_value_is_refused_before_loading(tiny_dirs, tmp_path):
    flags = dict(drafter="ngram", k=3, k_max=8, runtime="native", dtype="int8", device="cpu", threads=None)
    engine = load_engine(argparse.Namespace(model=str(tiny_dirs["llama"]), **flags), max_batch=2, step_tokens=5)
    assert (engine.max_batch, engine.step_tokens) == (2, 5)
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "fine"}\n')
    run = quickdraft(
        "batch", str(source), "--out", str(tmp_path / "out.jsonl"), "--model", "no-such-model", "--step-tokens", "0"
    )
    assert run.returncode == 2 and "--step-tokens must be >= 1, got 0" in run.stderr and "Traceback" not in run.stderr
