"""Median milliseconds of whole native forwards (the C++ decoder) for several batch shapes, after a given context:
one sequence feeding 1..N tokens (a decode row, verifications), and S sequences feeding one token each (a batched
decode step), and prompt chunks of several lengths (logits of the last row only). The shapes take turns step by step,
so a slow stretch of a shared machine slows every shape alike and their ratios (v(k) = t(1 x k) / t(1 x 1)) hold. No
profiler: the numbers to compare two checkouts by, run alternately.

    python scripts/forward_times.py --threads 2
    python scripts/forward_times.py --sequences 4 --contexts 64,64,1024,1024  # two short caches, then two long
    PYTHONPATH=/tmp/old TORCH_EXTENSIONS_DIR=/tmp/ext-old python scripts/forward_times.py  # another checkout

docs/native_runtime.md (stops 46 and 50) quotes it.
"""

import argparse
import statistics
import time

import torch

from quickdraft.models.base import SequenceStep
from quickdraft.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="gguf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256, help="cached tokens under every forward")
    parser.add_argument(
        "--contexts", default="", help="comma list: cached tokens of sequence 1, 2, ... (cycled), instead of --context"
    )
    parser.add_argument("--tokens", default="1,2,3,4,5,6,8,10", help="comma list: one sequence feeding this many")
    parser.add_argument(
        "--sequences", default="4,8,16", help="comma list: S (S sequences feeding one token each) or SxT (T each)"
    )
    parser.add_argument("--prompt-chunks", default="", help="comma list: one sequence reading a prompt chunk this long")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runner = load_model(args.model, runtime="native", dtype=args.dtype).runner
    shapes = [(1, int(n), "all") for n in args.tokens.split(",") if n]
    shapes += [(int(s), int(t or 1), "all") for s, _, t in (v.partition("x") for v in args.sequences.split(",") if v)]
    shapes += [(1, int(n), "last") for n in args.prompt_chunks.split(",") if n]
    slots = [runner.open_slot() for _ in range(max(s for s, _, _ in shapes))]
    lengths = [int(n) for n in args.contexts.split(",") if n] or [args.context]
    cached = {slot: lengths[i % len(lengths)] for i, slot in enumerate(slots)}
    for slot in slots:
        runner.forward_batch([SequenceStep(slot, tuple(100 + i % 1000 for i in range(cached[slot])), "none")])
    plans = [
        [SequenceStep(slot, (7,) * tokens, logits) for slot in slots[:sequences]]
        for sequences, tokens, logits in shapes
    ]
    walls = [[] for _ in shapes]
    for i in range(5 + args.steps):  # 5 untimed; the shapes take turns, so a slow stretch of the machine hits all
        for plan, shape_walls in zip(plans, walls):
            started = time.perf_counter()
            runner.forward_batch(plan)
            if i >= 5:
                shape_walls.append(time.perf_counter() - started)
            for step in plan:
                runner.rollback_slot(step.slot, cached[step.slot])
    results = []
    for (sequences, tokens, logits), shape_walls in zip(shapes, walls):
        kind = "x" if logits == "all" else "x prompt "
        results.append(f"{sequences}{kind}{tokens} {statistics.median(shape_walls) * 1e3:.2f}")
    contexts = args.contexts or args.context
    print(f"{args.model} {args.dtype}, {args.threads} threads, {contexts} cached tokens; sequences x tokens, ms:")
    print(" | ".join(results))


if __name__ == "__main__":
    main()
