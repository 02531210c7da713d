"""What `kernels.attend` alone costs per call (one layer's attention), on smollm2's shapes by default: a decode row,
a 5-row verification, 16 sequences' decode rows and a 128-row prompt block, over contexts of several lengths; the
prompt block also through `layers.attention` (one masked product, torch's flash kernel: what prompt blocks ran
before stop 46, and still run off the CPU).

    python scripts/attend_cost.py --threads 2
    QUICKDRAFT_KERNELS_ISA=avx2 python scripts/attend_cost.py --contexts 256,1024

A bfloat16 cache of 4 layers' worth of sequences, read in turn (so a call does not find the previous call's cache
in the processor's caches); the median over `--repeats` passes of 30 calls. Prints microseconds per call and
thread-nanoseconds per query head and position. docs/native_runtime.md (stops 44, 46 and 47) quotes it.
"""

import argparse
import statistics
import time

import torch

from quickdraft.models.native.kernels import attend, built_instruction_set
from quickdraft.models.native.layers import attention, block_mask

CASES = (
    (1, 1, "decode row"),
    (5, 1, "verification, 5 rows"),
    (1, 16, "16 sequences' decode rows"),
    (128, 1, "prompt block, 128 rows"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="256,1024", help="comma list of cached positions")
    parser.add_argument("--shape", default="3,3,64", help="key heads, query heads per key head, head size")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kv_heads, group, head_dim = map(int, args.shape.split(","))
    print(f"kernels: {built_instruction_set()}, {args.threads} threads, shape {args.shape}")
    for rows, sequences, label in CASES:
        for context in map(int, args.contexts.split(",")):
            seconds = time_calls(rows, sequences, context, kv_heads, group, head_dim, args.repeats)
            per_query = seconds / (sequences * rows * kv_heads * group * context) * args.threads
            print(f"{label:<27} context {context:>5}: {seconds * 1e6:8.1f} us a call, {per_query * 1e9:5.2f} thread-ns")
            if rows >= 128:
                masked = time_calls(rows, 1, context, kv_heads, group, head_dim, args.repeats, masked_product=True)
                print(f"{'  as one masked product':<27} context {context:>5}: {masked * 1e6:8.1f} us a call")


def time_calls(
    rows: int,
    sequences: int,
    context: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    repeats: int,
    masked_product: bool = False,
):
    """Median seconds of one call: `rows` consecutive rows of each of `sequences` sequences, the last row reading
    `context` + rows positions (`masked_product`: one sequence's rows as a prompt block through
    `layers.attention`)."""
    capacity, layers = context + rows, 4
    caches = [
        [torch.randn(kv_heads, capacity, head_dim).to(torch.bfloat16) for _ in range(2 * sequences)]
        for _ in range(layers)
    ]
    queries = torch.randn(rows * sequences, kv_heads * group, head_dim).to(torch.bfloat16)
    sequence = torch.arange(sequences).repeat_interleave(rows)  # [R]
    begin = torch.zeros(rows * sequences, dtype=torch.long)  # [R]
    end = (context + 1 + torch.arange(rows)).repeat(sequences)  # [R]: row r of a sequence reads r more
    mask = block_mask(context, rows, None, torch.bfloat16, torch.device("cpu"))  # [rows, context + rows]
    passes = []
    for _ in range(repeats):
        started = time.perf_counter()
        for call in range(30):
            cache = caches[call % layers]
            if masked_product:
                attention(queries, cache[0], cache[1], head_dim**-0.5, mask)
            else:
                attend(queries, cache[:sequences], cache[sequences:], sequence, begin, end, head_dim**-0.5)
        passes.append((time.perf_counter() - started) / 30)
    return statistics.median(passes)


if __name__ == "__main__":
    main()
