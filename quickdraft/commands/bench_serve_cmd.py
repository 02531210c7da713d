"""`bench-serve`: TTFT, TPOT, ITL, throughput, goodput and exactness of any OpenAI-compatible chat endpoint
under a bounded closed-loop load, one concurrency level after another; or several runs side by side."""

import argparse
import json
import os
import sys
from pathlib import Path

from quickdraft.bench.dataset import load_prompts, select_prompts
from quickdraft.bench.serve.load import LevelRun, ServeBenchConfig, api_base, check_extra_body, run_load
from quickdraft.bench.serve.report import level_tables, throughput_ratio_table
from quickdraft.bench.serve.results import (
    merge_runs,
    read_results,
    read_runs,
    results_dict,
    write_combined,
    write_run,
)
from quickdraft.bench.serve.summary import level_summaries
from quickdraft.commands.arguments import add_prompts_argument, comma_list, output_dir
from quickdraft.errors import UsageError

DEFAULT_CONCURRENCY = "1,2,4,8,16"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Send streamed chat requests to --url with C in flight at each concurrency C (closed loop); "
        "write results.json, report.md, latency.png and throughput.png to --out. With --combine, measure "
        "nothing: put earlier runs side by side; with --merge, join one configuration's runs of some levels each."
    )
    parser.add_argument(
        "--url",
        help="the API base URL, as an OpenAI client's base_url (http://127.0.0.1:8000/v1); "
        "a URL without a path gets /v1",
    )
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' (default $OPENAI_API_KEY)")
    parser.add_argument("--model", default=None, help="the model to request (default: the first id of GET /models)")
    add_prompts_argument(
        parser, required=False, help="Spec-Bench style prompts; each request sends a prompt's first turn"
    )
    parser.add_argument("--per-category", type=int, default=1, help="prompts per category, in file order (default 1)")
    parser.add_argument(
        "--concurrency",
        default=comma_list(DEFAULT_CONCURRENCY),
        type=comma_list,
        help=f"comma list of concurrency levels, run in this order (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per level, cycling through the prompts (default: max(C, number of prompts) at concurrency C)",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request (default 128)")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default); outputs are compared only when 0"
    )
    parser.add_argument(
        "--ttft-target",
        type=float,
        default=1.0,
        help="seconds; goodput counts requests with TTFT within it (default 1)",
    )
    parser.add_argument(
        "--extra-body",
        default="{}",
        metavar="JSON",
        help='a JSON object merged into every request body, e.g. \'{"quickdraft": {"drafter": "none"}}\'',
    )
    parser.add_argument(
        "--label", default=None, help="the run's name in reports (default: host:port, model, and the extra body if any)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request, end to end (default 300)")
    parser.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: one report.md and plots of these runs, one column/line each, to --out",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: one configuration's runs, each of some levels, joined into one run (results, report "
        "and plots) in --out, levels in the order given",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the results, report and plots")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.combine and args.merge:
        raise UsageError("--combine and --merge each make one report; pass one of them")
    if args.combine:
        return _combine(args)
    if args.merge:
        return _merge(args)
    config = _config(args)
    out = output_dir(args.out)
    load_run = run_load(config, on_level=_print_progress)
    return _write(results_dict(config, load_run, args.label, Path(args.prompts)), out)


def _write(results: dict, out: Path) -> int:
    """One run's results, report and plots into `out`; its level tables printed."""
    paths = write_run(results, out)
    print(level_tables(level_summaries(results)))
    print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def _combine(args: argparse.Namespace) -> int:
    if args.url or args.prompts:
        raise UsageError("--combine measures nothing; drop --url and --prompts, or drop --combine to measure")
    runs = read_runs(args.combine)
    paths = write_combined(runs, output_dir(args.out))
    print(throughput_ratio_table(runs))
    print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def _merge(args: argparse.Namespace) -> int:
    if args.url or args.prompts:
        raise UsageError("--merge measures nothing; drop --url and --prompts, or drop --merge to measure")
    return _write(merge_runs([read_results(path) for path in args.merge]), output_dir(args.out))


def _config(args: argparse.Namespace) -> ServeBenchConfig:
    if not args.url or not args.prompts:
        raise UsageError("--url and --prompts are required to measure (or pass --combine or --merge RESULTS_JSON...)")
    _require_positive(
        {
            "--per-category": args.per_category,  # select_prompts would name its own --limit
            "--max-tokens": args.max_tokens,
            "--ttft-target": args.ttft_target,
            "--timeout": args.timeout,
        }
        | ({"--requests": args.requests} if args.requests is not None else {})
    )
    if args.temperature < 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature:g}")
    return ServeBenchConfig(
        base_url=api_base(args.url),
        api_key=args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY"),
        model=args.model,
        prompts=tuple(select_prompts(load_prompts(args.prompts), limit=args.per_category)),
        concurrency=_concurrency_levels(args.concurrency),
        requests=args.requests,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        ttft_target=args.ttft_target,
        extra_body=check_extra_body(_parse_extra_body(args.extra_body)),
        timeout=args.timeout,
    )


def _require_positive(values: dict[str, float]) -> None:
    for flag, value in values.items():
        if not value > 0:
            raise UsageError(f"{flag} must be > 0, got {value:g}")


def _concurrency_levels(words: list[str]) -> tuple[int, ...]:
    if not all(word.isdigit() and int(word) > 0 for word in words):
        raise UsageError(f"--concurrency takes positive integers, e.g. {DEFAULT_CONCURRENCY}; got {','.join(words)}")
    levels = tuple(int(word) for word in words)
    if repeated := sorted({level for level in levels if levels.count(level) > 1}):
        raise UsageError(f"--concurrency lists {', '.join(map(str, repeated))} more than once; list each level once")
    return levels


def _parse_extra_body(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--extra-body is not valid JSON ({exc.msg} at column {exc.colno}); "
            'pass a JSON object, e.g. \'{"quickdraft": {"drafter": "none"}}\''
        ) from exc


def _print_progress(level: LevelRun) -> None:
    failed = sum(not request.ok for request in level.requests)
    print(
        f"concurrency {level.concurrency}: {len(level.requests)} requests in {level.wall_time:.1f} s, {failed} failed",
        file=sys.stderr,
    )
