"""What speculation did during one generation, and the one definition of the rates derived from it.

`tau`, `acceptance_rate` and `acceptance_by_position` are what every report means by those words: the
engine's stats, the server's `speculation` field, the benchmarks (pooled over generations) and the head
cards (which also give the share of steps accepting each position, under its own name).
"""

from dataclasses import dataclass, field


def tau(accepted_tokens: int, steps: int) -> float:
    """Mean accepted length: tokens per step, the target's own token included (1.0 for plain decoding)."""
    return (accepted_tokens + steps) / steps if steps else 1.0


def acceptance_rate(accepted_tokens: int, draft_tokens: int) -> float | None:
    """Accepted draft tokens / drafted tokens; None when nothing was drafted."""
    return accepted_tokens / draft_tokens if draft_tokens else None


def acceptance_by_position(accepted: list[int], drafted: list[int]) -> list[float]:
    """[i]: steps that accepted the token at draft position i / steps that drafted one there."""
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


@dataclass
class GenerationStats:
    """Counters and timers of one generation; filled in by the engine as it runs.

    A *step* is one target forward after the prefill: it verifies `drafted` tokens (0 for plain
    decoding) and yields `accepted + 1` tokens (before truncation by EOS, stop strings or limits).
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0  # tokens in the output (EOS and text cut by a stop string excluded)
    target_forwards: int = 0  # the prefill plus one per step
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafted_by_position: list[int] = field(default_factory=list)  # [i]: steps that drafted a token at position i
    accepted_by_position: list[int] = field(default_factory=list)  # [i]: steps that accepted a token at position i
    accepted_length_histogram: list[int] = field(default_factory=list)  # [n]: steps that accepted exactly n tokens
    k_histogram: list[int] = field(
        default_factory=list
    )  # [k]: steps that drafted exactly k tokens (the chosen k under auto)
    k_per_step: list[int] = field(default_factory=list)  # [steps]: tokens drafted at each step, in order
    drafter_steps: dict[str, int] = field(default_factory=dict)  # steps that drafted, by drafter; "none": plain steps
    prefill_seconds: float = 0.0  # prompt forward and first token: time to first token
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target forwards of the steps plus verification
    total_seconds: float = 0.0

    def record_step(self, drafted: int, accepted: int, drafter: str = "none") -> None:
        self.steps += 1
        self.target_forwards += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        _grow(self.drafted_by_position, drafted)
        _grow(self.accepted_by_position, drafted)
        _grow(self.accepted_length_histogram, accepted + 1)
        for position in range(drafted):
            self.drafted_by_position[position] += 1
        for position in range(accepted):
            self.accepted_by_position[position] += 1
        self.accepted_length_histogram[accepted] += 1
        _grow(self.k_histogram, drafted + 1)
        self.k_histogram[drafted] += 1
        self.k_per_step.append(drafted)
        used = drafter if drafted else "none"
        self.drafter_steps[used] = self.drafter_steps.get(used, 0) + 1

    @property
    def acceptance_rate(self) -> float:
        """`acceptance_rate`, 0 when nothing was drafted."""
        return acceptance_rate(self.accepted_tokens, self.draft_tokens) or 0.0

    @property
    def mean_accepted_length(self) -> float:
        """`tau`."""
        return tau(self.accepted_tokens, self.steps)

    @property
    def acceptance_by_position(self) -> list[float]:
        return acceptance_by_position(self.accepted_by_position, self.drafted_by_position)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "target_forwards": self.target_forwards,
            "steps": self.steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_by_position": self.acceptance_by_position,
            "accepted_length_histogram": list(self.accepted_length_histogram),
            "k_histogram": list(self.k_histogram),
            "k_per_step": list(self.k_per_step),
            "drafter_steps": dict(self.drafter_steps),
            "time_to_first_token": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "total_seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second,
        }


def _grow(counts: list[int], size: int) -> None:
    counts.extend([0] * (size - len(counts)))
