"""Where one native forward spends its time: the torch profiler over decode, verification or prompt forwards.

    python scripts/decode_profile.py smollm2-135m-instruct --dtype int8 --threads 2
    python scripts/decode_profile.py smollm2-135m-instruct --dtype gguf --sequences 16 --context 300
    python scripts/decode_profile.py smollm2-135m-instruct --dtype gguf --tokens 128 --prompt-chunk

Gives each of `--sequences` KV cache slots (1 by default) a `--context`-token context (64 by default), times
`--steps` batched forwards of `--tokens` tokens a sequence (1: a decode step, k + 1: a verification; with
`--prompt-chunk`, a prompt chunk whose last row alone gets logits), each rolled back, in the C++ decoder and in the
Python layers (interleaved), then profiles them in the Python layers (the decoder's operators are C++ calls the
profiler does not see) and prints the operators by self CPU time, the matrix products apart from the rest, per step
and per layer. Issue #16's overhead work starts from this table (docs/native_runtime.md quotes it); #20's batched
decode steps and prompt chunks come from `--sequences` and `--prompt-chunk`.
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from quickdraft.models.base import SequenceStep
from quickdraft.models.loading import load_model

MATRIX_PRODUCTS = (
    "aten::_weight_int8pack_mm",
    "aten::baddbmm",
    "aten::mm",
    "aten::addmm",
    "aten::linear",
    "aten::bmm",
    "aten::matmul",
    "quickdraft::four_bit_matmul",
    "quickdraft::eight_bit_matmul",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="built-in name or HF directory")
    parser.add_argument("--dtype", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=1, help="tokens per forward (k + 1 for a verification)")
    parser.add_argument("--context", type=int, default=64, help="cached tokens under each forward (default 64)")
    parser.add_argument("--sequences", type=int, default=1, help="sequences in each forward (default 1)")
    parser.add_argument(
        "--prompt-chunk", action="store_true", help="the tokens are a prompt chunk: logits of its last row only"
    )
    parser.add_argument("--top", type=int, default=20, help="operators listed (default 20)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runner = load_model(args.model, runtime="native", dtype=args.dtype).runner
    layers = runner.spec.num_layers
    context = tuple(100 + i % 1000 for i in range(args.context))
    slots = [runner.open_slot() for _ in range(args.sequences)]
    if context:
        for slot in slots:
            runner.forward_batch([SequenceStep(slot, context, "none")])
    logits = "last" if args.prompt_chunk else "all"

    def step() -> None:
        runner.forward_batch([SequenceStep(slot, (7,) * args.tokens, logits) for slot in slots])
        for slot in slots:
            runner.rollback_slot(slot, len(context))

    native = runner.decoder
    walls = {"C++ decoder": [], "Python layers": []}
    for _ in range(10):
        step()
    for _ in range(args.steps):
        for path, decoder in (("C++ decoder", native), ("Python layers", None)):
            runner.decoder = decoder
            started = time.perf_counter()
            step()
            walls[path].append(time.perf_counter() - started)
    runner.decoder = None
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(args.steps):
            step()
    rows = [e for e in profiler.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    per_step = lambda us: us / args.steps  # noqa: E731
    products = sum(e.self_cpu_time_total for e in rows if e.key in MATRIX_PRODUCTS)
    others = sum(e.self_cpu_time_total for e in rows if e.key not in MATRIX_PRODUCTS)
    calls = sum(e.count for e in rows if e.key not in MATRIX_PRODUCTS)
    medians = ", ".join(f"{path} {statistics.median(times) * 1e3:.2f} ms" for path, times in walls.items())
    kind = "prompt chunks" if args.prompt_chunk else "forwards"
    print(
        f"{args.model} {args.dtype}, {args.threads} threads, {layers} layers, {args.sequences} x {args.tokens}-token"
        f" {kind} after {args.context} cached tokens, a step unprofiled (median): {medians}"
    )
    print("profiled in the Python layers:")
    print(f"matrix products {per_step(products) / 1e3:.2f} ms a step; everything else {per_step(others) / 1e3:.2f} ms")
    print(
        f"operators that are not matrix products: {calls / args.steps:.0f} a step, {calls / args.steps / layers:.0f}"
        f" and {per_step(others) / layers:.0f} us a layer"
    )
    print(f"{'operator':<36} {'calls/step':>10} {'us/step':>9}")
    for event in rows[: args.top]:
        print(f"{event.key:<36} {event.count / args.steps:>10.1f} {per_step(event.self_cpu_time_total):>9.0f}")


if __name__ == "__main__":
    main()
