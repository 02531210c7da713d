"""What a decode step's block products cost when their weights stream from memory, as they do in a decode:
smollm2-135m's 30 layers of 4-bit products (q|k|v, o, gate|up, down, each layer its own random copy, about 70 MB
in all, twice the L3 cache of the machines seen here) and its 49152 x 576 8-bit output layer, one activation row,
with the scales (and offsets) packed as float16 and as float32, the two interleaved in one process.

    python scripts/stream_probe.py --threads 2 --rounds 40

`kernel_probe.py` times each product on a matrix that stays in cache; this one what a step pays. Every scale is a
float16 value, so both packings hold the same weights (`kernels.pack_four_bit` picks float16 for such a matrix;
`carrier` asks for float32 here too). Medians over the rounds, milliseconds a step.
"""

import argparse
import statistics
import time

import torch

from quickdraft.models.native import kernels

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
OUTPUT = (49152, 576)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    packings = {"float16": packed_model(torch.float16), "float32": packed_model(torch.float32)}
    rows = {name: torch.randn(1, width).bfloat16() for name, (_, width) in {**SHAPES, "output": OUTPUT}.items()}
    times: dict[str, list[tuple[float, float]]] = {carrier: [] for carrier in packings}
    for _ in range(args.rounds):
        for carrier, (layers, output) in packings.items():
            times[carrier].append(step(layers, output, rows))
    print(f"{'scales':<8} {'4-bit products, 30 layers':>26} {'8-bit output layer':>20}  (ms, medians of {args.rounds})")
    for carrier, runs in times.items():
        layers_ms, output_ms = (statistics.median(run[i] for run in runs) * 1e3 for i in (0, 1))
        print(f"{carrier:<8} {layers_ms:>26.2f} {output_ms:>20.2f}")


def packed_model(carrier: torch.dtype):
    """(30 layers of {name: (packed, outputs)}, (packed output layer, outputs)), every scale carried in `carrier`."""
    generator = torch.Generator().manual_seed(0)

    def scales(rows: int, width: int) -> torch.Tensor:
        return (torch.rand(rows, width // 32, generator=generator) * 0.02).half().float()

    layers = []
    for _ in range(LAYERS):
        layer = {}
        for name, (rows, width) in SHAPES.items():
            values = torch.randint(0, 16, (rows, width), dtype=torch.uint8, generator=generator)
            packed = kernels.pack_four_bit(values, scales(rows, width), -8 * scales(rows, width), carrier)
            layer[name] = (packed, rows)
        layers.append(layer)
    rows, width = OUTPUT
    values = torch.randint(-127, 128, (rows, width), dtype=torch.int8, generator=generator)
    return layers, (kernels.pack_eight_bit(values, scales(rows, width), carrier), rows)


def step(layers, output, rows) -> tuple[float, float]:
    """Seconds for every layer's 4-bit products, then for the output layer."""
    started = time.perf_counter()
    for layer in layers:
        for name, (packed, outputs) in layer.items():
            kernels.four_bit_matmul(rows[name], packed, outputs)
    middle = time.perf_counter()
    kernels.eight_bit_matmul(rows["output"], *output)
    return middle - started, time.perf_counter() - middle


if __name__ == "__main__":
    main()
