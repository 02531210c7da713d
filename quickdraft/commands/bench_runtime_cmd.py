"""`bench-runtime`: decode tokens/s and v(k) of the transformers and native runners."""

import argparse

import torch

from quickdraft.bench.runtime import run_runtime_bench
from quickdraft.models.native import NATIVE_DTYPES

BUILT_IN_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench-runtime", help="decode speed and verification cost v(k) per runtime")
    parser.add_argument("--models", nargs="+", default=list(BUILT_IN_MODELS), help="built-in names or HF dirs")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; medians are reported")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--dtypes", nargs="*", default=[], choices=sorted(NATIVE_DTYPES),
                        help="extra native dtypes to measure besides float32 and the default")
    parser.add_argument("--json", action="store_true", help="one JSON object per model instead of a table")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    run_runtime_bench(args.models, args.repeats, args.json, args.dtypes)
    return 0
