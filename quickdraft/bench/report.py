"""report.md from a results dict (with its "summary"): tables overall, by category, cost model."""

from quickdraft.bench.summary import BASELINE, HF_BASELINE, OVERALL

PLOTS = {
    "speedup_by_category.png": "Speedup per category per method (bars: median over repeats; whiskers: min-max)",
    "acceptance_by_position.png": "Acceptance rate by draft position",
    "speedup_vs_k.png": "Speedup vs k, achieved (solid) and predicted from measured a, c, v(k) (dashed)",
}


def render_report(results: dict) -> str:
    """The whole report as Markdown."""
    summary = results["summary"]
    sections = [
        _header(results),
        "## Overall\n\n" + method_table(summary["groups"][OVERALL]),
        "## Speedup by category\n\n" + category_matrix(summary["groups"], [m["name"] for m in results["methods"]]),
        _cost_section(results),
        _acceptance_section(summary["groups"][OVERALL]),
        _time_split_section(summary["groups"][OVERALL]),
        _per_category_section(summary["groups"]),
        "## Plots\n\n" + "\n\n".join(f"{caption}:\n\n![{caption}]({name})" for name, caption in PLOTS.items()),
    ]
    return "\n\n".join(sections) + "\n"


def method_table(figures: dict[str, dict]) -> str:
    """One row per method: tokens/s, speedups with spread, tau, acceptance, identical, TTFT; with llama.cpp's
    methods in the run, also the speedup over the fastest of them."""
    llama_cpp = any(f.get("speedup_vs_llama_cpp") for f in figures.values())
    peer_header, peer_rule = (" vs fastest llama.cpp |", "---:|") if llama_cpp else ("", "")
    lines = [
        f"| method | tok/s | speedup vs {BASELINE} | speedup vs {HF_BASELINE} |{peer_header} "
        "tau | acceptance | identical | TTFT ms |",
        f"|---|---:|---:|---:|{peer_rule}---:|---:|---:|---:|",
    ]
    for name, f in figures.items():
        peer = f" {speedup_cell(f.get('speedup_vs_llama_cpp'))} |" if llama_cpp else ""
        lines.append(
            f"| {name} | {f['tokens_per_second']:.1f} | {speedup_cell(f['speedup'])} "
            f"| {speedup_cell(f['speedup_vs_hf'])} |{peer} "
            f"{f['tau']:.2f} | {_percent(f['acceptance'])} | {_percent(f['identical'])} "
            f"| {f['time_to_first_token'] * 1000:.0f} |"
        )
    return "\n".join(lines)


def category_matrix(groups: dict[str, dict], methods: list[str]) -> str:
    """Rows: categories then overall; columns: methods; cells: median speedup vs the baseline."""
    shown = [m for m in methods if m != BASELINE]
    lines = ["| category | prompts | " + " | ".join(shown) + " |", "|---|---:|" + "---:|" * len(shown)]
    for group in [g for g in groups if g != OVERALL] + [OVERALL]:
        figures = groups[group]
        cells = " | ".join(_median_cell(figures[m]["speedup"]) for m in shown)
        label = f"**{group}**" if group == OVERALL else group
        lines.append(f"| {label} | {figures[BASELINE]['prompts']} | {cells} |")
    return "\n".join(lines)


def speedup_cell(speedup: dict | None) -> str:
    """ "1.23x (1.18-1.27)": median over repeats with the min-max range; "-" when undefined."""
    if speedup is None:
        return "-"
    if len(speedup["by_repeat"]) == 1:
        return f"{speedup['median']:.2f}x"
    return f"{speedup['median']:.2f}x ({speedup['min']:.2f}-{speedup['max']:.2f})"


def _header(results: dict) -> str:
    meta, config, machine = results["meta"], results["config"], results["meta"]["machine"]
    git = meta["git"]
    categories = sorted({p["category"] for p in results["prompts"]})
    limit = f"first {config['limit']} of each category" if config["limit"] else "all prompts"
    return "\n".join(
        [
            f"# quickdraft bench: {config['model']}",
            "",
            f"Command: `{meta['command_line']}`",
            "",
            f"- prompts: {len(results['prompts'])} from `{meta['dataset']['path']}` "
            f"({limit}; {len(categories)} categories), "
            "first turn"
            f"{' through the chat template' if meta['chat_template'] else ' as plain text (no chat template)'}",
            f"- generation: max {config['max_new_tokens']} new tokens, temperature {config['temperature']}, "
            "EOS honoured; "
            f"{config['repeats']} repeats, methods interleaved in rotated order",
            f"- machine: {machine['cpu']}, {machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads, "
            f"load average {machine['load_average'][0]:.1f} at start, "
            f"{meta['machine_at_end']['load_average'][0]:.1f} at end",
            f"- versions: python {meta['versions']['python']}, torch {meta['versions']['torch']}, transformers "
            f"{meta['versions']['transformers']}; quickdraft commit {git['commit'] or 'unknown'}"
            f"{' (uncommitted changes)' if git['dirty'] else ''}; "
            f"runtime {config['runtime']} (runner {meta.get('runner', 'not recorded')}), "
            f"dtype {config.get('run_dtype', config['dtype'])}{_weight_forms(meta)}",
            f"- run: {meta['started_at']} to {meta['finished_at']}",
            "",
            "Speedup = mean over prompts of tokens/s (new tokens / wall time of the whole generation, prefill "
            "included) of a method, divided by the same for the baseline, per repeat; shown as the median over "
            "repeats with the min-max range. tau = tokens per target forward step; identical = greedy output "
            f"token-identical to {BASELINE}.",
        ]
    )


def _cost_section(results: dict) -> str:
    verify = results["verify_cost"]
    context = results.get("cost_context_tokens")
    where = f"after a {context}-token prompt, " if context else ""
    v_header = "| k | " + " | ".join(verify) + " |\n|---|" + "---:|" * len(verify)
    v_row = "| v(k) | " + " | ".join(f"{v:.2f}" for v in verify.values()) + " |"
    lines = [
        "| method | k | a | c | v(k) | E | predicted (i.i.d.) | predicted (step mix) | achieved (decode) | achieved |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c in results["summary"]["costs"].items():
        lines.append(
            f"| {name} | {c['k']} | {c['acceptance']:.2f} | {_number(c['draft_cost'], 3)} "
            f"| {_number(c['verify_cost'])} "
            f"| {_number(c['expected_tokens_per_step'])} | {_ratio_cell(c['predicted'])} "
            f"| {_ratio_cell(c['predicted_step_mix'])} "
            f"| {_median_cell(c['achieved_decode'])} | {_median_cell(c['achieved'])} |"
        )
    return "\n".join(
        [
            "## Cost model: predicted vs achieved",
            "",
            f"v(k): one target forward over k + 1 tokens relative to one over 1 token (medians, measured {where}once, "
            "before the timed runs):",
            "",
            v_header,
            v_row,
            "",
            "a = acceptance rate; c = drafting time per drafted position in target forwards; "
            "E = (1 - a^(k+1)) / (1 - a). "
            "Predicted (i.i.d.) = E / (k c + v(k)), assuming k drafts every step; "
            "predicted (step mix) = tau / (drafting "
            "per step + mean v over the measured draft lengths). Both describe the decode phase: compare with achieved "
            "(decode), which leaves out the time to the first token. The gap is overhead.",
            "",
            *lines,
        ]
    )


def _acceptance_section(figures: dict[str, dict]) -> str:
    lines = [
        "## Acceptance",
        "",
        "| method | acceptance by draft position | accepted-length histogram (0, 1, ...) |",
        "|---|---|---|",
    ]
    for name, f in figures.items():
        if f["acceptance_by_position"]:
            positions = " ".join(f"{rate:.2f}" for rate in f["acceptance_by_position"])
            lines.append(f"| {name} | {positions} | {f['accepted_length_histogram']} |")
    return "\n".join(lines)


def _time_split_section(figures: dict[str, dict]) -> str:
    lines = [
        "## Time split (all generations)",
        "",
        "verify = target forwards of the steps (plus verification for quickdraft); draft = drafting (quickdraft "
        "only; transformers does not expose it).",
        "",
        "| method | new tokens | target forwards | wall s | draft s | verify s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, f in figures.items():
        lines.append(
            f"| {name} | {f['new_tokens']} | {f['target_forwards']} | {f['wall_seconds']:.1f} "
            f"| {_number(f['draft_seconds'], 1)} | {f['verify_seconds']:.1f} |"
        )
    return "\n".join(lines)


def _per_category_section(groups: dict[str, dict]) -> str:
    parts = ["## Per category"]
    for group, figures in groups.items():
        if group != OVERALL:
            parts.append(f"### {group} (prompts: {figures[BASELINE]['prompts']})\n\n" + method_table(figures))
    return "\n\n".join(parts)


def _median_cell(speedup: dict | None) -> str:
    return "-" if speedup is None else f"{speedup['median']:.2f}x"


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _weight_forms(meta: dict) -> str:
    """ " (matrices: int4 120, int8 1)" from the run's record of its matrix forms; empty when not recorded."""
    forms = meta.get("weights") or {}
    return f" (matrices: {', '.join(f'{form} {count}' for form, count in forms.items())})" if forms else ""
