"""`bench-runtime`: decode tokens/s and v(k) of the transformers and native runners."""

import argparse

import torch

from quickdraft.bench.dataset import load_prompts, select_prompts
from quickdraft.bench.runtime import run_runtime_bench
from quickdraft.models.native import NATIVE_DTYPES

BUILT_IN_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench-runtime", help="decode speed and verification cost v(k) per runtime")
    parser.add_argument("--models", nargs="+", default=list(BUILT_IN_MODELS), help="built-in names or HF dirs")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; medians are reported")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument(
        "--dtypes",
        nargs="*",
        default=[],
        choices=sorted(NATIVE_DTYPES),
        help="extra native dtypes to measure besides float32 and the default",
    )
    parser.add_argument(
        "--dev-prompts",
        metavar="JSONL",
        help="also time n-gram speculation per runner on these "
        "Spec-Bench style prompts (e.g. ../shared/data/specbench_dev.jsonl)",
    )
    parser.add_argument(
        "--per-category", type=int, default=1, help="dev prompts per category, in file order (default 1)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per dev prompt (default 64)")
    parser.add_argument("--json", action="store_true", help="one JSON object per model instead of a table")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    prompts = select_prompts(load_prompts(args.dev_prompts), limit=args.per_category) if args.dev_prompts else []
    run_runtime_bench(args.models, args.repeats, args.json, args.dtypes, prompts, args.max_new_tokens)
    return 0
