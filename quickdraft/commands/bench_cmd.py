"""`quickdraft bench`: speculative decoding vs plain decoding (and transformers) on a prompt set."""

import argparse
import json
import sys
from pathlib import Path

from quickdraft.commands.arguments import (
    add_device_argument,
    add_prompts_argument,
    add_runtime_arguments,
    comma_list,
    k_list,
    output_dir,
)
from quickdraft.config import DEFAULT_MODEL
from quickdraft.errors import UsageError


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run every method on every prompt, interleaved, several times; write results.json, "
        "report.md and PNG plots to --out."
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"target: built-in name or HF directory (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--drafters",
        default="none,ngram",
        type=comma_list,
        help=(
            "comma list: none, ngram, head, head:DIR, draft model names/paths, or drafters joined by + "
            "for --k auto to choose between (ngram+head, run at auto only); default none,ngram; "
            "none, the baseline, always runs"
        ),
    )
    parser.add_argument(
        "--ks",
        default="4",
        type=k_list,
        help="comma list of draft lengths, e.g. 1,2,4,auto; each drafter runs at each k (default 4)",
    )
    add_prompts_argument(
        parser,
        required=False,
        help="Spec-Bench style prompts (question_id, category, turns); required unless --from-results",
    )
    parser.add_argument(
        "--categories", default=None, type=comma_list, help="comma list of categories to run (default all)"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="run the first N prompts of each category (default all)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="most new tokens per generation (default 128); EOS ends earlier"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default); identity is checked only when greedy"
    )
    parser.add_argument("--repeats", type=int, default=3, help="passes over all prompts and methods (default 3)")
    parser.add_argument(
        "--peers",
        default=[],
        type=comma_list,
        help="hf: also time transformers' generate (greedy, prompt lookup, assistant); with --dtype auto every "
        "method then runs float32, the weights transformers runs",
    )
    parser.add_argument(
        "--llama-cpp",
        type=Path,
        metavar="BIN_DIR",
        help="a llama.cpp build's bin/ folder (../shared/tools/build-llama-cpp.sh): also time llama-server on the "
        "model's GGUF file, plain and with its n-gram speculation (--spec-type ngram-simple), same prompt ids",
    )
    parser.add_argument(
        "--hf-lookup-tokens", type=int, default=4, help="prompt_lookup_num_tokens of the transformers peer (default 4)"
    )
    add_runtime_arguments(parser, "the quickdraft methods")
    add_device_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="base seed of sampled runs (default 0)")
    parser.add_argument("--out", required=True, type=Path, help="directory for results.json, report.md and the plots")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--from-results",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: redo the summary, report.md and plots of an earlier results.json into --out",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from quickdraft.bench.report import method_table
    from quickdraft.bench.summary import OVERALL
    from quickdraft.models.loading import check_device

    if not args.from_results:
        check_device(args.device)  # before --out is created
    out = output_dir(args.out)
    results = _read_results(args.from_results) if args.from_results else _measure(args)
    paths = write_outputs(results, out)
    print(method_table(results["summary"]["groups"][OVERALL]))
    print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def write_outputs(results: dict, out: Path) -> list[Path]:
    """Summarize `results` into it, then write results.json, report.md and the plots; returns the paths."""
    from quickdraft.bench.plots import write_plots
    from quickdraft.bench.report import render_report
    from quickdraft.bench.summary import summarize

    results["summary"] = summarize(results)
    (out / "results.json").write_text(json.dumps(results))
    (out / "report.md").write_text(render_report(results))
    return [out / "results.json", out / "report.md", *write_plots(results, out)]


def _measure(args: argparse.Namespace) -> dict:
    import torch
    from transformers.utils import logging as transformers_logging

    from quickdraft.bench.runner import BenchConfig, run_bench

    if args.prompts is None:
        raise UsageError("--prompts is required to measure; pass a JSONL prompt file (or --from-results to re-render)")
    config = BenchConfig(
        model=args.model,
        dataset=Path(args.prompts),
        drafters=tuple(args.drafters),
        ks=tuple(args.ks),
        categories=tuple(args.categories) if args.categories else None,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        repeats=args.repeats,
        peers=tuple(args.peers),
        hf_lookup_tokens=args.hf_lookup_tokens,
        llama_cpp=args.llama_cpp,
        runtime=args.runtime,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        progress=not args.no_progress,
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers_logging.set_verbosity_error()
    return run_bench(config)


def _read_results(path: Path) -> dict:
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}; pass a results.json written by quickdraft bench") from exc
    if not isinstance(results, dict) or "measurements" not in results:
        raise UsageError(f"{path} has no measurements; pass a results.json written by quickdraft bench")
    return results
