"""What each weight format's CPU matrix product costs at smollm2-135m's shapes: int8 per row
(`_weight_int8pack_mm`, today's default), int4 in 32-column groups (`_weight_int4pack_mm_for_cpu`, the kernel
a GGUF Q4_0/Q4_1/Q4_K matrix maps onto exactly) and dense bfloat16, for 1, 5 and 9 rows.

    python scripts/kernel_probe.py --threads 2

Random weights of each shape; the median of 5 runs of 200 products each, in microseconds.
"""

import argparse
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,5,9")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'matrix':<8} {'rows':>4} {'int8 us':>8} {'int4 us':>8} {'bf16 us':>8} {'int4/int8':>9}")
    for name, (out_features, in_features) in SHAPES.items():
        int8 = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
        int8_scales = torch.rand(out_features).bfloat16()
        nibbles = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
        int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1)
        int4_scales_and_zeros = torch.rand(in_features // 32, out_features, 2).bfloat16()
        dense = torch.randn(out_features, in_features).bfloat16()
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, in_features).bfloat16()
            t8 = median_us(partial(torch.ops.aten._weight_int8pack_mm, x, int8, int8_scales))
            t4 = median_us(partial(torch.ops.aten._weight_int4pack_mm_for_cpu, x, int4, 32, int4_scales_and_zeros))
            tb = median_us(partial(F.linear, x, dense))
            print(f"{name:<8} {rows:>4} {t8:>8.1f} {t4:>8.1f} {tb:>8.1f} {t4 / t8:>9.2f}", flush=True)


def median_us(product, repeats: int = 200) -> float:
    for _ in range(10):
        product()
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            product()
        runs.append((time.perf_counter() - started) / repeats)
    return statistics.median(runs) * 1e6


if __name__ == "__main__":
    main()
