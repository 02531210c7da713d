"""`quickdraft distill`: train a draft head (or a small standalone draft) from the target's own answers."""

import argparse
import shlex
from pathlib import Path

import torch

from quickdraft.config import DEFAULT_MODEL
from quickdraft.distill.data import AnswerConfig, default_writer_dtype
from quickdraft.distill.pipeline import DistillOptions, distill
from quickdraft.distill.train import TrainConfig
from quickdraft.errors import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "distill",
        help="train a draft head on the target's own answers (self-distillation)",
        description="Generate the target's answers to training prompts (never Spec-Bench's), then train an "
        "EAGLE-style draft head on its hidden states. Every stage resumes with --resume.",
    )
    parser.add_argument("--target", default=DEFAULT_MODEL, help=f"target model name or path (default {DEFAULT_MODEL})")
    parser.add_argument(
        "--out", required=True, type=Path, help="output directory (data, checkpoints, the head and its card)"
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
        choices=["head", "standalone"],
        default="head",
        help="head (default), or standalone: a small full-vocabulary Llama saved as a transformers model",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap (default 128)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per generate call (default 64)")
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are skipped (default 256)")
    parser.add_argument(
        "--gen-dtype",
        choices=["auto", "bfloat16", "float32", "int8"],
        default="auto",
        help=(
            "the target's dtype while it writes the training answers (default auto: bfloat16, "
            "the default runtime's activation precision, where the CPU multiplies bfloat16 natively, "
            "else float32, which is faster there; int8: bfloat16 with the weights rounded as the native "
            "int8 runtime rounds them)"
        ),
    )
    parser.add_argument("--epochs", type=float, default=4.0, help="passes over the training split (default 4)")
    parser.add_argument(
        "--train-minutes", type=float, default=None, help="wall-clock cap on training; the lr schedule follows it"
    )
    parser.add_argument("--unroll", type=int, default=3, help="drafting steps simulated in training (default 3)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument(
        "--ce-weight",
        type=float,
        default=1.0,
        help="weight of the token cross-entropy next to the smooth-L1 state loss (default 1; EAGLE used 0.1)",
    )
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
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


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(distill(options))
    return 0


def options_from(args: argparse.Namespace) -> DistillOptions:
    if args.gen_dtype == "auto":  # the card's command names the dtype this machine chose
        args = argparse.Namespace(**{**vars(args), "gen_dtype": default_writer_dtype()})
    for name in ("tokens", "max_new_tokens", "batch_size", "unroll", "max_prompt_tokens"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return DistillOptions(
        target=args.target,
        out=args.out,
        prompts=args.prompts,
        tokens=args.tokens,
        vocab=_vocab_size(args.vocab),
        resume=args.resume,
        kind=args.kind,
        generation=AnswerConfig(
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            max_prompt_tokens=args.max_prompt_tokens,
            dtype=args.gen_dtype,
        ),
        training=TrainConfig(
            epochs=args.epochs,
            minutes=args.train_minutes,
            unroll=args.unroll,
            lr=args.lr,
            ce_weight=args.ce_weight,
            weight_decay=args.weight_decay,
            train_on_prompts=args.train_on_prompts,
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
        "batch_size",
        "gen_dtype",
        "epochs",
        "train_minutes",
        "unroll",
        "lr",
        "ce_weight",
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
