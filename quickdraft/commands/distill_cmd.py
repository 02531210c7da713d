"""`quickdraft distill`: train a draft head (or a small standalone draft) from the target's own answers;
`quickdraft distill export DIR --format speculators|eagle3 --out OUT`: write a head for other engines;
`quickdraft distill table DATA --out FILE`: count a corpus table (the `corpus` drafter's) over those answers."""

import argparse
import shlex
from pathlib import Path

import torch

from quickdraft.config import DEFAULT_MODEL
from quickdraft.distill.data import AnswerConfig
from quickdraft.distill.pipeline import DistillOptions, distill
from quickdraft.distill.table import write_table
from quickdraft.distill.train import PRECISIONS, TrainConfig
from quickdraft.drafters.corpus import MAX_ORDER, MIN_COUNT
from quickdraft.drafters.head.files import export, read_identity
from quickdraft.errors import UsageError
from quickdraft.models.loading import load_model


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate the target's answers to training prompts (never Spec-Bench's) with the batched "
        "engine, then train an EAGLE-3 draft head on its hidden states. Every stage resumes with --resume. "
        "`quickdraft distill export DIR --format speculators|eagle3 --out OUT` writes a head for vLLM, SGLang or "
        "llama.cpp's converter. `quickdraft distill table DATA --out FILE` counts the answers into a table for "
        "the corpus drafter."
    )
    parser.add_argument("--target", default=DEFAULT_MODEL, help=f"target model name or path (default {DEFAULT_MODEL})")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (data, checkpoints, the head and its card); required"
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help=(
            "prompts file: .jsonl (prompt/text/instruction/question or turns) or one per line; "
            "default: ShareGPT first turns"
        ),
    )
    parser.add_argument("--tokens", type=int, default=50_000, help="answer tokens to generate (default 50000)")
    parser.add_argument(
        "--vocab",
        default="auto",
        help="reduced vocabulary size, or auto: smallest multiple of 1024 covering 98%% of held-out answer tokens",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue an interrupted or shorter run in --out (data, then training)"
    )
    parser.add_argument(
        "--kind",
        choices=["head", "standalone", "table"],
        default="head",
        help="head (default); standalone: a small full-vocabulary Llama saved as a transformers model; table: the "
        "answers counted into a corpus table, OUT/table.safetensors (--drafter ngram,corpus:OUT/table.safetensors)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap (default 128)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="requests the engine writes answers for at once (default 32; a speed setting, the answers are the same)",
    )
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are skipped (default 256)")
    parser.add_argument(
        "--resample-temperature",
        type=float,
        default=0.7,
        help="once every prompt has its greedy answer, further passes answer the prompts again sampled at this "
        "temperature (seeded), until --tokens is reached (default 0.7; 0: stop after the greedy pass)",
    )
    parser.add_argument(
        "--intermediate-size", type=int, default=None, help="the head's MLP width (default: the target's)"
    )
    parser.add_argument("--epochs", type=float, default=4.0, help="passes over the training split (default 4)")
    parser.add_argument(
        "--train-minutes", type=float, default=None, help="wall-clock cap on training; the lr schedule follows it"
    )
    parser.add_argument(
        "--unroll", type=int, default=4, help="drafting steps unrolled in training (training-time test; default 4)"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument(
        "--step-decay", type=float, default=0.8, help="loss weight of unrolled step s is DECAY ** (s-1) (default 0.8)"
    )
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    parser.add_argument(
        "--train-precision",
        choices=PRECISIONS,
        default="auto",
        help="the head's training products (auto: bfloat16 on CPUs with native bfloat16 products, else float32)",
    )
    parser.add_argument(
        "--train-on-prompts",
        action="store_true",
        help="also train on the prompts' positions (more data; held-out metrics stay on answers)",
    )
    parser.add_argument(
        "--init-head",
        type=Path,
        default=None,
        help="start from this head's weights and vocabulary (fine-tune it on this run's data) instead of a fresh head",
    )
    parser.add_argument(
        "--eval-prompts",
        type=int,
        default=30,
        help="held-out prompts answered with the engine for the card (default 30: tau varies widely between prompts)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; 1 is often fastest on a busy machine)",
    )
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="action", metavar="export|table")
    exporter = actions.add_parser(
        "export",
        help="write a head in the layout vLLM (speculators) or SGLang and llama.cpp's converter (eagle3) load",
        description="Write the head in DIR in another engine's layout, with its quickdraft.json and card.",
    )
    exporter.add_argument("head", type=Path, metavar="DIR", help="a head directory (quickdraft distill's --out)")
    exporter.add_argument("--format", choices=["speculators", "eagle3"], required=True, help="the layout to write")
    exporter.add_argument("--out", type=Path, required=True, help="the directory to write (must be empty or absent)")
    exporter.add_argument(
        "--target", default=None, help="the head's target, to check the head against (default: the one it names)"
    )
    exporter.set_defaults(func=run_export)
    counter = actions.add_parser(
        "table",
        help="count the target's answers into a corpus table (drafter corpus:FILE)",
        description="Count every answer in a distill data directory: for each context of 1..--max-order tokens "
        "before an answer token, the token that most often followed and its share.",
    )
    counter.add_argument("data", type=Path, metavar="DATA", help="a distill run's data directory (RUN/data)")
    counter.add_argument("--out", type=Path, required=True, help="the table file to write (.safetensors)")
    counter.add_argument(
        "--max-order", type=int, default=MAX_ORDER, help=f"longest context, in tokens (default {MAX_ORDER})"
    )
    counter.add_argument(
        "--min-count",
        type=int,
        default=MIN_COUNT,
        help=f"contexts seen fewer times are left out (default {MIN_COUNT})",
    )
    counter.set_defaults(func=run_table)


def run_export(args: argparse.Namespace) -> int:
    if args.out.exists() and any(args.out.iterdir()):
        raise UsageError(f"{args.out} is not empty; choose a new --out")
    identity = read_identity(args.head)
    name = args.target or (identity or {}).get("name")
    if name is None:
        raise UsageError(f"{args.head} names no target (no quickdraft.json); pass --target MODEL")
    print(export(args.head, args.out, args.format, load_model(name)))
    return 0


def run_table(args: argparse.Namespace) -> int:
    if args.min_count < 1:
        raise UsageError(f"--min-count must be >= 1, got {args.min_count}")
    table = write_table(args.data, args.out, args.max_order, args.min_count)
    print(
        f"{args.out}: {len(table.keys)} contexts of 1..{table.max_order} tokens from {table.answer_tokens} answer "
        f"tokens of {table.target}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.out is None:
        raise UsageError("quickdraft distill needs --out DIR (the run's directory)")
    options = options_from(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(distill(options))
    return 0


def options_from(args: argparse.Namespace) -> DistillOptions:
    for name in ("tokens", "max_new_tokens", "batch_size", "unroll", "max_prompt_tokens"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.resample_temperature < 0:
        raise UsageError(f"--resample-temperature must be >= 0, got {args.resample_temperature}; 0 turns it off")
    return DistillOptions(
        target=args.target,
        out=args.out,
        prompts=args.prompts,
        tokens=args.tokens,
        vocab=_vocab_size(args.vocab),
        intermediate_size=args.intermediate_size,
        resume=args.resume,
        kind=args.kind,
        generation=AnswerConfig(
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            max_prompt_tokens=args.max_prompt_tokens,
            resample_temperature=args.resample_temperature,
        ),
        training=TrainConfig(
            epochs=args.epochs,
            minutes=args.train_minutes,
            unroll=args.unroll,
            lr=args.lr,
            step_decay=args.step_decay,
            weight_decay=args.weight_decay,
            train_on_prompts=args.train_on_prompts,
            precision=args.train_precision,
        ),
        init_head=args.init_head,
        eval_prompts=args.eval_prompts,
        command=command_line(args),
    )


def _vocab_size(value: str) -> int | None:
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--vocab must be a positive integer or auto, got {value!r}")
    return int(value)


def command_line(args: argparse.Namespace) -> str:
    """The full command with every distill option spelled out (defaults included)."""
    words = ["quickdraft", "distill"]
    for name in (
        "target",
        "out",
        "prompts",
        "tokens",
        "vocab",
        "kind",
        "max_new_tokens",
        "max_prompt_tokens",
        "resample_temperature",
        "batch_size",
        "intermediate_size",
        "epochs",
        "train_minutes",
        "unroll",
        "lr",
        "step_decay",
        "weight_decay",
        "init_head",
        "eval_prompts",
        "threads",
    ):
        value = getattr(args, name)
        if value is not None:
            words += [f"--{name.replace('_', '-')}", str(value)]
    flags = [f"--{name.replace('_', '-')}" for name in ("train_on_prompts", "resume") if getattr(args, name)]
    return shlex.join(words + flags)
