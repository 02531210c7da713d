"""What drawing one sampled token costs, per row of probabilities: `torch.multinomial` against quickdraft's
inverse CDF (`categorical`), computed in torch and by the kernel (`torch.ops.quickdraft.draw`, the same bits); and
what the row's probabilities cost before it, softmax(logits / 0.7) of bfloat16 logits (the runtime's) by torch
and by the kernel (`sampling.softmax`).

    python scripts/draw_cost.py --threads 2
    python scripts/draw_cost.py --vocab-sizes 49152,262144 --rows 1,5 --rounds 5

Each (vocabulary, rows) case times the three draws on the same softmax rows, then the two softmaxes on the same
logits, interleaved, `--repeats` calls a round; the median over `--rounds` is printed in microseconds per row.
BENCHMARKS.md ("Sampled tokens without torch.multinomial", "Sampled rows by kernels") quotes it.
"""

import argparse
import statistics
import time

import torch

from quickdraft.categorical import DRAW_BLOCK, inverse_cdf_in_torch
from quickdraft.models.native.kernels import kernels


def per_row_microseconds(function, probs: torch.Tensor, generator: torch.Generator, repeats: int) -> float:
    for _ in range(3):
        function(probs, generator)
    started = time.perf_counter()
    for _ in range(repeats):
        function(probs, generator)
    return (time.perf_counter() - started) / repeats / probs.shape[0] * 1e6


def multinomial(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def in_torch(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return inverse_cdf_in_torch(probs, torch.rand(probs.shape[0], generator=generator, dtype=torch.float64))


def by_kernel(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    uniform = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64)
    return kernels().draw(probs, uniform, DRAW_BLOCK)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-sizes", default="49152,262144", help="comma list (smollm2's and gemma 3's)")
    parser.add_argument("--rows", default="1,5", help="comma list: rows drawn in one call (5: a 4-token draft's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50, help="calls per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    for vocab in map(int, args.vocab_sizes.split(",")):
        for rows in map(int, args.rows.split(",")):
            probs = torch.softmax(torch.randn(rows, vocab, generator=generator) * 4, dim=-1)  # [rows, vocab]
            draws = {"torch.multinomial": multinomial, "inverse CDF in torch": in_torch, "the kernel": by_kernel}
            times: dict[str, list[float]] = {name: [] for name in draws}
            for _ in range(args.rounds):
                for name, function in draws.items():
                    times[name].append(per_row_microseconds(function, probs, generator, args.repeats))
            report(f"vocab {vocab}, {rows} row(s), draw", times, "inverse CDF in torch")
            logits = (torch.randn(rows, vocab, generator=generator) * 4).bfloat16()  # [rows, vocab]
            softmaxes = {
                "torch.softmax": lambda x, _: torch.softmax(x.float() / 0.7, dim=-1),
                "the kernel": lambda x, _: kernels().softmax(x, 0.7),
            }
            times = {name: [] for name in softmaxes}
            for _ in range(args.rounds):
                for name, function in softmaxes.items():
                    times[name].append(per_row_microseconds(function, logits, generator, args.repeats))
            report(f"vocab {vocab}, {rows} row(s), softmax at 0.7", times, "torch.softmax")


def report(case: str, times: dict[str, list[float]], torch_name: str) -> None:
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{case}: "
        + ", ".join(f"{name} {value:.0f} us a row" for name, value in medians.items())
        + f" (the kernel {medians[torch_name] / medians['the kernel']:.1f}x torch's)"
    )


if __name__ == "__main__":
    main()
