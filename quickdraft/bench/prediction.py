"""The cost model of speculation, measured: v(k), c and a, and the speedup they predict.

    v(k)  time of one target forward over k + 1 tokens (the pending token plus k drafts) divided
          by the time of a forward over 1 token; v(0) = 1.
    c     drafting time per drafted position, in target forwards: draft seconds per step / (k * t1),
          t1 = the baseline's seconds per decode step in the same run.
    a     acceptance rate: accepted draft tokens / drafted tokens.

The i.i.d. prediction (ENGINEERING.md) is E / (k*c + v(k)) with E = (1 - a^(k+1)) / (1 - a).
It assumes every step drafts k tokens; drafters that sometimes propose fewer (n-gram lookup
finding no match) are better described by the step-mix prediction, which uses the measured
tau and the measured distribution of draft lengths: tau / (draft per step / t1 + sum_j P(j) v(j)).
Both describe the decode phase (after the first token); compare them with the decode-phase
achieved speedup. Whatever stays between prediction and achievement is overhead.
"""

import statistics
import time

from quickdraft.models.base import ModelRunner


def measure_forward_seconds(
    runner: ModelRunner, prompt_ids: list[int], max_tokens: int, repeats: int = 5
) -> dict[int, float]:
    """Median seconds of one forward over n new tokens after `prompt_ids`, for n = 1..max_tokens.

    Each size runs once untimed first (kernels pick their plans per shape). Sizes are interleaved
    within each repeat so drift affects all alike; the cache is rolled back after every forward,
    so each one sees the same context.
    """
    filler = (prompt_ids * (max_tokens // len(prompt_ids) + 1))[:max_tokens]  # any tokens will do
    runner.prefill(prompt_ids)
    context = runner.cache_length
    samples: dict[int, list[float]] = {n: [] for n in range(1, max_tokens + 1)}
    for timed in [False] + [True] * repeats:
        for n in samples:
            started = time.perf_counter()
            runner.forward(filler[:n])
            if timed:
                samples[n].append(time.perf_counter() - started)
            runner.rollback(context)
    return {n: statistics.median(times) for n, times in samples.items()}


def relative_verify_cost(forward_seconds: dict[int, float]) -> dict[int, float]:
    """v(k) for k = 0..max: forward over k + 1 tokens relative to a forward over 1 token."""
    one = forward_seconds[1]
    return {n - 1: seconds / one for n, seconds in forward_seconds.items()}


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """E = (1 - a^(k+1)) / (1 - a): mean tokens per step with i.i.d. acceptance a and k drafts."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def predicted_speedup(acceptance: float, k: int, draft_cost: float, verify_cost: dict[int, float]) -> float | None:
    """E / (k*c + v(k)); None when v(k) was not measured."""
    if k not in verify_cost:
        return None
    return expected_tokens_per_step(acceptance, k) / (k * draft_cost + verify_cost[k])


def step_mix_speedup(
    tau: float, draft_forwards_per_step: float, draft_length_shares: dict[int, float], verify_cost: dict[int, float]
) -> float | None:
    """tau / (drafting per step + mean verify cost over the measured draft lengths); None if a v(j) is missing."""
    if any(j not in verify_cost for j in draft_length_shares):
        return None
    mean_verify = sum(share * verify_cost[j] for j, share in draft_length_shares.items())
    return tau / (draft_forwards_per_step + mean_verify)


def draft_length_shares(steps: int, drafted_by_position: list[int]) -> dict[int, float]:
    """P(a step drafted exactly j tokens), from counts of steps that drafted position i (i = 0..)."""
    if steps == 0:
        return {}
    at_least = [steps, *drafted_by_position, 0]  # [j]: steps that drafted >= j tokens
    return {
        j: (at_least[j] - at_least[j + 1]) / steps for j in range(len(at_least) - 1) if at_least[j] > at_least[j + 1]
    }
