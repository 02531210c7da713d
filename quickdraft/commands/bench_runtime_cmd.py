"""`bench-runtime`: decode tokens/s and v(k) of the transformers and native runners."""

import argparse
from pathlib import Path

from quickdraft.bench.dataset import load_prompts, select_prompts
from quickdraft.bench.llama_cpp import llama_bench, llama_server
from quickdraft.commands.arguments import add_device_argument, add_prompts_argument, comma_list
from quickdraft.config import DTYPES
from quickdraft.errors import UsageError

NATIVE_DTYPE_NAMES = tuple(dtype for dtype in DTYPES if dtype != "auto")  # `models.native.NATIVE_DTYPES`' names

BUILT_IN_MODELS = ("smollm2-135m-instruct", "gemma-3-270m")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        default=",".join(BUILT_IN_MODELS),
        type=comma_list,
        help=f"comma list of built-in names or HF dirs (default {','.join(BUILT_IN_MODELS)})",
    )
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; medians are reported")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--dtypes",
        default=[],
        type=comma_list,
        help=f"comma list of native dtypes to measure besides float32 and the default ({','.join(NATIVE_DTYPE_NAMES)})",
    )
    add_prompts_argument(
        parser,
        required=False,
        help="also time n-gram speculation per runner on these Spec-Bench style prompts "
        "(e.g. ../shared/data/specbench_dev.jsonl)",
    )
    parser.add_argument(
        "--per-category", type=int, default=1, help="dev prompts per category, in file order (default 1)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per dev prompt (default 64)")
    parser.add_argument(
        "--llama-cpp",
        type=Path,
        default=None,
        metavar="BIN_DIR",
        help="a llama.cpp build's bin/ folder: also time its llama-bench decode on each model's GGUF file and, "
        "with --prompts, each native dtype's greedy top-1 agreement with its llama-server continuations",
    )
    add_device_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per model instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from quickdraft.bench.runtime import run_runtime_bench
    from quickdraft.models.loading import check_device

    if unknown := [d for d in args.dtypes if d not in NATIVE_DTYPE_NAMES]:
        raise UsageError(f"unknown native dtypes {', '.join(unknown)}; choose from {', '.join(NATIVE_DTYPE_NAMES)}")
    check_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = select_prompts(load_prompts(args.prompts), limit=args.per_category) if args.prompts else []
    if args.llama_cpp is not None:  # checked before any model loads
        llama_bench(args.llama_cpp)
        if prompts:
            llama_server(args.llama_cpp)
    run_runtime_bench(
        args.models, args.repeats, args.json, args.dtypes, prompts, args.max_new_tokens, args.llama_cpp, args.device
    )
    return 0
