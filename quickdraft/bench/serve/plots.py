"""latency.png and throughput.png of bench-serve, one line per run, drawn with matplotlib's Agg backend.

x: concurrency on a log2 axis. latency.png: TTFT p50 (solid) and p99 (dashed), and TPOT p50, in ms.
throughput.png: aggregate output tokens/s, and goodput in requests/s.
"""

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from quickdraft.bench.serve.summary import LevelSummary, level_summaries  # noqa: E402

DPI = 100
MS = 1000  # seconds -> milliseconds


def write_plots(runs: list[dict], out_dir: Path) -> list[Path]:
    """Draw both plots of `runs` (results dicts) into `out_dir`; returns their paths."""
    lines = [(run["label"], sorted(level_summaries(run), key=lambda s: s.concurrency)) for run in runs]
    title = lines[0][0] if len(lines) == 1 else f"{len(lines)} runs"
    paths = []
    for name, draw in {"latency.png": _latency, "throughput.png": _throughput}.items():
        figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        draw(lines, axes)
        for side in axes:
            _concurrency_axis(side, lines)
        figure.suptitle(title, fontsize=10)
        figure.tight_layout()
        figure.savefig(Path(out_dir) / name, dpi=DPI)
        plt.close(figure)
        paths.append(Path(out_dir) / name)
    return paths


def _latency(lines: list[tuple[str, list[LevelSummary]]], axes) -> None:
    ttft, tpot = axes
    for label, summaries in lines:
        x = [s.concurrency for s in summaries]
        p50 = ttft.plot(x, _scaled([s.ttft_p50 for s in summaries], MS), marker="o", label=f"{label} p50")
        color = p50[0].get_color()
        ttft.plot(x, _scaled([s.ttft_p99 for s in summaries], MS), "--", marker="x", color=color, label=f"{label} p99")
        tpot.plot(x, _scaled([s.tpot_p50 for s in summaries], MS), marker="o", color=color, label=label)
    ttft.set_ylabel("time to first token, ms")
    ttft.set_title("TTFT p50 (solid) and p99 (dashed)")
    tpot.set_ylabel("time per output token, ms")
    tpot.set_title("TPOT p50")


def _throughput(lines: list[tuple[str, list[LevelSummary]]], axes) -> None:
    tokens, goodput = axes
    for label, summaries in lines:
        x = [s.concurrency for s in summaries]
        tokens.plot(x, [s.output_tokens_per_second for s in summaries], marker="o", label=label)
        goodput.plot(x, [s.goodput for s in summaries], marker="o", label=label)
    tokens.set_ylabel("output tokens/s, all requests together")
    tokens.set_title("aggregate output tokens/s")
    target = {s.ttft_target for _, summaries in lines for s in summaries}
    goodput.set_ylabel("requests/s")
    goodput.set_title(f"goodput (TTFT <= {target.pop():g} s)" if len(target) == 1 else "goodput (TTFT within target)")


def _concurrency_axis(axes, lines: list[tuple[str, list[LevelSummary]]]) -> None:
    levels = sorted({s.concurrency for _, summaries in lines for s in summaries})
    axes.set_xscale("log", base=2)
    axes.set_xticks(levels, [str(c) for c in levels])
    axes.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # only the measured levels are labelled
    axes.set_xlabel("concurrency (requests in flight)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)


def _scaled(values: list[float | None], factor: float) -> list[float]:
    """Values times `factor`; None (no request gave one) becomes NaN, a gap in the line."""
    return [float("nan") if value is None else value * factor for value in values]
