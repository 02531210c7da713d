"""Command-line entry point: argument parsing and error reporting only."""

import argparse
import importlib
import sys
from collections.abc import Collection

from quickdraft.errors import QuickdraftError

# Each command: the module under quickdraft.commands whose `register(parser)` gives its arguments and handler, and
# its line in `quickdraft --help`.
COMMANDS = {
    "generate": ("generate_cmd", "generate text with speculative decoding"),
    "batch": ("batch_cmd", "run a JSONL file of prompts through the batched engine"),
    "models": ("models_cmd", "list and fetch the built-in models"),
    "serve": ("serve_cmd", "serve the model over an OpenAI-compatible HTTP API"),
    "bench": ("bench_cmd", "measure speedups of drafters vs the target alone on a Spec-Bench style prompt file"),
    "bench-runtime": ("bench_runtime_cmd", "decode speed and verification cost v(k) per runtime"),
    "bench-adaptive": ("bench_adaptive_cmd", "benchmark --k auto against the target alone and every fixed k"),
    "bench-serve": (
        "bench_serve_cmd",
        "load-test any OpenAI-compatible chat endpoint: TTFT, TPOT, tok/s and goodput per concurrency",
    ),
    "distill": ("distill_cmd", "train a draft head on the target's own answers (self-distillation)"),
}


def build_parser(commands: Collection[str] = COMMANDS) -> argparse.ArgumentParser:
    """The CLI's parser, with the arguments of `commands` (default all); the others only listed, with their help
    line. A command's module is imported only here, and every one but distill's (whose defaults come from the
    training code) imports torch and transformers (seconds) only when the command runs: help, usage errors,
    `models list` and `bench-serve` never wait for them."""
    parser = argparse.ArgumentParser(
        prog="quickdraft", description="Lossless speculative decoding: faster generation, identical output."
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        command = subparsers.add_parser(name, help=summary)
        if name in commands:
            importlib.import_module(f"quickdraft.commands.{module}").register(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = next((word for word in argv if word in COMMANDS), None)  # global flags take no values
    parser = build_parser({named} if named else ())
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except QuickdraftError as exc:
        if args.debug:
            raise
        print(f"quickdraft: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("quickdraft: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an unexpected failure: one line unless --debug
        if args.debug:
            raise
        print(f"quickdraft: error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
