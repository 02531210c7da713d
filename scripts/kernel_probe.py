"""What each weight format's CPU matrix product costs at smollm2-135m's shapes: quickdraft's own 4-bit and
8-bit group products (`kernels.four_bit_matmul`, `kernels.eight_bit_matmul`: what `--dtype gguf` runs a GGUF's
Q4_0/Q4_1/Q4_K and Q8_0/Q5_0 matrices on), torch's int8 per row (`_weight_int8pack_mm`, the `int8` dtype's) and
int4 in 32-column groups (`_weight_int4pack_mm_for_cpu`, what gguf ran on until stop 30), dense bfloat16, and
dense float32 over the same bfloat16 rows widened (what prompt blocks run where the CPU has no native bfloat16,
`weights.prompt_dtype`), for 1, 5 and 9 rows; `--rows 128` gives a prompt block's.

    python scripts/kernel_probe.py --threads 2
    python scripts/kernel_probe.py --threads 2 --rows 128 --repeats 5 --matrices qkv,o,gate_up,down

Random weights of each shape; the median of 5 runs of `--repeats` products each, in microseconds.
"""

import argparse
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from quickdraft.models.native.kernels import eight_bit_matmul, four_bit_matmul, pack_eight_bit, pack_four_bit

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,5,9")
    parser.add_argument("--repeats", type=int, default=200, help="products per timed run (default 200)")
    parser.add_argument("--matrices", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"bfloat16 native here: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    columns = ("q4 us", "q8 us", "int8 us", "int4 us", "bf16 us", "f32 us")
    print(f"{'matrix':<8} {'rows':>4} " + " ".join(f"{c:>8}" for c in columns) + f" {'q4/int4':>8}")
    for name in args.matrices.split(","):
        out_features, in_features = SHAPES[name]
        int8 = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
        int8_scales = torch.rand(out_features).bfloat16()
        nibbles = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
        int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1)
        int4_scales_and_zeros = torch.rand(in_features // 32, out_features, 2).bfloat16()
        groups = (out_features, in_features // 32)
        group_scales, group_offsets = torch.rand(groups) * 0.01, torch.rand(groups) * -0.08
        four_bit = pack_four_bit(nibbles, group_scales, group_offsets)
        eight_bit = pack_eight_bit(int8, group_scales)
        dense = torch.randn(out_features, in_features).bfloat16()
        dense32 = dense.float()
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, in_features).bfloat16()
            time_us = partial(median_us, repeats=args.repeats)
            times = (
                time_us(partial(four_bit_matmul, x, four_bit, out_features)),
                time_us(partial(eight_bit_matmul, x, eight_bit, out_features)),
                time_us(partial(torch.ops.aten._weight_int8pack_mm, x, int8, int8_scales)),
                time_us(partial(torch.ops.aten._weight_int4pack_mm_for_cpu, x, int4, 32, int4_scales_and_zeros)),
                time_us(partial(F.linear, x, dense)),
                time_us(partial(widened_product, x, dense32)),
            )
            cells = " ".join(f"{t:>8.1f}" for t in times)
            print(f"{name:<8} {rows:>4} {cells} {times[0] / times[3]:>8.2f}", flush=True)


def widened_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """bfloat16 rows [n, in] times a float32 weight [out, in], back to bfloat16: a prompt block without native bf16."""
    return F.linear(x.float(), weight).bfloat16()


def median_us(product, repeats: int) -> float:
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
