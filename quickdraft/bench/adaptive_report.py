"""Markdown tables, goal checks and a plot for `quickdraft bench-adaptive` results.

`results` is {case: {"speeds": {group: {setting: tokens/s}}, "mismatches": [...], "adaptation": {...}}}
with cases "safety" and/or "quality"; settings are "target", "k=N" and "auto".
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

from quickdraft.bench.adaptive import AUTO, TARGET  # noqa: E402

SAFETY_GOAL = 0.95  # auto / target alone
QUALITY_GOAL = 0.95  # auto / best fixed k of the category


def fixed_labels(speeds: dict[str, float]) -> list[str]:
    """The fixed-k settings, by increasing k."""
    return sorted((s for s in speeds if s.startswith("k=")), key=lambda s: int(s[2:]))


def markdown(results: dict, command: str) -> str:
    parts = ["## Adaptive speculation", "", f"Command: `{command}`", ""]
    if "safety" in results:
        parts += _safety_section(results["safety"])
    if "quality" in results:
        parts += _quality_section(results["quality"])
    return "\n".join(parts) + "\n"


def _safety_section(case: dict) -> list[str]:
    overall = case["speeds"]["overall"]
    target = overall[TARGET]
    rows = [f"| {s} | {overall[s]:.2f} | {overall[s] / target:.2f}x |" for s in [TARGET, *fixed_labels(overall), AUTO]]
    ratio = overall[AUTO] / target
    k4 = overall.get("k=4", 0.0) / target
    met = "met" if ratio >= SAFETY_GOAL else "NOT met"
    return [
        "### Safety: a random-weight draft model", "",
        "| setting | tokens/s | vs target alone |", "|---|---|---|", *rows, "",
        f"Goal auto >= {SAFETY_GOAL}x target alone: **{ratio:.2f}x, {met}** (fixed k=4: {k4:.2f}x).",
        _adaptation_line(case["adaptation"]), _exactness_line(case["mismatches"]), _costs_line(case["costs"]), "",
    ]


def _quality_section(case: dict) -> list[str]:
    speeds = case["speeds"]
    labels = fixed_labels(speeds["overall"])
    categories = [group for group in speeds if group != "overall"]
    header = "| category | " + " | ".join(labels) + " | auto | best fixed | auto / best |"
    lines = ["### Quality: ngram on the dev prompts", "", "Speedup over the target alone:", "", header,
             "|" + "---|" * (len(labels) + 4)]
    lines += [_quality_row(group, speeds[group], labels) for group in categories + ["overall"]]
    worst = min(_best_fixed(speeds[group], labels)[1] for group in categories)
    overall = speeds["overall"]
    beaten = [s for s in labels if overall[s] >= overall[AUTO]]
    lines += [
        "",
        f"Goal auto >= {QUALITY_GOAL}x the best fixed k per category: worst category **{worst:.2f}x, "
        f"{'met' if worst >= QUALITY_GOAL else 'NOT met'}**. Goal auto faster than every fixed k overall: "
        f"**{'met' if not beaten else 'NOT met (' + ', '.join(beaten) + ' at least as fast)'}**.",
        _adaptation_line(case["adaptation"]), _exactness_line(case["mismatches"]), _costs_line(case["costs"]), "",
    ]
    return lines


def _best_fixed(row: dict[str, float], labels: list[str]) -> tuple[str, float]:
    """The fastest fixed k of a row, and auto's speed relative to it."""
    best = max(labels, key=lambda s: row[s])
    return best, row[AUTO] / row[best]


def _quality_row(group: str, row: dict[str, float], labels: list[str]) -> str:
    best, ratio = _best_fixed(row, labels)
    cells = " | ".join(f"{row[s] / row[TARGET]:.2f}" for s in labels)
    name = f"**{group}**" if group == "overall" else group
    return f"| {name} | {cells} | {row[AUTO] / row[TARGET]:.2f} | {best} | {ratio:.2f} |"


def _adaptation_line(adaptation: dict) -> str:
    return (
        f"Auto's first (cold) request: {adaptation['cold_steps_before_first_plain_step']} drafting steps before its first "
        f"plain step, {adaptation['cold_drafting_steps']} drafting steps of {adaptation['cold_steps']}; over all its "
        f"requests it drafted on {adaptation['drafting_share']:.0%} of steps, mean k {adaptation['mean_k']:.2f}."
    )


def _costs_line(costs: dict) -> str:
    def describe(profile: dict) -> str:
        drafts = "".join(f", {name} {ratio:.2f} t(1)/token" for name, ratio in profile["draft_per_token_vs_t1"].items())
        return f"t(1) {profile['t1_ms']:.0f} ms, v(n) = t(n)/t(1) for n = 1.. " + " ".join(f"{v:.2f}" for v in profile["v"]) + drafts

    return f"Cost model at the start: {describe(costs['start'])}; at the end: {describe(costs['end'])}."


def _exactness_line(mismatches: list[str]) -> str:
    return "Every setting produced exactly the target's tokens." if not mismatches else f"DIFFERENT outputs: {', '.join(mismatches)}."


def plot(results: dict, path: Path) -> None:
    """Speedup vs fixed k per case (overall), with auto as a horizontal line and 1.0 = target alone."""
    cases = [c for c in ("safety", "quality") if c in results]
    figure, axes = plt.subplots(1, len(cases), figsize=(5.5 * len(cases), 4), squeeze=False)
    for axis, case in zip(axes[0], cases):
        speeds = results[case]["speeds"]
        groups = ["overall"] if case == "safety" else [g for g in speeds if g != "overall"] + ["overall"]
        for group in groups:
            row = speeds[group]
            labels = fixed_labels(row)
            ks = [int(s[2:]) for s in labels]
            emphasis = dict(linewidth=2.5, color="black") if group == "overall" else dict(linewidth=0.8, alpha=0.5)
            line, = axis.plot(ks, [row[s] / row[TARGET] for s in labels], marker="o", label=group, **emphasis)
            axis.axhline(row[AUTO] / row[TARGET], linestyle="--", color=line.get_color(), linewidth=emphasis["linewidth"])
        axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        axis.set(title=f"{case}: fixed k (solid) vs auto (dashed)", xlabel="fixed k", ylabel="speedup over target alone")
        axis.legend(fontsize=6, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
