"""Markdown tables, goal checks and a plot for `quickdraft bench-adaptive` results.

`results` is {case: {"speeds" | "cpu_speeds": {group: {setting: tokens/s}}, "mismatches": [...],
"adaptation": {...}, "same_work": {...}, "costs": {...}, "drafters": [...]}} with cases "safety" and/or "quality";
settings are "target", "k=N" ("DRAFTER k=N" when several drafters were compared) and "auto"; "speeds" are
by wall time, "cpu_speeds" by the process's CPU time.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

from quickdraft.bench.adaptive import AUTO, TARGET  # noqa: E402

SAFETY_GOAL = 0.95  # auto / target alone
QUALITY_GOAL = 0.95  # auto / best fixed k of the category


def fixed_labels(speeds: dict[str, float]) -> list[str]:
    """The fixed-k settings, by drafter, then by increasing k."""
    return sorted((s for s in speeds if s not in (TARGET, AUTO)), key=lambda s: (fixed_drafter(s), fixed_k(s)))


def fixed_k(label: str) -> int:
    """k of a fixed setting: "k=3" or "ngram k=3" -> 3."""
    return int(label.rpartition("=")[2])


def fixed_drafter(label: str) -> str:
    """The drafter named in a fixed setting's label ("ngram k=3" -> "ngram"); "" when only one drafter was compared."""
    return label.rpartition(" ")[0]


def markdown(results: dict, command: str) -> str:
    parts = ["## Adaptive speculation", "", f"Command: `{command}`", ""]
    if "safety" in results:
        parts += _safety_section(results["safety"])
    if "quality" in results:
        parts += _quality_section(results["quality"])
    return "\n".join(parts) + "\n"


CLOCKS = {"speeds": "wall time", "cpu_speeds": "CPU time"}


def _safety_section(case: dict) -> list[str]:
    wall, cpu = case["speeds"]["overall"], case["cpu_speeds"]["overall"]
    rows = [
        f"| {s} | {wall[s]:.2f} | {wall[s] / wall[TARGET]:.2f}x | {cpu[s] / cpu[TARGET]:.2f}x |"
        for s in [TARGET, *fixed_labels(wall), AUTO]
    ]
    lines = [
        "### Safety: a random-weight draft model",
        "",
        "| setting | tokens/s (wall) | vs target alone (wall) | vs target alone (CPU time) |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    for key, clock in CLOCKS.items():
        overall = case[key]["overall"]
        ratio, k4 = overall[AUTO] / overall[TARGET], overall.get("k=4", 0.0) / overall[TARGET]
        met = "met" if ratio >= SAFETY_GOAL else "NOT met"
        lines.append(
            f"Goal auto >= {SAFETY_GOAL}x target alone, {clock}: **{ratio:.2f}x, {met}** (fixed k=4: {k4:.2f}x)."
        )
    return lines + [
        _adaptation_line(case["adaptation"]),
        _exactness_line(case["mismatches"]),
        _costs_line(case["costs"]),
        "",
    ]


def _quality_section(case: dict) -> list[str]:
    lines = [f"### Quality: {', '.join(case.get('drafters', ['ngram']))} on the dev prompts", ""]
    for key, clock in CLOCKS.items():
        lines += _quality_table(case[key], clock)
    return lines + [
        _adaptation_line(case["adaptation"]),
        _same_work_line(case["same_work"]),
        _exactness_line(case["mismatches"]),
        _costs_line(case["costs"]),
        "",
    ]


def _quality_table(speeds: dict[str, dict[str, float]], clock: str) -> list[str]:
    labels = fixed_labels(speeds["overall"])
    categories = [group for group in speeds if group != "overall"]
    header = "| category | " + " | ".join(labels) + " | auto | best fixed | auto / best |"
    lines = [f"Speedup over the target alone, {clock}:", "", header, "|" + "---|" * (len(labels) + 4)]
    lines += [_quality_row(group, speeds[group], labels) for group in categories + ["overall"]]
    worst = min(best_fixed(speeds[group], labels)[1] for group in categories)
    overall = speeds["overall"]
    beaten = [s for s in labels if overall[s] >= overall[AUTO]]
    return lines + [
        "",
        f"Goals, {clock}: auto >= {QUALITY_GOAL}x the best fixed k per category: worst category **{worst:.2f}x, "
        f"{'met' if worst >= QUALITY_GOAL else 'NOT met'}**; auto faster than every fixed k overall: "
        f"**{'met' if not beaten else 'NOT met (' + ', '.join(beaten) + ' at least as fast)'}**.",
        "",
    ]


def best_fixed(row: dict[str, float], labels: list[str]) -> tuple[str, float]:
    """The fastest fixed k of a row, and auto's speed relative to it."""
    best = max(labels, key=lambda s: row[s])
    return best, row[AUTO] / row[best]


def _quality_row(group: str, row: dict[str, float], labels: list[str]) -> str:
    best, ratio = best_fixed(row, labels)
    cells = " | ".join(f"{row[s] / row[TARGET]:.2f}" for s in labels)
    name = f"**{group}**" if group == "overall" else group
    return f"| {name} | {cells} | {row[AUTO] / row[TARGET]:.2f} | {best} | {ratio:.2f} |"


def _same_work_line(same: dict) -> str:
    """How far apart two settings that did the same work were timed: the noise under the tables."""
    head = (
        f"Timing noise: in {same['generations']} of {same['of']} generations auto chose exactly "
        f"{same['reference']}'s k at every step"
    )
    if not same["generations"]:
        return head + "."
    return head + (
        f"; there its tokens/s was {same['median']:.3f}x (min {same['min']:.3f}, max {same['max']:.3f}) "
        f"of {same['reference']}'s."
    )


def _adaptation_line(adaptation: dict) -> str:
    return (
        f"Auto's first (cold) request: {adaptation['cold_steps_before_first_plain_step']} drafting steps "
        "before its first "
        f"plain step, {adaptation['cold_drafting_steps']} drafting steps of {adaptation['cold_steps']}; over all its "
        f"requests it drafted on {adaptation['drafting_share']:.0%} of steps, mean k {adaptation['mean_k']:.2f}."
    )


def _costs_line(costs: dict) -> str:
    def describe(profile: dict) -> str:
        drafts = "".join(f", {name} {ratio:.2f} t(1)/token" for name, ratio in profile["draft_per_token_vs_t1"].items())
        return (
            f"t(1) {profile['t1_ms']:.0f} ms, v(k) = t(k+1)/t(1) for k = 0.. "
            + " ".join(f"{v:.2f}" for v in profile["v"])
            + drafts
        )

    return f"Cost model at the start: {describe(costs['start'])}; at the end: {describe(costs['end'])}."


def _exactness_line(mismatches: list[str]) -> str:
    return (
        "Every setting produced exactly the target's tokens."
        if not mismatches
        else f"DIFFERENT outputs: {', '.join(mismatches)}."
    )


def plot(results: dict, path: Path) -> None:
    """Speedup vs fixed k (solid) with auto as a dashed line, per case (columns) and clock (rows);
    1.0 = target alone."""
    cases = [c for c in ("safety", "quality") if c in results]
    figure, axes = plt.subplots(len(CLOCKS), len(cases), figsize=(5.5 * len(cases), 4 * len(CLOCKS)), squeeze=False)
    for row_axes, (key, clock) in zip(axes, CLOCKS.items()):
        for axis, case in zip(row_axes, cases):
            _plot_case(axis, results[case][key], include_categories=case == "quality")
            axis.set(title=f"{case}, {clock}", xlabel="fixed k", ylabel="speedup over target alone")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_case(axis, speeds: dict[str, dict[str, float]], include_categories: bool) -> None:
    """One line per category and drafter; with several drafters only the overall lines, one colour each."""
    drafters = sorted({fixed_drafter(s) for s in fixed_labels(speeds["overall"])})
    several = len(drafters) > 1
    groups = [g for g in speeds if g != "overall"] + ["overall"] if include_categories and not several else ["overall"]
    for group in groups:
        row = speeds[group]
        heavy = group == "overall"
        style = dict(linewidth=2.5 if heavy else 0.8, alpha=1.0 if heavy else 0.6)
        for drafter in drafters:
            labels = [s for s in fixed_labels(row) if fixed_drafter(s) == drafter]
            color = "black" if heavy and not several else None
            (line,) = axis.plot(
                [fixed_k(s) for s in labels],
                [row[s] / row[TARGET] for s in labels],
                marker="o",
                label=f"{group} {drafter}".strip(),
                color=color,
                **style,
            )
        axis.axhline(
            row[AUTO] / row[TARGET],
            linestyle="--",
            color="black" if several else line.get_color(),
            linewidth=style["linewidth"],
            label=f"{group} auto" if several else None,
        )
    axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    axis.legend(fontsize=6, ncol=2)
