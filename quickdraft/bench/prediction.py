"""The speedup a benchmark's measured costs predict, in the vocabulary of `quickdraft/costs.py`:

    v(k)  measured once per run (`costs.time_forwards` on the median-length prompt)
    c     draft seconds per step / (k * t1), t1 = the baseline's seconds per decode step in the same run
    a     acceptance rate: accepted draft tokens / drafted tokens, every position alike

The i.i.d. prediction (`docs/cost_model.md`) is E(k) / (k*c + v(k)) with E(k) = (1 - a^(k+1)) / (1 - a).
It assumes every step drafts k tokens; drafters that sometimes propose fewer (n-gram lookup
finding no match) are better described by the step-mix prediction, which uses the measured
tau and the measured distribution of draft lengths: tau / (draft per step / t1 + sum_j P(j) v(j)).
Both describe the decode phase (after the first token); compare them with the decode-phase
achieved speedup. Whatever stays between prediction and achievement is overhead.
"""

from quickdraft.costs import expected_tokens


def predicted_speedup(acceptance: float, k: int, draft_cost: float, verify_cost: dict[int, float]) -> float | None:
    """E / (k*c + v(k)); None when v(k) was not measured."""
    if k not in verify_cost:
        return None
    return expected_tokens([acceptance] * k, k) / (k * draft_cost + verify_cost[k])


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
