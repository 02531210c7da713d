"""Would one attention product over several sequences beat the runner's per-sequence attention, and stay exact?

    python scripts/attention_probe.py --threads 2

The runner attends each sequence (each verification query) alone over exactly its own keys (smollm2's shapes:
3 KV heads, 3 query heads per KV head, head size 64). The candidate computes every sequence's decode query in one
pass: scores for all sequences in one product over the longest context (shorter ones masked), a shared maximum,
and the value products in fixed blocks of 128 keys, one product per block over all sequences, the blocks added
in order (a block a sequence does not reach adds exact zeros), the softmax's denominator carried as a column of
ones beside the values. Printed: how many of a batch's rows differ from the same sequence computed alone (must be
0 for the runner to use it), what makes them differ, and the medians of both forms per context and batch size.
"""

import argparse
import random
import statistics
import time

import torch

KV, G, HD, BLOCK = 3, 3, 64, 128  # smollm2-135m-instruct's attention shapes; the candidate's key block
CAPACITY = 1024  # cached positions per sequence


def per_sequence(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The runner's form: q [P, KV, G, HD] (scaled), keys/values [P, KV, CAPACITY, HD] -> [P, KV, G, HD]."""
    out = []
    for p, length in enumerate(lengths):
        scores = torch.bmm(q[p], keys[p, :, :length].transpose(1, 2))  # [KV, G, length]
        out.append(torch.bmm(torch.softmax(scores, dim=-1), values[p, :, :length]))
    return torch.stack(out)


def blocked(q: torch.Tensor, keys: torch.Tensor, values_ones: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The candidate: values_ones [P, KV, CAPACITY, HD + 1] (last column 1) -> [P, KV, G, HD]."""
    sequences, blocks = q.shape[0], -(-max(lengths) // BLOCK)
    padded = blocks * BLOCK
    scores = torch.bmm(q.flatten(0, 1), keys[:, :, :padded].flatten(0, 1).transpose(1, 2))  # [P * KV, G, padded]
    beyond = torch.arange(padded)[None, :] >= torch.tensor(lengths)[:, None]  # [P, padded]
    mask = torch.zeros(sequences, padded).masked_fill_(beyond, float("-inf"))
    scores = scores.view(sequences, KV * G, padded).add_(mask[:, None, :]).view(sequences * KV, G, padded)
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    values = values_ones[:, :, :padded].flatten(0, 1)  # [P * KV, padded, HD + 1]
    total = torch.bmm(weights[:, :, :BLOCK], values[:, :BLOCK])
    for b in range(1, blocks):
        part = slice(b * BLOCK, (b + 1) * BLOCK)
        total += torch.bmm(weights[:, :, part], values[:, part])
    return (total[..., :HD] / total[..., HD:]).view(sequences, KV, G, HD)


def median_us(action, repeats: int) -> float:
    for _ in range(5):
        action()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    most = 16
    q = torch.randn(most, KV, G, HD) * HD**-0.5
    keys, values = torch.randn(most, KV, CAPACITY, HD), torch.randn(most, KV, CAPACITY, HD)
    values_ones = torch.cat([values, torch.ones(most, KV, CAPACITY, 1)], dim=-1)

    rng, rows, differing = random.Random(0), 0, 0
    for _ in range(30):
        batch = rng.choice([2, 3, 5, 8, 16])
        lengths = [rng.randint(1, 900) for _ in range(batch)]
        together = blocked(q[:batch], keys[:batch], values_ones[:batch], lengths)
        for p in range(batch):
            alone = blocked(q[p : p + 1], keys[p : p + 1], values_ones[p : p + 1], [lengths[p]])
            rows, differing = rows + 1, differing + (not torch.equal(alone[0], together[p]))
    print(f"candidate: {differing} of {rows} batched rows differ from the same sequence alone")
    weights, block_values = torch.rand(most, G, BLOCK), torch.randn(most, BLOCK, HD + 1)
    shared = torch.bmm(weights, block_values)
    alone = sum(
        not torch.equal(torch.bmm(weights[i : i + 1], block_values[i : i + 1])[0], shared[i]) for i in range(most)
    )
    print(f"  one [{G}, {BLOCK}] x [{BLOCK}, {HD + 1}] product in a bmm of {most} vs alone: {alone} of {most} differ")

    print(f"{'context':>7} {'batch':>5} {'per-sequence us':>15} {'blocked us':>10} {'blocked/per-seq':>15}")
    for context in (64, 512):
        for batch in (1, 8, 16):
            inputs = (q[:batch], keys[:batch], values[:batch], values_ones[:batch], [context] * batch)
            runner_form = median_us(lambda i=inputs: per_sequence(i[0], i[1], i[2], i[4]), args.repeats)
            candidate = median_us(lambda i=inputs: blocked(i[0], i[1], i[3], i[4]), args.repeats)
            print(f"{context:>7} {batch:>5} {runner_form:>15.0f} {candidate:>10.0f} {candidate / runner_form:>15.2f}")


if __name__ == "__main__":
    main()
