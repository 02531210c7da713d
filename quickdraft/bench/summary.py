"""Aggregation of raw measurements into the numbers reports and plots show.

Speedup follows Spec-Bench: within one repeat, the mean over prompts of tokens/s of a method
divided by the same mean for the baseline; the spread is shown over repeats (median, min, max).
Counts (tau, acceptance, histograms) are pooled over every generation of a group.
"""

import statistics
from collections import defaultdict

from quickdraft.bench.prediction import draft_length_shares, predicted_speedup, step_mix_speedup
from quickdraft.costs import expected_tokens
from quickdraft.stats import acceptance_by_position, acceptance_rate, tau

OVERALL = "overall"
BASELINE = "qd:none"  # quickdraft's target alone: the denominator of every speedup
HF_BASELINE = "hf:greedy"  # transformers' plain greedy generate: the peers' denominator
LLAMA_CPP = "llama.cpp"  # the family of llama.cpp's methods; the fastest of them is a third denominator


def summarize(results: dict) -> dict:
    """{"groups": {group: {method: figures}}, "costs": {method: cost-model figures}} for a results dict."""
    rows = results["measurements"]
    groups = {OVERALL: rows}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    methods = [m["name"] for m in results["methods"]]
    verify_cost = {int(k): v for k, v in results["verify_cost"].items()}
    peer = fastest(rows, [m["name"] for m in results["methods"] if m["family"] == LLAMA_CPP])
    return {
        "groups": {
            name: {m: method_figures(group_rows, m, peer) for m in methods} for name, group_rows in groups.items()
        },
        "costs": {
            m["name"]: cost_figures(rows, m, verify_cost)
            for m in results["methods"]
            if m["family"] == "quickdraft" and m["name"] != BASELINE
        },
    }


def fastest(rows: list[dict], methods: list[str]) -> str | None:
    """The method with the highest median over repeats of its mean tokens/s over prompts (None: no methods)."""
    rates = {
        m: statistics.median(_per_repeat_means([r for r in rows if r["method"] == m], "tokens_per_second").values())
        for m in methods
    }
    return max(rates, key=rates.get, default=None)


def method_figures(rows: list[dict], method: str, llama_cpp: str | None = None) -> dict:
    """Throughput, speedups (vs quickdraft baseline, transformers greedy and `llama_cpp`, the fastest llama.cpp
    mode overall), tau, acceptance, identity."""
    own = [r for r in rows if r["method"] == method]
    tps = _per_repeat_means(own, "tokens_per_second")
    identical = [r["identical_to_baseline"] for r in own if r["identical_to_baseline"] is not None]
    return {
        "prompts": len({r["prompt"] for r in own}),
        "generations": len(own),
        "new_tokens": sum(r["new_tokens"] for r in own),
        "wall_seconds": sum(r["wall_seconds"] for r in own),
        "target_forwards": sum(r["target_forwards"] for r in own),
        "tokens_per_second": statistics.median(tps.values()),
        "tokens_per_second_by_repeat": [tps[r] for r in sorted(tps)],
        "speedup": _speedup(rows, method, BASELINE, "tokens_per_second"),
        "speedup_vs_hf": _speedup(rows, method, HF_BASELINE, "tokens_per_second"),
        "speedup_vs_llama_cpp": _speedup(rows, method, llama_cpp, "tokens_per_second") if llama_cpp else None,
        "decode_speedup": _speedup(rows, method, BASELINE, "decode_tokens_per_second"),
        "tau": _pooled_tau(own),
        "acceptance": acceptance_rate(sum(r["accepted_tokens"] for r in own), sum(r["draft_tokens"] for r in own)),
        "identical": _ratio(sum(identical), len(identical)),
        "time_to_first_token": statistics.median(r["time_to_first_token"] for r in own),
        "draft_seconds": None if any(r["draft_seconds"] is None for r in own) else sum(r["draft_seconds"] for r in own),
        "verify_seconds": sum(r["verify_seconds"] for r in own),
        "acceptance_by_position": _pooled_positions(own),
        "accepted_length_histogram": _pooled_counts(own, "accepted_length_histogram"),
    }


def cost_figures(rows: list[dict], method: dict, verify_cost: dict[int, float]) -> dict:
    """Measured a, c, v(k) of a quickdraft method and the speedups they predict (decode phase)."""
    own = [r for r in rows if r["method"] == method["name"]]
    baseline = [r for r in rows if r["method"] == BASELINE]
    steps = sum(r["steps"] for r in own)
    seconds_per_plain_step = sum(r["verify_seconds"] for r in baseline) / max(sum(r["steps"] for r in baseline), 1)
    draft_per_step = sum(r["draft_seconds"] for r in own) / max(steps, 1) / seconds_per_plain_step  # in target forwards
    acceptance = acceptance_rate(sum(r["accepted_tokens"] for r in own), sum(r["draft_tokens"] for r in own)) or 0.0
    k = method["k"] if isinstance(method["k"], int) else None
    draft_cost = draft_per_step / k if k else None
    shares = draft_length_shares(steps, _pooled_counts(own, "drafted_by_position") or [])
    return {
        "k": method["k"],
        "acceptance": acceptance,
        "draft_cost": draft_cost,
        "draft_forwards_per_step": draft_per_step,
        "verify_cost": verify_cost.get(k) if k is not None else None,
        "draft_length_shares": {str(j): share for j, share in shares.items()},
        "expected_tokens_per_step": expected_tokens([acceptance] * k, k) if k else None,
        "predicted": predicted_speedup(acceptance, k, draft_cost, verify_cost) if k else None,
        "predicted_step_mix": step_mix_speedup(_pooled_tau(own), draft_per_step, shares, verify_cost),
        "achieved_decode": _speedup(rows, method["name"], BASELINE, "decode_tokens_per_second"),
        "achieved": _speedup(rows, method["name"], BASELINE, "tokens_per_second"),
    }


def decode_tokens_per_second(row: dict) -> float | None:
    """Tokens after the first one, over the time after the first one (None for 0 or 1 tokens)."""
    decode_seconds = row["wall_seconds"] - row["time_to_first_token"]
    return (row["new_tokens"] - 1) / decode_seconds if row["new_tokens"] > 1 and decode_seconds > 0 else None


def _per_repeat_means(rows: list[dict], rate: str) -> dict[int, float]:
    """{repeat: mean over prompts of the rate}; prompts where the rate is undefined are left out."""
    values = defaultdict(list)
    for row in rows:
        value = decode_tokens_per_second(row) if rate == "decode_tokens_per_second" else row[rate]
        if value is not None:
            values[row["repeat"]].append(value)
    return {repeat: statistics.mean(v) for repeat, v in values.items()}


def _speedup(rows: list[dict], method: str, baseline: str, rate: str) -> dict | None:
    """Per repeat: mean rate of `method` / mean rate of `baseline`; median, min, max over repeats."""
    own = _per_repeat_means([r for r in rows if r["method"] == method], rate)
    base = _per_repeat_means([r for r in rows if r["method"] == baseline], rate)
    ratios = [own[r] / base[r] for r in sorted(own) if r in base and base[r] > 0]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "by_repeat": ratios}


def _pooled_tau(rows: list[dict]) -> float:
    return tau(sum(r["accepted_tokens"] for r in rows), sum(r["steps"] for r in rows))


def _pooled_counts(rows: list[dict], key: str) -> list[int] | None:
    """Element-wise sum of a per-row count list (None when the method does not expose it)."""
    if any(r[key] is None for r in rows):
        return None
    total: list[int] = []
    for row in rows:
        total.extend([0] * (len(row[key]) - len(total)))
        for i, count in enumerate(row[key]):
            total[i] += count
    return total


def _pooled_positions(rows: list[dict]) -> list[float] | None:
    drafted = _pooled_counts(rows, "drafted_by_position")
    accepted = _pooled_counts(rows, "accepted_by_position")
    if drafted is None or accepted is None:
        return None
    return acceptance_by_position(accepted, drafted)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None
