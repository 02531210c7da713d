"""Where a batched native forward spends its time: decode steps of many sequences, or one prompt chunk.

    python scripts/batch_profile.py --sequences 8,16 --context 300 --threads 2
    python scripts/batch_profile.py --prompt 128 --context 0 --threads 2

Each of `--sequences` S opens S KV cache slots holding a `--context`-token context, times `--steps` batched forwards
of one token a sequence in the C++ decoder (what a decode step runs), each rolled back, and then profiles the same
forwards in the Python layers (the decoder's operators are C++ calls the profiler does not see), printing the
operators by self CPU time per forward. `--prompt N` does the same for one sequence reading an N-token prompt chunk
after its context (logits of the last row only: what a prefill step runs), per prompt token.
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from quickdraft.models.base import SequenceStep
from quickdraft.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF directory")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", default="8,16", help="comma list of batch sizes (decode steps)")
    parser.add_argument("--prompt", type=int, default=0, help="profile one N-token prompt chunk instead")
    parser.add_argument("--context", type=int, default=300, help="cached tokens before the forward")
    parser.add_argument("--steps", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runner = load_model(args.model, runtime="native", dtype=args.dtype).runner
    vocab = runner.info.vocab_size
    context = tuple((7 * i) % (vocab - 200) + 100 for i in range(args.context))
    batches = [1] if args.prompt else [int(size) for size in args.sequences.split(",")]
    slots = [runner.open_slot() for _ in range(max(batches))]
    if context:
        for slot in slots:
            runner.forward_batch([SequenceStep(slot, context, "none")])
    chunk = tuple((11 * i) % (vocab - 200) + 100 for i in range(args.prompt))

    def forward(sequences: int) -> None:
        if args.prompt:
            runner.forward_batch([SequenceStep(slots[0], chunk, "last")])
        else:
            runner.forward_batch(
                [SequenceStep(slot, (context[-1] if context else 100,), "all") for slot in slots[:sequences]]
            )
        for slot in slots[:sequences]:
            runner.rollback_slot(slot, len(context))

    per = f"per prompt token ({args.prompt})" if args.prompt else "per forward"
    for sequences in batches:
        forward(sequences)
        timings = []
        for _ in range(args.steps):
            started = time.perf_counter()
            forward(sequences)
            timings.append(time.perf_counter() - started)
        scale = 1e3 / (args.prompt or 1)
        label = f"{args.prompt}-token prompt chunk" if args.prompt else f"{sequences} sequences x 1 token"
        print(f"{label} after {args.context} cached tokens: {scale * statistics.median(timings):.2f} ms {per}")
        decoder, runner.decoder = runner.decoder, None  # the Python layers: the operators the profiler sees
        try:
            with profile(activities=[ProfilerActivity.CPU]) as profiled:
                for _ in range(args.steps):
                    forward(sequences)
        finally:
            runner.decoder = decoder
        events = sorted(profiled.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
        total = sum(event.self_cpu_time_total for event in events)
        print(f"  Python layers, {total / 1e3 / args.steps * scale / 1e3:.2f} ms {per}, by operator:")
        for event in events[:8]:
            share = event.self_cpu_time_total / total
            milliseconds = event.self_cpu_time_total / 1e3 / args.steps * scale / 1e3
            print(f"  {event.key:<32} {milliseconds:8.2f} ms {share:6.1%}")


if __name__ == "__main__":
    main()
