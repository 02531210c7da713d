"""report.md of bench-serve: the tables of one run, or several runs side by side (--combine), as Markdown.

The same tables are printed to stdout. TTFT, TPOT and ITL are shown in milliseconds, end-to-end
latency in seconds; "-" marks a figure no successful request gave.
"""

import json
import re
import statistics
from collections.abc import Callable

from quickdraft.bench.serve.summary import LevelSummary, level_summaries

PLOTS = {
    "latency.png": "TTFT p50 and p99, TPOT p50 against concurrency",
    "throughput.png": "Aggregate output tokens/s and goodput against concurrency",
}
DEFINITIONS = (
    "TTFT: sending to the first non-empty content chunk. TPOT: (end-to-end latency - TTFT) / (output tokens - 1), "
    "output tokens from the server's usage when it sends it, else counted chunks. ITL: the gaps between content "
    "chunks (a speculative server sends several tokens per chunk, so ITL and TPOT differ). Output tok/s: the "
    "output tokens of the level's successful requests over its wall time. Goodput: successful requests per second "
    "whose TTFT is within the target. Identical: outputs equal to the same prompt's output at the first level "
    "(temperature 0 only)."
)

# the tables of a combined report besides throughput: title -> a level's cell
COMBINED_METRICS: dict[str, Callable[[LevelSummary], str]] = {
    "TTFT p50 ms": lambda s: _ms(s.ttft_p50),
    "TTFT p99 ms": lambda s: _ms(s.ttft_p99),
    "TPOT p50 ms": lambda s: _ms(s.tpot_p50),
    "ITL p50 ms": lambda s: _ms(s.itl_p50),
    "End-to-end latency p50 s": lambda s: _seconds(s.e2e_p50),
    "Goodput req/s (TTFT within each run's target)": lambda s: f"{s.goodput:.2f} (<= {s.ttft_target:g} s)",
    "Failed requests": lambda s: f"{s.failed} of {s.requests}",
    "Identical to the run's first level": lambda s: _identical(s),
}


def level_tables(summaries: list[LevelSummary]) -> str:
    """The latency and the throughput table of one run, one row per level, and the prompts that differ."""
    return "\n\n".join(
        part for part in (_latency_table(summaries), _throughput_table(summaries), _differing(summaries)) if part
    )


def render_report(results: dict) -> str:
    """report.md of one run."""
    summaries = level_summaries(results)
    sections = [
        f"# bench-serve: {results['label']}",
        _run_description(results),
        "## Per concurrency level\n\n" + level_tables(summaries),
        DEFINITIONS,
        _plots_section(),
    ]
    return "\n\n".join(sections) + "\n"


def render_combined(runs: list[dict]) -> str:
    """report.md of several runs: one column per run (by label) in every table."""
    rounds = rounds_table(runs)
    sections = [
        f"# bench-serve: {len(runs)} runs side by side",
        _runs_table(runs),
        "## Aggregate output tokens/s (ratio to the first run)\n\n" + throughput_ratio_table(runs),
        *([ROUNDS_TITLE + "\n\n" + rounds] if rounds else []),
        *(f"## {title}\n\n" + _metric_table(runs, cell) for title, cell in COMBINED_METRICS.items()),
        DEFINITIONS,
        _plots_section(),
    ]
    return "\n\n".join(sections) + "\n"


def throughput_ratio_table(runs: list[dict]) -> str:
    """Aggregate tok/s of each run at each concurrency, with its ratio to the first run's at that concurrency."""
    first = {s.concurrency: s.output_tokens_per_second for s in level_summaries(runs[0])}

    def cell(summary: LevelSummary) -> str:
        reference = first.get(summary.concurrency)
        ratio = f" ({summary.output_tokens_per_second / reference:.2f}x)" if reference else ""
        return f"{summary.output_tokens_per_second:.1f}{ratio}"

    return _metric_table(runs, cell)


ROUNDS_TITLE = (
    "## Over rounds: median aggregate tokens/s (median and range of each round's ratio to the first run's same round)"
)


def rounds_table(runs: list[dict]) -> str:
    """Runs that share a label are rounds of one configuration (`read_runs` numbers repeats " #2", " #3"); one
    column per configuration. A round is compared with the same round of the first configuration, so drift between
    rounds on a noisy machine cancels out of the ratios. Empty when no label repeats."""
    groups = list(_rounds(runs).values())  # [configurations][rounds]: runs
    if all(len(group) == 1 for group in groups):
        return ""
    by_round = [[{s.concurrency: s.output_tokens_per_second for s in level_summaries(r)} for r in g] for g in groups]
    levels = sorted({concurrency for rounds in by_round for run in rounds for concurrency in run})
    header = "| concurrency | " + " | ".join(f"{g[0]['label']} ({_count(len(g), 'round')})" for g in groups) + " |"
    rows = [header, "|---:" * (len(groups) + 1) + "|"]
    for concurrency in levels:
        cells = []
        for rounds in by_round:
            speeds = [run[concurrency] for run in rounds if concurrency in run]
            ratios = [
                run[concurrency] / first[concurrency]
                for run, first in zip(rounds, by_round[0])
                if concurrency in run and first.get(concurrency)
            ]
            ratio = f" ({statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x)" if ratios else ""
            cells.append(f"{statistics.median(speeds):.1f}{ratio}" if speeds else "-")
        rows.append(f"| {concurrency} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _rounds(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs by label, the " #n" that `read_runs` gives a repeated label taken off; in order of appearance."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(re.sub(r" #\d+$", "", run["label"]), []).append(run)
    return groups


def _latency_table(summaries: list[LevelSummary]) -> str:
    header = (
        "| concurrency | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | TPOT p50 ms | TPOT p90 ms | TPOT p99 ms "
        "| ITL p50 ms | ITL p90 ms | ITL p99 ms | E2E p50 s | E2E p99 s |"
    )
    rows = [header, "|---:" * 12 + "|"]
    for s in summaries:
        milliseconds = [s.ttft_p50, s.ttft_p90, s.ttft_p99, s.tpot_p50, s.tpot_p90, s.tpot_p99]
        milliseconds += [s.itl_p50, s.itl_p90, s.itl_p99]
        cells = [_ms(value) for value in milliseconds] + [_seconds(s.e2e_p50), _seconds(s.e2e_p99)]
        rows.append(f"| {s.concurrency} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _throughput_table(summaries: list[LevelSummary]) -> str:
    target = f"{summaries[0].ttft_target:g}" if summaries else "?"
    rows = [
        f"| concurrency | requests | failed | wall s | output tokens | output tok/s | requests/s "
        f"| goodput req/s (TTFT <= {target} s) | identical |",
        "|---:" * 9 + "|",
    ]
    for s in summaries:
        rows.append(
            f"| {s.concurrency} | {s.requests} | {s.failed} | {s.wall_time:.2f} | {s.output_tokens} "
            f"| {s.output_tokens_per_second:.1f} | {s.requests_per_second:.2f} | {s.goodput:.2f} | {_identical(s)} |"
        )
    return "\n".join(rows)


def _differing(summaries: list[LevelSummary]) -> str:
    lines = [
        f"- concurrency {s.concurrency}: prompts {', '.join(str(p) for p in s.differing_prompts)} differ from "
        f"concurrency {summaries[0].concurrency}"
        for s in summaries
        if s.differing_prompts
    ]
    return "Outputs that differ from the first level:\n\n" + "\n".join(lines) if lines else ""


def _run_description(results: dict) -> str:
    config, made = results["config"], results["provenance"]
    extra = json.dumps(config["extra_body"]) if config["extra_body"] else "none"
    return "\n".join(
        [
            f"- endpoint: {results['endpoint']['base_url']}, model {results['endpoint']['model']}",
            f"- prompts: {len(config['prompt_ids'])} from {config['prompts']} (first turn of each as the user message)",
            f"- requests per level: {', '.join(map(str, config['requests_per_level']))} "
            f"at concurrency {', '.join(map(str, config['concurrency']))} (closed loop)",
            f"- max_tokens {config['max_tokens']}, temperature {config['temperature']:g}, "
            f"TTFT target {config['ttft_target']:g} s, timeout {config['timeout']:g} s, extra body {extra}",
            f"- started {made['started_at']}: `{made['command_line']}`",
        ]
    )


def _runs_table(runs: list[dict]) -> str:
    rows = ["| run | endpoint | model | extra body | max_tokens | temperature | started |", "|---" * 7 + "|"]
    for run in runs:
        config = run["config"]
        extra = f"`{json.dumps(config['extra_body'])}`" if config["extra_body"] else "-"
        rows.append(
            f"| {run['label']} | {run['endpoint']['base_url']} | {run['endpoint']['model']} | {extra} "
            f"| {config['max_tokens']} | {config['temperature']:g} | {run['provenance']['started_at']} |"
        )
    return "\n".join(rows)


def _metric_table(runs: list[dict], cell: Callable[[LevelSummary], str]) -> str:
    """Rows: every concurrency any run measured; columns: the runs; "-" where a run lacks the level."""
    by_run = [{s.concurrency: s for s in level_summaries(run)} for run in runs]
    levels = sorted({concurrency for summaries in by_run for concurrency in summaries})
    rows = ["| concurrency | " + " | ".join(run["label"] for run in runs) + " |", "|---:" * (len(runs) + 1) + "|"]
    for concurrency in levels:
        cells = [cell(summaries[concurrency]) if concurrency in summaries else "-" for summaries in by_run]
        rows.append(f"| {concurrency} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _plots_section() -> str:
    return "## Plots\n\n" + "\n\n".join(f"{caption}:\n\n![{caption}]({name})" for name, caption in PLOTS.items())


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _seconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def _identical(summary: LevelSummary) -> str:
    return "-" if summary.identical is None else f"{summary.identical:.0%} of {summary.compared}"
