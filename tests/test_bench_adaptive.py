"""`quickdraft bench-adaptive` end to end on a tiny random model: both cases, every setting, exact outputs."""

import json

from PIL import Image

from quickdraft.cli import main
from tests.test_bench import PROMPTS, write_jsonl

KS = [1, 3]


def test_both_cases_measure_every_setting_with_outputs_identical_to_the_target(tmp_path, tiny_dirs, monkeypatch, capsys):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    out = tmp_path / "out"
    argv = ["bench-adaptive", "--model", str(tiny_dirs["llama"]), "--prompts", str(dataset), "--ks", ",".join(map(str, KS)),
            "--per-category", "1", "--max-new-tokens", "16", "--safety-prompts", "2", "--safety-max-new-tokens", "16",
            "--draft-layers", "1", "--threads", "1", "--runtime", "native", "--dtype", "float32", "--out", str(out)]
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
    raw = json.loads((out / "adaptive-raw.json").read_text())
    assert len(raw) == len(settings) * (2 + 2)  # safety: 2 prompts, quality: one per category
    report = (out / "adaptive.md").read_text()
    assert "### Safety" in report and "### Quality" in report and report in capsys.readouterr().out
    assert Image.open(out / "adaptive.png").size[0] > 0


def test_an_unknown_case_is_a_usage_error(tmp_path, capsys):
    dataset = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    assert main(["bench-adaptive", "--prompts", str(dataset), "--cases", "speed", "--out", str(tmp_path / "out")]) == 2
    assert "--cases must name safety and/or quality" in capsys.readouterr().err
