"""Does `torch.compile` make the native runner faster, and does it stay exact? (issue 3's optional compiled path)

    python scripts/compile_probe.py smollm2-135m-instruct int8 --threads 2

Compiles the two tensor-only halves of a decoder layer (norm, fused q|k|v, q/k norm, RoPE; then
output projection, norms, MLP) with `dynamic=True`, leaving the KV cache writes and attention
eager (compiling the whole layer recompiles per layer index, since the cache list is indexed by
it). Prints the warm-up time, greedy decode tok/s of eager and compiled runners interleaved
(medians), each one's batch invariance (max |logit difference| between a 5-token forward and five
1-token forwards) and the difference between the two. docs/native_runtime.md quotes its output.
"""

import argparse
import statistics
import time

import torch

from quickdraft.models.native import native_runner_for
from quickdraft.models.native.runner import NativeRunner
from quickdraft.models.store import local_model_dir

PROMPT = list(range(100, 130))
CHECK_TOKENS = [200, 201, 202, 203, 204]


def compile_layers(runner: NativeRunner) -> None:
    """Compile the runner's two tensor-only halves of a layer (the cache and attention stay eager)."""
    runner._attention_inputs = torch.compile(runner._attention_inputs, dynamic=True)
    runner._attention_output_and_mlp = torch.compile(runner._attention_output_and_mlp, dynamic=True)


def decode_rate(runner: NativeRunner, steps: int) -> float:
    token = int(runner.prefill(PROMPT).argmax())
    begin = time.perf_counter()
    for _ in range(steps):
        token = int(runner.forward([token])[-1].argmax())
    return steps / (time.perf_counter() - begin)


def batch_difference(runner: NativeRunner) -> float:
    runner.prefill(PROMPT)
    together = runner.forward(CHECK_TOKENS)
    runner.rollback(len(PROMPT))
    one_by_one = torch.stack([runner.forward([t])[-1] for t in CHECK_TOKENS])
    return (together - one_by_one).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="built-in name or HF directory")
    parser.add_argument("dtype", choices=["float32", "bfloat16", "int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = local_model_dir(args.model, progress=False)
    runners = {"eager": native_runner_for(path, args.dtype), "compiled": native_runner_for(path, args.dtype)}
    compile_layers(runners["compiled"])
    begin = time.perf_counter()
    decode_rate(runners["compiled"], 3)
    runners["compiled"].forward(CHECK_TOKENS)  # the multi-token shape too
    print(
        f"{args.model} {args.dtype}, {args.threads} threads: "
        f"warm-up of the compiled runner {time.perf_counter() - begin:.1f} s"
    )
    rates = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, runner in runners.items():
            rates[name].append(decode_rate(runner, args.steps))
    eager_rate = statistics.median(rates["eager"])
    for name, runner in runners.items():
        rate = statistics.median(rates[name])
        print(
            f"  {name:<9} {rate:6.1f} tok/s  {rate / eager_rate:.2f}x  "
            f"batch invariance: max |diff| {batch_difference(runner):.3g}"
        )
    for runner in runners.values():
        runner.prefill(PROMPT)
    difference = (runners["eager"].forward(CHECK_TOKENS) - runners["compiled"].forward(CHECK_TOKENS)).abs().max().item()
    print(f"  eager vs compiled logits, 5-token forward: max |diff| {difference:.3g}")


if __name__ == "__main__":
    main()
