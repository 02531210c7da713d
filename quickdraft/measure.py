"""The one measurement toolkit of the benchmarks: a record per generation and the interleaved loop.

Every tool that compares ways of generating (`bench`, `bench-adaptive`, `bench-runtime`'s n-gram rows,
distill's engine evaluation) measures a generation into a `Generation` and runs its methods with
`interleave`: for each repeat, for each prompt, every method once, in an order that rotates by one from
prompt to prompt and from repeat to repeat, so drifting machine load (other jobs, thermal state) falls
on all methods alike. Forward timings are `costs.time_forwards`; tau and acceptance are `stats`.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine
from quickdraft.stats import acceptance_rate, tau


@dataclass(frozen=True)
class Generation:
    """One generation by one method. A *step* is a target forward that yields `accepted + 1` tokens.

    For quickdraft the prefill is not a step; for transformers every target forward is one (its
    assisted loop verifies the first draft together with the prompt). Per-position and per-step
    counts exist only where the method exposes them (None otherwise).
    """

    token_ids: tuple[int, ...]  # output tokens, EOS excluded
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    wall_seconds: float  # the whole generation call, prefill included
    cpu_seconds: float  # the process's CPU time over the same call (other processes' load does not inflate it)
    time_to_first_token: float
    target_forwards: int  # every forward of the target, prefill included
    steps: int
    draft_tokens: int  # draft tokens the target verified
    accepted_tokens: int
    verify_seconds: float  # target forwards of the steps (plus verification, for quickdraft)
    draft_seconds: float | None = None  # time spent drafting (None: not separable)
    drafted_by_position: tuple[int, ...] | None = None  # [i]: steps that drafted a token at position i
    accepted_by_position: tuple[int, ...] | None = None  # [i]: steps that accepted the token at position i
    accepted_length_histogram: tuple[int, ...] | None = None  # [n]: steps that accepted exactly n tokens
    k_per_step: tuple[int, ...] | None = None  # [steps]: tokens drafted at each step, in order
    drafter_steps: dict[str, int] | None = None  # steps that drafted, by drafter; "none": plain steps

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return tau(self.accepted_tokens, self.steps)

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    def to_dict(self) -> dict:
        """Its fields (sequences as lists) and the rates derived from them."""
        return {
            **{key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()},
            "new_tokens": self.new_tokens,
            "tokens_per_second": self.tokens_per_second,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_rate": self.acceptance_rate,
        }

    @staticmethod
    def from_dict(record: dict) -> "Generation":
        """The generation `to_dict` wrote (derived rates and any other keys ignored)."""
        values = {f.name: record[f.name] for f in fields(Generation) if f.name in record}
        return Generation(**{key: tuple(v) if isinstance(v, list) else v for key, v in values.items()})


def measure(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig | None = None
) -> Generation:
    """Generate with the engine (its own spec, or `spec`) and record it: wall and CPU clocks around the call."""
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    result = engine.generate(prompt_ids, params, spec=spec)
    cpu_seconds, wall_seconds = time.process_time() - cpu_started, time.perf_counter() - wall_started
    stats = result.stats
    return Generation(
        token_ids=tuple(result.token_ids),
        finish_reason=result.finish_reason,
        wall_seconds=wall_seconds,
        cpu_seconds=cpu_seconds,
        time_to_first_token=stats.prefill_seconds,
        target_forwards=stats.target_forwards,
        steps=stats.steps,
        draft_tokens=stats.draft_tokens,
        accepted_tokens=stats.accepted_tokens,
        verify_seconds=stats.verify_seconds,
        draft_seconds=stats.draft_seconds,
        drafted_by_position=tuple(stats.drafted_by_position),
        accepted_by_position=tuple(stats.accepted_by_position),
        accepted_length_histogram=tuple(stats.accepted_length_histogram),
        k_per_step=tuple(stats.k_per_step),
        drafter_steps=dict(stats.drafter_steps),
    )


@dataclass(frozen=True)
class Trial:
    """One generation of one prompt by one method in an interleaved run."""

    repeat: int
    prompt: int  # index in the run's prompt list
    category: str  # the prompt's category
    method: str  # the method's label
    order: int  # its place among the methods on this prompt and repeat (0: ran first)
    generation: Generation

    def to_dict(self) -> dict:
        return {
            "repeat": self.repeat,
            "prompt": self.prompt,
            "category": self.category,
            "method": self.method,
            "order": self.order,
            **self.generation.to_dict(),
        }

    @staticmethod
    def from_dict(record: dict) -> "Trial":
        keys = ("repeat", "prompt", "category", "method", "order")
        return Trial(*(record[key] for key in keys), Generation.from_dict(record))


RunOne = Callable[[str, int, int], Generation]  # (method, prompt index, repeat) -> its generation


def interleave(
    methods: Sequence[str],
    categories: Sequence[str],
    repeats: int,
    run: RunOne,
    on_trial: Callable[[Trial], None] = lambda trial: None,
) -> list[Trial]:
    """Every method on every prompt (`categories`: each prompt's category), `repeats` times. On prompt i of
    repeat r the methods start at index (r * prompts + i) mod len(methods) and wrap around. `on_trial` sees
    each trial as it ends (progress)."""
    trials, prompts = [], len(categories)
    for repeat in range(repeats):
        for index, category in enumerate(categories):
            shift = (repeat * prompts + index) % len(methods)
            for order, method in enumerate([*methods[shift:], *methods[:shift]]):
                trial = Trial(repeat, index, category, method, order, run(method, index, repeat))
                trials.append(trial)
                on_trial(trial)
    return trials
