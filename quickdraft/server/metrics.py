"""Prometheus metrics of the server, in the text exposition format (version 0.0.4).

Names follow vLLM's (`vllm:spec_decode_num_accepted_tokens_per_pos` ...) with a `quickdraft_`
prefix and Prometheus' `_total` suffix on counters. Written here rather than with
`prometheus_client`: one process, a dozen series, and no extra dependency to install.
Counters and histograms are updated by the engine worker thread and read by the HTTP thread,
so every update and every rendering holds one lock.
"""

import bisect
import math
import threading
from dataclasses import dataclass, field

from quickdraft.stats import GenerationStats

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    values: dict[Labels, float] = field(default_factory=dict)

    def add(self, amount: float, labels: Labels = ()) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def lines(self) -> list[str]:
        return [f"{self.name}{_labels(labels)} {_number(value)}" for labels, value in sorted(self.values.items())]


@dataclass
class _Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    kind: str = "histogram"

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # [len(buckets) + 1] per bucket, not cumulative; last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self) -> list[str]:
        cumulative = 0
        lines = []
        for bound, count in zip((*self.buckets, math.inf), self.counts):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        return lines + [f"{self.name}_sum {_number(self.total)}", f"{self.name}_count {cumulative}"]


class ServerMetrics:
    """Every series the server exports; `render(running, waiting)` gives the /metrics body."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = _Family(
            "quickdraft_request_success_total",
            "counter",
            "Ended requests, by finish reason (abort: client gone or shutdown; error: the engine failed).",
            _zeros("finished_reason", ("stop", "length", "abort", "error")),
        )
        self.rejected = _Family(
            "quickdraft_request_rejected_total",
            "counter",
            "Requests refused before running, by reason.",
            _zeros("reason", ("queue_full",)),
        )
        self.prompt_tokens = _Family(
            "quickdraft_prompt_tokens_total", "counter", "Prompt tokens of started requests.", {(): 0.0}
        )
        self.generation_tokens = _Family(
            "quickdraft_generation_tokens_total", "counter", "Generated tokens of finished requests.", {(): 0.0}
        )
        self.drafts = _Family(
            "quickdraft_spec_decode_num_drafts_total",
            "counter",
            "Steps that verified at least one draft token.",
            {(): 0.0},
        )
        self.draft_tokens = _Family(
            "quickdraft_spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", {(): 0.0}
        )
        self.accepted_tokens = _Family(
            "quickdraft_spec_decode_num_accepted_tokens_total",
            "counter",
            "Draft tokens accepted by the target.",
            {(): 0.0},
        )
        self.accepted_per_pos = _Family(
            "quickdraft_spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Accepted draft tokens, by position in the draft (0 = first).",
        )
        self.ttft = _Histogram(
            "quickdraft_time_to_first_token_seconds",
            "Queueing to the first output text (waiting in the queue included).",
            TTFT_BUCKETS,
        )
        self.tpot = _Histogram(
            "quickdraft_time_per_output_token_seconds", "Time per output token after the first.", TPOT_BUCKETS
        )
        self.e2e = _Histogram(
            "quickdraft_e2e_request_latency_seconds", "Queueing to the last output token.", E2E_BUCKETS
        )
        self.itl = _Histogram(
            "quickdraft_inter_token_latency_seconds",
            "Time between a stream's consecutive engine steps (each may carry several tokens).",
            TPOT_BUCKETS,
        )
        self.batch_size = _Histogram(
            "quickdraft_batch_size", "Sequences in one engine step's target forward.", BATCH_BUCKETS
        )
        self.batch_rows = _Histogram(
            "quickdraft_batch_rows",
            "Tokens fed in one engine step's target forward (prefill chunks and drafts).",
            ROWS_BUCKETS,
        )

    def observe_step(self, sequences: int, rows: int) -> None:
        with self._lock:
            self.batch_size.observe(sequences)
            self.batch_rows.observe(rows)

    def observe_inter_token(self, seconds: float) -> None:
        with self._lock:
            self.itl.observe(seconds)

    def count_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected.add(1, (("reason", reason),))

    def count_started(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens.add(prompt_tokens)

    def count_aborted(self) -> None:
        with self._lock:
            self.requests.add(1, (("finished_reason", "abort"),))

    def count_failed(self) -> None:
        with self._lock:
            self.requests.add(1, (("finished_reason", "error"),))

    def count_finished(self, finish_reason: str, stats: GenerationStats, timing: "RequestTiming") -> None:
        with self._lock:
            self.requests.add(1, (("finished_reason", finish_reason),))
            self.generation_tokens.add(stats.generated_tokens)
            self.drafts.add(stats.drafted_by_position[0] if stats.drafted_by_position else 0)
            self.draft_tokens.add(stats.draft_tokens)
            self.accepted_tokens.add(stats.accepted_tokens)
            for position, accepted in enumerate(stats.accepted_by_position):
                self.accepted_per_pos.add(accepted, (("position", str(position)),))
            self.ttft.observe(timing.first_token - timing.queued)
            self.e2e.observe(timing.finished - timing.queued)
            if stats.generated_tokens > 1:
                self.tpot.observe((timing.finished - timing.first_token) / (stats.generated_tokens - 1))

    def render(self, running: int, waiting: int) -> str:
        gauges = [
            _Family(
                "quickdraft_num_requests_running",
                "gauge",
                "Requests in the engine's batch (at most --max-batch).",
                {(): running},
            ),
            _Family("quickdraft_num_requests_waiting", "gauge", "Requests queued for the engine.", {(): waiting}),
        ]
        with self._lock:
            families = [
                *gauges,
                self.requests,
                self.rejected,
                self.prompt_tokens,
                self.generation_tokens,
                self.drafts,
                self.draft_tokens,
                self.accepted_tokens,
                self.accepted_per_pos,
                self.ttft,
                self.tpot,
                self.itl,
                self.e2e,
                self.batch_size,
                self.batch_rows,
            ]
            blocks = [[f"# HELP {f.name} {f.help}", f"# TYPE {f.name} {f.kind}", *f.lines()] for f in families]
        return "\n".join(line for block in blocks for line in block) + "\n"


@dataclass(frozen=True)
class RequestTiming:
    """perf_counter() readings of one request."""

    queued: float  # the request was queued for the engine
    first_token: float  # the first output text (or the end, for an empty output) was handed out
    finished: float


def _zeros(label: str, values: tuple[str, ...]) -> dict[Labels, float]:
    """A labelled counter's series at 0, so they exist (and rate() works) before the first event."""
    return {((label, value),): 0.0 for value in values}


def _labels(labels: Labels) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels) + "}" if labels else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return repr(int(value)) if float(value).is_integer() else repr(value)
