"""Arguments several commands share, defined once: the model and speculation flags of `generate` and `serve`,
and the flags of the three benchmarks.

Benchmark flags follow one rule: a flag that takes several values takes them as one comma list
(`--ks 1,2,4,auto`, `--drafters none,ngram`, `--models a,b`). Where a list of drafter settings may hold
drafters joined for `--k auto` to choose between, the join is written with `+` (`--drafters ngram,ngram+head`),
since the comma separates the list; everywhere else (`generate --drafter`, `serve --drafter`, the server's
`quickdraft.drafter`) drafters are joined with commas. `--prompts` is always a Spec-Bench style JSONL file and
`--dtype` defaults to auto (the runtime's default) everywhere.
"""

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.config import DEFAULT_MODEL, DEFAULT_STEP_TOKENS, DTYPES, RUNTIMES
from quickdraft.errors import UsageError

if TYPE_CHECKING:  # the engine (torch, transformers) is imported by the commands that load a model, when they run
    from quickdraft.engine import Engine

DEFAULT_MAX_BATCH = 8  # requests generated at once by serve and batch; see BENCHMARKS.md (the serving sweep)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --drafter, --k, --k-max, --runtime, --dtype, --threads, --device: shared by generate, batch and
    serve."""
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=(
            f"target: built-in name, HF directory, .gguf file or hub id (default {DEFAULT_MODEL}); "
            "see `quickdraft models list`"
        ),
    )
    parser.add_argument(
        "--drafter",
        default=None,
        help=(
            "none, ngram (prompt lookup; ngram:MAX or ngram:MIN-MAX for other suffix sizes than 1-4), "
            "corpus (the table of the target's own frequent continuations shipped for it), corpus:FILE (one from "
            "quickdraft distill table), head (the draft head shipped for the target), head:DIR (one from quickdraft "
            "distill), a same-tokenizer draft model name/path, or several joined by commas for --k auto, e.g. "
            "ngram,head (default: the target's own, see `quickdraft models list`; ngram for any other target)"
        ),
    )
    parser.add_argument(
        "--k",
        type=parse_k,
        default="auto",
        help=(
            "draft tokens per target forward: auto (chosen each step from measured speed, 0..--k-max) "
            "or a fixed N (default auto)"
        ),
    )
    parser.add_argument("--k-max", type=int, default=8, help="most draft tokens --k auto may choose (default 8)")
    add_runtime_arguments(parser)
    add_device_argument(parser)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """--device (default cpu)."""
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the models run: cpu, or cuda (cuda:N for GPU N), where the native runtime computes in float32 "
        "(--dtype auto) or bfloat16; int8 and gguf weights are CPU kernels (default cpu)",
    )


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """--max-batch and --step-tokens, for the commands that run many requests at once."""
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help=f"requests generated at once, one KV cache slot each (default {DEFAULT_MAX_BATCH}; "
        "a transformers-runtime model runs 1)",
    )
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=DEFAULT_STEP_TOKENS,
        help=f"prompt tokens all prefilling requests read per step, together (default {DEFAULT_STEP_TOKENS}; "
        "lower: running streams pause less for a new prompt, higher: prompts read in fewer steps)",
    )


def load_engine(args: argparse.Namespace, max_batch: int = 1, step_tokens: int = DEFAULT_STEP_TOKENS) -> "Engine":
    """The engine the flags of `add_model_arguments` name, running up to `max_batch` requests at once and
    prefilling `step_tokens` prompt tokens a step."""
    from quickdraft.engine import Engine

    if max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {max_batch}")
    if step_tokens < 1:
        raise UsageError(f"--step-tokens must be >= 1, got {step_tokens}")
    return Engine.from_names(
        args.model,
        drafter=args.drafter,
        k=args.k,
        k_max=args.k_max,
        runtime=args.runtime,
        dtype=args.dtype,
        device=args.device,
        threads=args.threads,
        max_batch=max_batch,
        step_tokens=step_tokens,
    )


def add_runtime_arguments(parser: argparse.ArgumentParser, what: str = "the target") -> None:
    """--runtime, --dtype (default auto) and --threads."""
    parser.add_argument(
        "--runtime",
        default="auto",
        choices=RUNTIMES,
        help=f"runner of {what}: native (fast, Llama/Gemma 3), hf (transformers), auto (native when supported)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help=(
            "weights/compute dtype: auto = on the native runtime the GGUF file's own 4-bit blocks (gguf) for a "
            "model converted from one, else int8 weights (both exact w.r.t. themselves, fastest); float32 on hf "
            "(default auto)"
        ),
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def add_prompts_argument(parser: argparse.ArgumentParser, required: bool, help: str) -> None:
    parser.add_argument("--prompts", metavar="JSONL", required=required, help=help)


def output_dir(path: Path) -> Path:
    """--out, created if missing; UsageError when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {path}: {exc}; pass a writable --out") from exc
    return path


def parse_k(text: str) -> int | str:
    """--k: "auto" or a non-negative integer."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer, got {text!r}") from None


def comma_list(text: str) -> list[str]:
    """ "a, b" -> ["a", "b"]; an empty list is refused."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list, e.g. none,ngram")
    return items


def k_list(text: str) -> list[int | str]:
    """ "1,2,4" -> [1, 2, 4]; words (e.g. "auto") pass through for the command to accept or refuse."""
    return [int(item) if item.lstrip("-").isdigit() else item for item in comma_list(text)]
