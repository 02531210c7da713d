"""`quickdraft bench-adaptive` end to end on a tiny random model: both cases, every setting, exact outputs."""

import json
from dataclasses import replace

import pytest
from PIL import Image

from quickdraft.bench.adaptive import load_raw, same_work_timing
from quickdraft.bench.adaptive_report import fixed_drafter, fixed_labels
from quickdraft.bench.replay import replay
from quickdraft.cli import main
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.controller import ControllerMemory
from quickdraft.costs import TargetCost
from quickdraft.engine import Engine
from quickdraft.measure import Generation, Trial
from quickdraft.models.loading import load_model_dir
from tests.test_bench import PROMPTS, write_jsonl

KS = [1, 3]


def test_both_cases_measure_every_setting_with_outputs_identical_to_the_target(
    tmp_path, tiny_dirs, monkeypatch, capsys
):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    out = tmp_path / "out"
    argv = [
        "bench-adaptive",
        "--model",
        str(tiny_dirs["llama"]),
        "--prompts",
        str(dataset),
        "--ks",
        ",".join(map(str, KS)),
        "--per-category",
        "1",
        "--max-new-tokens",
        "16",
        "--safety-prompts",
        "2",
        "--safety-max-new-tokens",
        "16",
        "--draft-layers",
        "1",
        "--threads",
        "1",
        "--runtime",
        "native",
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    results = json.loads((out / "adaptive.json").read_text())["results"]
    settings = {"target", "auto", *(f"k={k}" for k in KS)}
    for case in ("safety", "quality"):
        assert set(results[case]["speeds"]["overall"]) == settings
        assert all(speed > 0 for speed in results[case]["speeds"]["overall"].values())
        assert results[case]["mismatches"] == []
    assert set(results["quality"]["speeds"]) == {"overall", "writing", "coding"}
    assert "random-draft" in results["safety"]["costs"]["end"]["draft_per_token_vs_t1"]
    assert list((tmp_path / "cache" / "bench").iterdir()), "the random draft is built in the quickdraft cache"
    raw = load_raw(out / "adaptive-raw.json")
    assert {case: len(trials) for case, trials in raw.items()} == {
        "safety": len(settings) * 2,  # 2 prompts
        "quality": len(settings) * 2,  # one per category
    }
    same = results["quality"]["same_work"]
    assert same["reference"] in {f"k={k}" for k in KS} and same["of"] == 2 and 0 <= same["generations"] <= 2
    assert same == same_work_timing(raw["quality"], same["reference"])
    report = (out / "adaptive.md").read_text()
    assert (
        "### Safety" in report
        and "### Quality" in report
        and "Timing noise:" in report
        and report in capsys.readouterr().out
    )
    assert Image.open(out / "adaptive.png").size[0] > 0


def test_quality_with_several_drafters_runs_each_alone_at_every_k_and_auto_over_all(tmp_path, tiny_dirs, capsys):
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    draft = str(tiny_dirs["llama-other"])
    out = tmp_path / "out"
    argv = [
        "bench-adaptive",
        "--model",
        str(tiny_dirs["llama"]),
        "--prompts",
        str(dataset),
        "--cases",
        "quality",
        "--drafters",
        f"ngram,{draft}",
        "--ks",
        ",".join(map(str, KS)),
        "--per-category",
        "1",
        "--max-new-tokens",
        "12",
        "--threads",
        "1",
        "--runtime",
        "native",
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    quality = json.loads((out / "adaptive.json").read_text())["results"]["quality"]
    fixed = [f"{drafter} k={k}" for drafter in (draft, "ngram") for k in KS]
    assert fixed_labels(quality["speeds"]["overall"]) == fixed
    assert quality["drafters"] == ["ngram", draft] and quality["mismatches"] == []
    trials = load_raw(out / "adaptive-raw.json")["quality"]
    auto_steps = {name for t in trials if t.method == "auto" for name in t.generation.drafter_steps}
    assert auto_steps <= {"none", "ngram", draft}
    for t in trials:
        if t.method in fixed:
            assert set(t.generation.drafter_steps) <= {"none", fixed_drafter(t.method)}, (
                "a fixed setting drafts with its one drafter"
            )
    assert f"### Quality: ngram, {draft} on the dev prompts" in (out / "adaptive.md").read_text()
    assert Image.open(out / "adaptive.png").size[0] > 0


def test_same_work_timing_compares_only_generations_with_identical_steps():
    def run(setting, prompt, k_per_step, seconds):
        generation = Generation(
            token_ids=(0,) * 10,
            finish_reason="length",
            wall_seconds=seconds,
            cpu_seconds=seconds,
            time_to_first_token=0.0,
            target_forwards=len(k_per_step) + 1,
            steps=len(k_per_step),
            draft_tokens=sum(k_per_step),
            accepted_tokens=0,
            verify_seconds=seconds,
            k_per_step=tuple(k_per_step),
        )
        return Trial(0, prompt, "writing", setting, 0, generation)

    runs = [
        run("k=3", 0, [3, 3], 1.0),
        run("auto", 0, [3, 3], 1.25),
        run("k=3", 1, [3, 0], 1.0),
        run("auto", 1, [3, 1], 0.5),
    ]
    assert same_work_timing(runs, "k=3") == {
        "reference": "k=3",
        "generations": 1,
        "of": 2,
        "median": 0.8,
        "min": 0.8,
        "max": 0.8,
    }
    assert same_work_timing(runs, "k=1") == {"reference": "k=1", "generations": 0, "of": 2}
    empty = [run("k=3", 2, [], 0.01), run("auto", 2, [], 0.01)]
    empty = [replace(t, generation=replace(t.generation, token_ids=())) for t in empty]  # answered with EOS at once
    assert same_work_timing(runs + empty, "k=3") == same_work_timing(runs, "k=3")


def test_an_unknown_case_is_a_usage_error(tmp_path, capsys):
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    assert main(["bench-adaptive", "--prompts", str(dataset), "--cases", "speed", "--out", str(tmp_path / "out")]) == 2
    assert "--cases must name safety and/or quality" in capsys.readouterr().err


@pytest.fixture(scope="module")
def smollm2(builtin_model_dir):
    return load_model_dir(builtin_model_dir("smollm2-135m-instruct"), name="smollm2-135m-instruct")


@pytest.mark.real_model
@pytest.mark.parametrize("k", [1, 3, 8])
def test_replaying_a_fixed_k_takes_exactly_the_engines_steps(smollm2, k):
    """The replay behind scripts/replay_controller.py drafts and accepts as the engine did on the same output."""
    engine = Engine(smollm2, SpecConfig(drafter="ngram", k=k))
    prompt_ids = engine.encode(
        "Rewrite in the past tense: I walk to the market, I buy bread, I talk with the baker.", chat=True
    )
    result = engine.generate(prompt_ids, SamplingParams(max_new_tokens=48, ignore_eos=True))
    assert result.stats.accepted_tokens > 0
    memory = ControllerMemory(TargetCost([1.0] * 9))
    assert replay(prompt_ids, result.token_ids, k, memory, smollm2.tokenizer) == result.stats.k_per_step


def test_replaying_auto_follows_the_cost_model(tiny_models):
    """Output that repeats its prompt: cheap verification makes auto draft long; a linear cost makes it
    stop drafting."""
    prompt_ids = list(range(10, 30))
    output = list(range(10, 30)) * 3
    tokenizer = tiny_models["llama"].tokenizer
    cheap = replay(prompt_ids, output, None, ControllerMemory(TargetCost([1.0] * 9)), tokenizer)
    linear = replay(prompt_ids, output, None, ControllerMemory(TargetCost([float(n) for n in range(1, 10)])), tokenizer)
    assert max(cheap) == 8 and len(cheap) < len(output) / 4
    assert sum(1 for drafted in linear if drafted == 0) > len(linear) / 2
