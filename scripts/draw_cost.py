"""What drawing one sampled token costs, per row of probabilities: `torch.multinomial` against quickdraft's
`categorical.draw` (inverse CDF).

    python scripts/draw_cost.py --threads 2
    python scripts/draw_cost.py --vocab-sizes 49152,262144 --rows 1,5 --rounds 5

Each (vocabulary, rows) case times both draws on the same softmax rows, interleaved, `--repeats` calls a round;
the median over `--rounds` is printed in microseconds per row. BENCHMARKS.md ("Sampled tokens without
torch.multinomial") quotes it.
"""

import argparse
import statistics
import time

import torch

from quickdraft.categorical import draw


def per_row_microseconds(function, probs: torch.Tensor, generator: torch.Generator, repeats: int) -> float:
    for _ in range(3):
        function(probs, generator)
    started = time.perf_counter()
    for _ in range(repeats):
        function(probs, generator)
    return (time.perf_counter() - started) / repeats / probs.shape[0] * 1e6


def multinomial(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


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
            times: dict[str, list[float]] = {"torch.multinomial": [], "categorical.draw": []}
            for _ in range(args.rounds):
                times["torch.multinomial"].append(per_row_microseconds(multinomial, probs, generator, args.repeats))
                times["categorical.draw"].append(per_row_microseconds(draw, probs, generator, args.repeats))
            medians = {name: statistics.median(values) for name, values in times.items()}
            print(
                f"vocab {vocab}, {rows} row(s): "
                + ", ".join(f"{name} {value:.0f} us a row" for name, value in medians.items())
                + f" ({medians['torch.multinomial'] / medians['categorical.draw']:.0f}x)"
            )


if __name__ == "__main__":
    main()
