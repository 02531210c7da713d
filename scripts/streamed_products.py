"""What the 4-bit block products of one smollm2-sized forward cost when their weights stream from memory: 30 layers'
qkv, o, gate_up and down matrices (random 4-bit groups, 66 MB packed, more than the last-level cache), each product
once per pass, for several row counts. `kernel_probe.py` times one matrix again and again, from the cache; this is
the case of a decode or verification forward, where the weights' streaming and the prefetch distance decide as much
as the arithmetic.

    python scripts/streamed_products.py --threads 2
    python scripts/streamed_products.py --threads 2 --rows 1,4,5,8,16 --output-layer 262144,640  # and gemma-3's output
    PYTHONPATH=/tmp/old TORCH_EXTENSIONS_DIR=/tmp/ext-old python scripts/streamed_products.py  # another checkout

Prints the median milliseconds of a pass (120 products) per row count, and of the output layer's product where
asked. docs/native_runtime.md (stops 46 and 49) quotes it.
"""

import argparse
import statistics
import time

import torch

from quickdraft.models.native.kernels import (
    built_instruction_set,
    eight_bit_matmul,
    four_bit_matmul,
    pack_eight_bit,
    pack_four_bit,
)

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # smollm2's qkv, o, gate_up, down: [N, K]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,5,8,16", help="comma list of activation rows per product")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument(
        "--output-layer",
        help="N,K: also time an 8-bit output layer of N rows by K (262144,640 is gemma-3-270m's; 49152,576 smollm2's)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    matrices = []  # (packed, N, K), in forward order
    for _ in range(args.layers):
        for outputs, width in SHAPES:
            values = torch.randint(0, 16, (outputs, width))
            scales, offsets = (torch.rand(outputs, width // 32).half().float() for _ in range(2))
            matrices.append((pack_four_bit(values, scales, offsets), outputs, width))
    output_layer = None  # (packed, N, K): the 8-bit output layer, when asked for
    if args.output_layer:
        outputs, width = (int(v) for v in args.output_layer.split(","))
        values = torch.randint(-127, 128, (outputs, width), dtype=torch.int8)
        output_layer = (pack_eight_bit(values, torch.rand(outputs, width // 32).half().float()), outputs, width)
    row_counts = [int(r) for r in args.rows.split(",")]
    walls = {rows: ([], []) for rows in row_counts}  # rows -> (the layers' passes, the output layer's)
    for i in range(1 + args.passes):  # the first untimed; row counts take turns, so machine drift hits them alike
        for rows in row_counts:
            x = {width: torch.randn(rows, width).bfloat16() for width in {w for _, w in SHAPES}}
            started = time.perf_counter()
            for packed, outputs, width in matrices:
                four_bit_matmul(x[width], packed, outputs)
            if i:
                walls[rows][0].append(time.perf_counter() - started)
            if output_layer is not None:
                packed, outputs, width = output_layer
                rows_in = torch.randn(rows, width).bfloat16()
                started = time.perf_counter()
                eight_bit_matmul(rows_in, packed, outputs)
                if i:
                    walls[rows][1].append(time.perf_counter() - started)
    print(f"kernels: {built_instruction_set()}, {args.threads} threads, {len(matrices)} products a pass, ms:")
    print(" | ".join(f"{rows} rows {statistics.median(walls[rows][0]) * 1e3:.2f}" for rows in row_counts))
    if output_layer is not None:
        print(f"8-bit output layer {args.output_layer}, ms:")
        print(" | ".join(f"{rows} rows {statistics.median(walls[rows][1]) * 1e3:.2f}" for rows in row_counts))


if __name__ == "__main__":
    main()
