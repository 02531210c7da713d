"""Command-line entry point: argument parsing and error reporting only."""

import argparse
import sys

from quickdraft.errors import QuickdraftError


def build_parser() -> argparse.ArgumentParser:
    from quickdraft.commands import (
        batch_cmd,
        bench_adaptive_cmd,
        bench_cmd,
        bench_runtime_cmd,
        bench_serve_cmd,
        distill_cmd,
        generate_cmd,
        models_cmd,
        serve_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="quickdraft", description="Lossless speculative decoding: faster generation, identical output."
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (
        generate_cmd,
        batch_cmd,
        models_cmd,
        serve_cmd,
        bench_cmd,
        bench_runtime_cmd,
        bench_adaptive_cmd,
        bench_serve_cmd,
        distill_cmd,
    ):
        command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
