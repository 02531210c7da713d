"""CLI sub-commands; each module exposes `register(subparsers)` and sets a `func(args) -> int`."""
