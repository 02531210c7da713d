"""PNG plots from a results dict (with its "summary"), drawn with matplotlib's Agg backend."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from quickdraft.bench.methods import display_name  # noqa: E402
from quickdraft.bench.summary import BASELINE, OVERALL  # noqa: E402

DPI = 100


def write_plots(results: dict, out_dir: Path) -> list[Path]:
    """Draw the three plots into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    drawers = {
        "speedup_by_category.png": _speedup_by_category,
        "acceptance_by_position.png": _acceptance_by_position,
        "speedup_vs_k.png": _speedup_vs_k,
    }
    paths = []
    for name, draw in drawers.items():
        figure, axes = plt.subplots(figsize=(10, 4.5))
        draw(results, axes)
        axes.set_title(f"{display_name(results['config']['model'])}: {axes.get_title()}", fontsize=10)
        figure.tight_layout()
        figure.savefig(out_dir / name, dpi=DPI)
        plt.close(figure)
        paths.append(out_dir / name)
    return paths


def _speedup_by_category(results: dict, axes) -> None:
    groups = results["summary"]["groups"]
    names = [g for g in groups if g != OVERALL] + [OVERALL]
    methods = [m["name"] for m in results["methods"] if m["name"] != BASELINE]
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        speedups = [groups[g][method]["speedup"] for g in names]
        medians = [s["median"] if s else 0.0 for s in speedups]
        below = [s["median"] - s["min"] if s else 0.0 for s in speedups]
        above = [s["max"] - s["median"] if s else 0.0 for s in speedups]
        positions = [x + (i - (len(methods) - 1) / 2) * width for x in range(len(names))]
        axes.bar(positions, medians, width, yerr=[below, above], capsize=2, label=method)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    axes.set_ylabel(f"speedup vs {BASELINE}")
    axes.set_title("speedup per category")
    axes.legend(fontsize=7, ncol=2)


def _acceptance_by_position(results: dict, axes) -> None:
    figures = results["summary"]["groups"][OVERALL]
    longest = 0  # most draft positions of any method; 0 when none drafted
    for method, f in figures.items():
        rates = f["acceptance_by_position"]
        if rates:
            axes.plot(range(1, len(rates) + 1), rates, marker="o", label=method)
            longest = max(longest, len(rates))
    if not longest:
        axes.text(0.5, 0.5, "no method drafted any token", ha="center", va="center", transform=axes.transAxes)
    axes.set_ylim(0, 1.05)
    axes.set_xticks(range(1, longest + 1))
    axes.set_xlabel("draft position")
    axes.set_ylabel("accepted / drafted at this position")
    axes.set_title("acceptance by draft position (all prompts)")
    if longest:
        axes.legend(fontsize=7)


def _speedup_vs_k(results: dict, axes) -> None:
    figures = results["summary"]["groups"][OVERALL]
    by_drafter: dict[str, list[dict]] = {}
    for method in results["methods"]:
        if method["family"] == "quickdraft" and method["name"] != BASELINE and isinstance(method["k"], int):
            by_drafter.setdefault(method["drafter"], []).append(method)
    for drafter, methods in by_drafter.items():
        _draw_drafter_vs_k(axes, results, drafter, methods)
    peers = [m["name"] for m in results["methods"] if m["family"] != "quickdraft" and figures[m["name"]]["speedup"]]
    for name, style in zip(peers, [":", (0, (1, 4)), (0, (5, 5)), (0, (3, 1, 1, 1)), (0, (1, 1)), (0, (5, 1))]):
        axes.axhline(figures[name]["speedup"]["median"], linestyle=style, linewidth=1.2, color="gray", label=name)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(sorted({m["k"] for methods in by_drafter.values() for m in methods}))
    axes.set_xlabel("k (most draft tokens per step)")
    axes.set_ylabel(f"speedup vs {BASELINE}")
    axes.set_title("speedup vs k (gray: peers, transformers and llama.cpp)")
    axes.legend(fontsize=7)


def _draw_drafter_vs_k(axes, results: dict, drafter: str, methods: list[dict]) -> None:
    """Achieved speedup with its spread over repeats, and both predictions, for one drafter."""
    figures = results["summary"]["groups"][OVERALL]
    costs = results["summary"]["costs"]
    ks = [m["k"] for m in methods]
    achieved = [figures[m["name"]]["speedup"] for m in methods]
    medians = [s["median"] if s else 0.0 for s in achieved]
    spread = [
        [s["median"] - s["min"] if s else 0.0 for s in achieved],
        [s["max"] - s["median"] if s else 0.0 for s in achieved],
    ]
    line = axes.errorbar(ks, medians, yerr=spread, marker="o", capsize=3, label=f"qd:{display_name(drafter)} achieved")
    for key, style, label in (
        ("predicted", "--", "predicted (i.i.d.)"),
        ("predicted_step_mix", "-.", "predicted (step mix)"),
    ):
        predicted = [costs[m["name"]][key] for m in methods]
        if all(p is not None for p in predicted):
            axes.plot(
                ks, predicted, linestyle=style, color=line[0].get_color(), label=f"qd:{display_name(drafter)} {label}"
            )
