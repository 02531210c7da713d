"""The figures of each concurrency level, from its raw requests.

Latencies are over the level's successful requests: TTFT and end-to-end latency one value per
request, TPOT one per request with at least two output tokens, ITL one per gap between content
chunks (all requests' gaps pooled). Aggregate output tokens/s is every successful request's output
tokens over the level's wall time; requests/s and goodput (requests whose TTFT is within the target)
are per second of that wall time too. Exactness, at temperature 0 only: each successful request's
text against its prompt's text at the first level (its first successful request there).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from quickdraft.bench.serve.client import RequestResult
from quickdraft.bench.serve.load import LevelRun


def percentile(values: Sequence[float], percent: float) -> float | None:
    """The `percent`th percentile, interpolated linearly between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = percent / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class LevelSummary:
    """One level's figures. Latencies in seconds; None where no request gave a value."""

    concurrency: int
    requests: int
    failed: int
    wall_time: float  # seconds
    output_tokens: int  # of the successful requests
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_p99: float | None
    itl_p50: float | None
    itl_p90: float | None
    itl_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    output_tokens_per_second: float  # aggregate over the level
    requests_per_second: float  # successful requests
    goodput: float  # successful requests per second with TTFT <= ttft_target
    ttft_target: float  # seconds
    identical: float | None  # fraction of compared outputs equal to the first level's; None unless temperature 0
    compared: int  # outputs compared
    differing_prompts: tuple[int | str, ...]  # prompt ids with an output unlike the first level's

    @classmethod
    def from_dict(cls, record: dict) -> "LevelSummary":
        return cls(**record | {"differing_prompts": tuple(record["differing_prompts"])})


def summarize(levels: Sequence[LevelRun], temperature: float, ttft_target: float) -> list[LevelSummary]:
    """One LevelSummary per level, in run order."""
    references = first_texts(levels[0].requests) if temperature == 0 and levels else None
    return [summarize_level(level, ttft_target, references) for level in levels]


def level_summaries(results: dict) -> list[LevelSummary]:
    """The level summaries of a results dict (results.json, read back)."""
    return [LevelSummary.from_dict(record) for record in results["summary"]["levels"]]


def first_texts(requests: Sequence[RequestResult]) -> dict[int | str, str]:
    """Each prompt's text in its first successful request."""
    texts: dict[int | str, str] = {}
    for request in requests:
        if request.ok:
            texts.setdefault(request.prompt_id, request.text)
    return texts


def summarize_level(level: LevelRun, ttft_target: float, references: dict[int | str, str] | None) -> LevelSummary:
    ok = [request for request in level.requests if request.ok]
    ttfts = [request.ttft for request in ok if request.ttft is not None]
    tpots = [request.tpot for request in ok if request.tpot is not None]
    itls = [gap for request in ok for gap in request.inter_token_latencies]
    e2es = [request.e2e for request in ok]
    output_tokens = sum(request.output_tokens for request in ok)
    wall = level.wall_time
    on_time = sum(1 for ttft in ttfts if ttft <= ttft_target)
    identical, compared, differing = _exactness(ok, references)
    return LevelSummary(
        concurrency=level.concurrency,
        requests=len(level.requests),
        failed=len(level.requests) - len(ok),
        wall_time=wall,
        output_tokens=output_tokens,
        ttft_p50=percentile(ttfts, 50),
        ttft_p90=percentile(ttfts, 90),
        ttft_p99=percentile(ttfts, 99),
        tpot_p50=percentile(tpots, 50),
        tpot_p90=percentile(tpots, 90),
        tpot_p99=percentile(tpots, 99),
        itl_p50=percentile(itls, 50),
        itl_p90=percentile(itls, 90),
        itl_p99=percentile(itls, 99),
        e2e_p50=percentile(e2es, 50),
        e2e_p99=percentile(e2es, 99),
        output_tokens_per_second=output_tokens / wall if wall > 0 else 0.0,
        requests_per_second=len(ok) / wall if wall > 0 else 0.0,
        goodput=on_time / wall if wall > 0 else 0.0,
        ttft_target=ttft_target,
        identical=identical,
        compared=compared,
        differing_prompts=differing,
    )


def _exactness(
    ok: Sequence[RequestResult], references: dict[int | str, str] | None
) -> tuple[float | None, int, tuple[int | str, ...]]:
    """(fraction identical, outputs compared, prompt ids that differ); (None, 0, ()) without references."""
    if references is None:
        return None, 0, ()
    compared = [request for request in ok if request.prompt_id in references]
    differing = [request.prompt_id for request in compared if request.text != references[request.prompt_id]]
    fraction = 1 - len(differing) / len(compared) if compared else None
    return fraction, len(compared), tuple(dict.fromkeys(differing))
