"""What a step costs and yields: the one vocabulary of the engine, the controller and the benchmarks.

Derived in `docs/cost_model.md`. For a step that drafts k tokens (so the target is fed n = k + 1):

    t(n)   seconds of one target step over n fed tokens (the engine's: forward, verification, rollback)
    v(k)   t(k + 1) / t(1): what verifying k drafts costs, in plain decoding steps; v(0) = 1
    c      drafting seconds per drafted token / t(1)
    a_i    acceptance at draft position i given positions 1..i-1 were accepted
    E(k)   1 + sum_{i<=k} prod_{j<=i} a_j: expected tokens of the step (`expected_tokens`)

and the speedup of drafting k tokens every step over plain decoding is E(k) / (k c + v(k)).
`time_forwards` is the one timer of target forwards (calibration, `bench`, `bench-runtime`).

`TargetCost` models t(n), the time of a target step that feeds n tokens (the pending token plus n - 1 draft
tokens, verification and rollback included), as `scale * shape[n]`; a batched step that feeds n rows for s
sequences costs `scale * (shape[n] + (s - 1) * per_sequence)` (each sequence attends over its own cache).
`calibrate_target` measures the shape once per engine (medians of repeated forwards of 1..max_tokens tokens
after a short prefill; for a batch, sizes up to its most rows on a sparse grid, linear in between, and the
per-sequence cost from a batch of 1-token sequences); every step then refines it from its own timing: a
persistent change hitting every size (another process taking the CPU, a longer context) moves `scale`, a
change at one of the sizes timed one by one (1..max_tokens of the calibration) moves that size. The batch
sizes past them are interpolated from a sparse grid and only `scale` moves them: refined one by one, a step's
noise at the size it ran would make the next sizes look cheaper than it (a draft's rows for free). Updates are
exponential moving averages in log space with clipped residuals, so one stall cannot swing a decision, and the
shape drifts back towards the calibrated one when a size is not observed: a size once timed slow (say during a
stall) and then never chosen again cannot stay overpriced for ever. `DraftCost` is the same idea for a model
drafter: seconds per drafted token, plus seconds per token of context it must catch up on when it has not
drafted for a while (its cache then lags the committed text).
"""

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Drafter
from quickdraft.models.base import BatchRunner, ModelRunner, SequenceStep, synchronize

SCALE_RATE = 0.1  # weight of one step's timing in the shared scale
SHAPE_RATE = 0.1  # weight of one step's timing in the cost of its own size
SHAPE_REVERSION = 0.02  # pull of every size's shape towards its calibrated value, per observed step
DRAFT_RATE = 0.2  # weight of one step's timing in a drafter's costs
CATCH_UP_THRESHOLD = 4  # a drafter this many tokens behind (or more) is timed as catching up
MAX_LOG_RESIDUAL = math.log(2.0)  # one timing moves an estimate as if it were at most 2x off
CALIBRATION_CONTEXT = 32  # tokens prefilled before timing forwards
CALIBRATION_REPEATS = 3  # timings per size at least; the median is kept
CALIBRATION_MAX_REPEATS = 15  # fast models are timed again until CALIBRATION_SECONDS have passed
CALIBRATION_SECONDS = 0.25
BATCH_GRID = (12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # rows timed past max_tokens when calibrating for a batch


class TargetCost:
    """t(n): seconds of one target step that feeds n tokens (in s sequences: plus (s - 1) * per_sequence)."""

    def __init__(self, seconds: Sequence[float], per_sequence: float = 0.0, refined_sizes: int | None = None) -> None:
        self._calibrated = list(seconds)  # [max_tokens]: t(1), t(2), ... as calibrated
        self._shape = list(seconds)  # [max_tokens]: as refined
        self._scale = 1.0
        self.per_sequence = per_sequence  # seconds each further sequence of a batched step adds, at scale 1
        self._refined_sizes = len(self._shape) if refined_sizes is None else refined_sizes  # t(1..this) refined

    @property
    def max_tokens(self) -> int:
        return len(self._shape)

    @property
    def refined_sizes(self) -> int:
        """Steps over 1..refined_sizes tokens refine their own size; larger ones move only `scale`."""
        return self._refined_sizes

    @property
    def scale(self) -> float:
        """How much slower than at calibration the target runs now (every size alike)."""
        return self._scale

    def seconds(self, tokens: int, sequences: int = 1) -> float:
        """t(tokens) for a step of `sequences` sequences. Not forced to grow with `tokens`: kernels differ by
        size, and a size that is measured cheaper (say 4 tokens cheaper than 3 on a CPU GEMM) is worth choosing.
        Past the calibrated sizes, the last two extend linearly."""
        return self.seconds_from(tokens, 1, sequences)[0]

    def seconds_from(self, tokens: int, count: int, sequences: int = 1) -> list[float]:
        """[count] t(tokens), t(tokens + 1), ... for a step of `sequences` sequences, in one call: every running
        request prices its draft against them every step."""
        extra = (sequences - 1) * self.per_sequence
        if tokens + count - 1 <= len(self._shape):
            return [self._scale * (shape + extra) for shape in self._shape[tokens - 1 : tokens - 1 + count]]
        return [self._scale * (self._shape_at(n) + extra) for n in range(tokens, tokens + count)]

    def observe(self, tokens: int, seconds: float, sequences: int = 1) -> None:
        self._shape = [
            shape * (calibrated / shape) ** SHAPE_REVERSION for shape, calibrated in zip(self._shape, self._calibrated)
        ]
        residual = _clipped_log_ratio(seconds, self.seconds(tokens, sequences))
        self._scale *= math.exp(SCALE_RATE * residual)
        if tokens <= self.refined_sizes:
            self._shape[tokens - 1] *= math.exp(SHAPE_RATE * residual)

    def _shape_at(self, tokens: int) -> float:
        if tokens <= self.max_tokens:
            return self._shape[tokens - 1]
        slope = self._shape[-1] - self._shape[-2] if self.max_tokens > 1 else self._shape[-1]
        return self._shape[-1] + (tokens - self.max_tokens) * max(slope, 0.0)


class DraftCost:
    """Seconds a model drafter spends: per drafted token, and per token it is behind the context."""

    def __init__(self, seconds_per_token: float, seconds_per_catch_up_token: float = 0.0) -> None:
        self.seconds_per_token = seconds_per_token
        self.seconds_per_catch_up_token = seconds_per_catch_up_token

    def observe(self, tokens: int, behind: int, seconds: float) -> None:
        """A proposal of `tokens` tokens made `behind` tokens after the drafter's last one took `seconds`."""
        if behind < CATCH_UP_THRESHOLD:
            residual = _clipped_log_ratio(seconds / tokens, self.seconds_per_token)
            self.seconds_per_token *= math.exp(DRAFT_RATE * residual)
            return
        catch_up = max(seconds - tokens * self.seconds_per_token, 0.0) / behind  # rarely seen: a plain average
        self.seconds_per_catch_up_token += DRAFT_RATE * (catch_up - self.seconds_per_catch_up_token)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E(k): tokens a step yields when drafting the first k of a proposal (the target's token included).

    acceptance[i - 1] is a_i; with every a_i = a this is (1 - a^(k+1)) / (1 - a)."""
    total, all_accepted = 1.0, 1.0
    for rate in acceptance[:k]:
        all_accepted *= rate
        total += all_accepted
    return total


def time_forwards(
    runner: ModelRunner,
    context_ids: list[int],
    sizes: Sequence[int],
    min_rounds: int,
    max_rounds: int | None = None,
    min_seconds: float = 0.0,
    with_rollback: bool = False,
) -> dict[int, float]:
    """Median seconds of a target forward over n new tokens after `context_ids`, for each n in `sizes` (with
    the rollback after it when `with_rollback`: the engine's step pays both; the benchmarks' v(k) times the
    forward alone).

    The context is prefilled once (the cache is left holding it). Each size runs once untimed (first calls
    allocate; kernels pick their plans per shape), then in interleaved rounds, so drifting load hits every size
    alike: `min_rounds`, and more while `min_seconds` have not passed, up to `max_rounds`. Every forward is
    followed by a rollback, so each one sees the same context. The new tokens repeat the context's.
    """
    filler = (context_ids * (max(sizes) // len(context_ids) + 1))[: max(sizes)]
    runner.prefill(context_ids)
    context = runner.cache_length

    def forward(n: int) -> float:
        started = time.perf_counter()
        runner.forward(filler[:n])
        synchronize(runner.device)
        forwarded = time.perf_counter()
        runner.rollback(context)
        return (time.perf_counter() if with_rollback else forwarded) - started

    for n in sizes:
        forward(n)
    started, rounds = time.perf_counter(), []  # [rounds][sizes]
    while len(rounds) < min_rounds or (
        time.perf_counter() - started < min_seconds and len(rounds) < (max_rounds or min_rounds)
    ):
        rounds.append([forward(n) for n in sizes])
    return {n: statistics.median(timings) for n, timings in zip(sizes, zip(*rounds))}


def relative_costs(forward_seconds: dict[int, float]) -> dict[int, float]:
    """v(k) for every k whose t(k + 1) was timed, from {n: t(n)}."""
    return {n - 1: seconds / forward_seconds[1] for n, seconds in forward_seconds.items()}


def calibrate_target(runner: ModelRunner, max_tokens: int, max_batch: int = 1) -> TargetCost:
    """t(1..max_tokens) after a short dummy prefill (the cache is left dirty), in rounds for about
    CALIBRATION_SECONDS; for a batch, t up to max_batch * max_tokens rows (on `BATCH_GRID`, linear in
    between) and the per-sequence cost."""
    max_rows = max_tokens * max_batch
    sizes = [*range(1, max_tokens + 1), *sorted({n for n in BATCH_GRID if max_tokens < n < max_rows} | {max_rows})]
    context = _dummy_context(runner.info.vocab_size)
    seconds = time_forwards(
        runner,
        context,
        sorted(set(sizes)),
        min_rounds=CALIBRATION_REPEATS,
        max_rounds=CALIBRATION_MAX_REPEATS,
        min_seconds=CALIBRATION_SECONDS,
        with_rollback=True,
    )
    shape = _interpolated(seconds, max_rows)
    if max_batch == 1 or not isinstance(runner, BatchRunner):
        return TargetCost(shape)
    batch_seconds = _time_batch_of_single_tokens(runner, context, max_batch)
    per_sequence = max(batch_seconds - shape[max_batch - 1], 0.0) / (max_batch - 1)
    return TargetCost(shape, per_sequence, refined_sizes=max_tokens)


def _interpolated(seconds: dict[int, float], max_rows: int) -> list[float]:
    """[max_rows] t(1..max_rows) from the timed sizes, linear between them."""
    timed = sorted(seconds)
    shape = []
    for n in range(1, max_rows + 1):
        upper = next(size for size in timed if size >= n)
        lower = max((size for size in timed if size <= n), default=upper)
        weight = 0.0 if upper == lower else (n - lower) / (upper - lower)
        shape.append(seconds[lower] + weight * (seconds[upper] - seconds[lower]))
    return shape


def _time_batch_of_single_tokens(runner: BatchRunner, context: list[int], sequences: int) -> float:
    """Median seconds of one batched forward of `sequences` sequences feeding 1 token each after `context`."""
    slots = [runner.open_slot() for _ in range(sequences)]
    runner.forward_batch([SequenceStep(slot, tuple(context), "none") for slot in slots])

    def forward() -> None:
        runner.forward_batch([SequenceStep(slot, (context[0],)) for slot in slots])
        synchronize(runner.device)
        for slot in slots:
            runner.rollback_slot(slot, len(context))

    forward()
    seconds = _median_seconds(forward)
    for slot in slots:
        runner.close_slot(slot)
    return seconds


def calibrate_drafter(drafter: Drafter, target: ModelRunner, tokens: int = 3, behind: int = 16) -> DraftCost:
    """Time greedy proposals on a dummy context: one `behind` tokens after the last, then `tokens`-token ones.

    A drafter that reads the target's hidden states is given the target's real states of the
    dummy context (one prefill of the target), as the engine would give them.
    """
    context = _dummy_context(target.info.vocab_size)
    states = _target_states(drafter, target, context)  # [len(context) - 1, d] or None
    drafter.begin(context, SamplingParams(), torch.Generator())
    _observe(drafter, states, 0, len(context) - behind - 1)
    drafter.propose(context[:-behind], 1)  # warm-up, and the cache now lags the context by `behind` tokens
    _observe(drafter, states, len(context) - behind - 1, len(context) - 1)
    started = time.perf_counter()
    drafter.propose(context, 1)
    catch_up_seconds = time.perf_counter() - started
    per_token = max(_median_seconds(lambda: drafter.propose(context, tokens)), 1e-9) / tokens
    return DraftCost(per_token, max(catch_up_seconds - per_token, 0.0) / behind)


def _target_states(drafter: Drafter, target: ModelRunner, context: list[int]) -> torch.Tensor | None:
    if not drafter.target_layers:
        return None
    _, hidden = target.prefill(context[:-1], hidden_layers=drafter.target_layers)  # [len(context) - 1, layers * d]
    return hidden


def _observe(drafter: Drafter, states: torch.Tensor | None, begin: int, end: int) -> None:
    if states is not None:
        drafter.observe_target(states[begin:end])


def _dummy_context(vocab_size: int) -> list[int]:
    return [token % vocab_size for token in range(1, CALIBRATION_CONTEXT + 1)]


def _median_seconds(action: Callable[[], object]) -> float:
    timings = []
    for _ in range(CALIBRATION_REPEATS):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def _clipped_log_ratio(measured: float, predicted: float) -> float:
    ratio = math.log(max(measured, 1e-9) / max(predicted, 1e-9))
    return min(max(ratio, -MAX_LOG_RESIDUAL), MAX_LOG_RESIDUAL)
