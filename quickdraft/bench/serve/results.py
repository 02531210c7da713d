"""results.json of a bench-serve run: how the run was made, every request's raw measurements and the
summary of each level; written with report.md and the plots, and read back by --combine.

Layout: label, endpoint {base_url, model}, provenance (command line with any API key masked, start
time, git, machine, prompt file checksum), config, warmup (one request), levels [{concurrency,
wall_time, requests [RequestResult fields]}], summary {levels [LevelSummary fields]}.
"""

import json
import shlex
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

from quickdraft.bench.provenance import provenance
from quickdraft.bench.serve.client import RequestResult
from quickdraft.bench.serve.load import LevelRun, LoadRun, ServeBenchConfig
from quickdraft.bench.serve.summary import level_summaries, summarize
from quickdraft.errors import UsageError

MASK = "MASKED"
RESULT_KEYS = ("label", "endpoint", "provenance", "config", "summary")  # what the reports read


def default_label(base_url: str, model: str, extra_body: dict) -> str:
    """ "host:port model", then the extra body when there is one, so runs of one server stay apart."""
    label = f"{urlsplit(base_url).netloc} {model}"
    return f"{label} {json.dumps(extra_body, separators=(',', ':'))}" if extra_body else label


def results_dict(config: ServeBenchConfig, run: LoadRun, label: str | None, prompts_path: Path) -> dict:
    """Everything a run measured, as the JSON-ready dict results.json holds."""
    summaries = summarize(run.levels, config.temperature, config.ttft_target)
    made = provenance(prompts_path)
    return {
        "label": label or default_label(config.base_url, run.model, config.extra_body),
        "endpoint": {"base_url": config.base_url, "model": run.model},
        "provenance": made | {"command_line": mask_api_key(made["command_line"])},
        "config": {
            "prompts": str(prompts_path),
            "prompt_ids": [prompt.question_id for prompt in config.prompts],
            "concurrency": list(config.concurrency),
            "requests_per_level": [config.requests_at(c) for c in config.concurrency],
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "ttft_target": config.ttft_target,
            "extra_body": config.extra_body,
            "timeout": config.timeout,
        },
        "warmup": asdict(run.warmup),
        "levels": [
            {
                "concurrency": level.concurrency,
                "wall_time": level.wall_time,
                "requests": [asdict(request) for request in level.requests],
            }
            for level in run.levels
        ],
        "summary": {"levels": [asdict(summary) for summary in summaries]},
    }


def merge_runs(runs: list[dict]) -> dict:
    """One run made of runs of one configuration that each measured some of its levels (`scripts/serve_sweep.sh`
    measures a level at a time, alternating the configurations it compares, so that a slow stretch of the machine
    falls on both): their levels in the given order, every level summarized again, so that the first level is the
    exactness reference of all. Provenance and warm-up are the first run's. UsageError when the runs differ in more
    than their levels."""
    first = runs[0]

    def setting(run: dict) -> tuple:
        config = {
            key: value for key, value in run["config"].items() if key not in ("concurrency", "requests_per_level")
        }
        return run["label"], run["endpoint"], config

    if any(setting(run) != setting(first) for run in runs[1:]):
        raise UsageError(
            "--merge joins runs of one configuration (the same label, endpoint and settings, other levels); "
            "pass the results.json of one configuration's levels"
        )
    if any("levels" not in run for run in runs):
        raise UsageError("--merge needs every request of each run; pass results.json files as bench-serve wrote them")
    levels = [level for run in runs for level in run["levels"]]
    measured = [
        LevelRun(
            level["concurrency"],
            level["wall_time"],
            tuple(
                RequestResult(**request | {"chunk_times": tuple(request["chunk_times"])})
                for request in level["requests"]
            ),
        )
        for level in levels
    ]
    config = first["config"] | {
        "concurrency": [level["concurrency"] for level in levels],
        "requests_per_level": [len(level["requests"]) for level in levels],
    }
    summaries = summarize(measured, config["temperature"], config["ttft_target"])
    return first | {"config": config, "levels": levels, "summary": {"levels": [asdict(s) for s in summaries]}}


def mask_api_key(command_line: str) -> str:
    """The command line with the value of --api-key replaced, so results.json can be shared."""
    words = shlex.split(command_line)
    masked = [
        MASK if previous == "--api-key" else "--api-key=" + MASK if word.startswith("--api-key=") else word
        for previous, word in zip([None, *words], words)
    ]
    return shlex.join(masked)


def write_run(results: dict, out: Path) -> list[Path]:
    """results.json, report.md and the plots of one run into `out`; returns their paths."""
    from quickdraft.bench.serve.plots import write_plots
    from quickdraft.bench.serve.report import render_report

    (out / "results.json").write_text(json.dumps(results))
    (out / "report.md").write_text(render_report(results))
    return [out / "results.json", out / "report.md", *write_plots([results], out)]


def write_combined(runs: list[dict], out: Path) -> list[Path]:
    """report.md and the plots of several runs side by side into `out`; returns their paths."""
    from quickdraft.bench.serve.plots import write_plots
    from quickdraft.bench.serve.report import render_combined

    (out / "report.md").write_text(render_combined(runs))
    return [out / "report.md", *write_plots(runs, out)]


def read_runs(paths: list[Path]) -> list[dict]:
    """The results of several runs for --combine; labels that repeat get " #2", " #3" added."""
    runs = [read_results(path) for path in paths]
    seen: dict[str, int] = {}
    for run in runs:
        seen[run["label"]] = seen.get(run["label"], 0) + 1
        if seen[run["label"]] > 1:
            run["label"] = f"{run['label']} #{seen[run['label']]}"
    return runs


def read_results(path: Path) -> dict:
    """One results.json written by bench-serve, checked enough to report on."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}; pass results.json files written by bench-serve") from exc
    missing = [key for key in RESULT_KEYS if key not in results] if isinstance(results, dict) else list(RESULT_KEYS)
    try:
        if not missing:
            level_summaries(results)
    except (KeyError, TypeError) as exc:
        missing = [f"summary fields ({exc})"]
    if missing:
        raise UsageError(
            f"{path} is not a bench-serve results.json (no {', '.join(missing)}); "
            "pass results.json files written by bench-serve"
        )
    return results
