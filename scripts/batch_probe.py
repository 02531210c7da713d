"""What a batched native forward costs, per dtype: one target forward over B sequences of r new tokens each,
and a prompt's prefill.

    python scripts/batch_probe.py smollm2-135m-instruct --dtypes int8,bfloat16 --threads 2

Every sequence first reads a 64-token context into its own slot; each shape is then timed `--repeats` times
(rolled back after each) and the median printed with rows per second; then `NativeRunner.prefill` of a
`--prefill`-token prompt. docs/native_runtime.md quotes it.
"""

import argparse
import statistics
import time

import torch

from quickdraft.models.base import SequenceStep
from quickdraft.models.loading import load_model

CONTEXT = tuple(range(100, 164))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="built-in name or HF directory")
    parser.add_argument("--dtypes", default="int8,bfloat16")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--rows", default="1,4", help="new tokens per sequence (1: plain decoding, 4: a 3-token draft)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prefill", type=int, default=400, help="prompt tokens of the prefill timing (default 400)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches, rows = [int(b) for b in args.batches.split(",")], [int(r) for r in args.rows.split(",")]
    print(f"{args.model}, {args.threads} threads, {len(CONTEXT)}-token contexts, median of {args.repeats}")
    print(f"{'dtype':>9} {'batch':>5} {'rows/seq':>8} {'ms':>7} {'rows/s':>7}")
    for dtype in args.dtypes.split(","):
        runner = load_model(args.model, runtime="native", dtype=dtype).runner
        slots = [runner.open_slot() for _ in range(max(batches))]
        runner.forward_batch([SequenceStep(slot, CONTEXT, "none") for slot in slots])
        for batch in batches:
            for n in rows:
                seconds = median_forward(runner, slots[:batch], n, args.repeats)
                print(f"{dtype:>9} {batch:>5} {n:>8} {seconds * 1000:7.1f} {batch * n / seconds:7.0f}", flush=True)
        prompt = list(range(100, 100 + args.prefill))
        seconds = median_seconds(lambda r=runner, p=prompt: r.prefill(p), args.repeats)
        print(f"{dtype:>9} prefill of {args.prefill} tokens: {seconds * 1000:.0f} ms", flush=True)


def median_forward(runner, slots: list[int], n: int, repeats: int) -> float:
    steps = [SequenceStep(slot, tuple(range(200, 200 + n))) for slot in slots]

    def forward() -> None:
        runner.forward_batch(steps)
        for slot in slots:
            runner.rollback_slot(slot, len(CONTEXT))

    return median_seconds(forward, repeats)


def median_seconds(action, repeats: int) -> float:
    """Median seconds of `action` over `repeats` timed calls after an untimed one (kernels pick their plans)."""
    timings = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings[1:])


if __name__ == "__main__":
    main()
