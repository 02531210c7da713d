"""`quickdraft bench-adaptive`: --k auto against the target alone and fixed k (see `quickdraft.bench.adaptive`)."""

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.bench.dataset import Prompt, load_prompts, select_prompts
from quickdraft.commands.arguments import add_prompts_argument, add_runtime_arguments, comma_list
from quickdraft.config import DEFAULT_MODEL, SpecConfig
from quickdraft.errors import UsageError
from quickdraft.models.store import cache_dir, local_model_dir

if TYPE_CHECKING:  # the engine (torch, transformers) is imported when the command runs: --help and usage errors at once
    from quickdraft.engine import Engine

RANDOM_DRAFT = "random-draft"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Side by side in one process: target alone, each fixed k, and --k auto, on a hopeless drafter "
        "(safety) and on ngram (or --drafters) with real prompts (quality). "
        "Writes adaptive.md, adaptive.png and adaptive.json."
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"target: built-in name or HF directory (default {DEFAULT_MODEL})"
    )
    add_prompts_argument(parser, required=True, help="Spec-Bench style prompts (question_id, category, turns)")
    parser.add_argument(
        "--cases", default="safety,quality", type=comma_list, help="safety, quality or both (default safety,quality)"
    )
    parser.add_argument(
        "--per-category", type=int, default=2, help="quality: first N prompts of each category (default 2)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=96, help="quality: tokens per generation (default 96)")
    parser.add_argument(
        "--safety-prompts", type=int, default=4, help="safety: prompts, first of evenly spread categories (default 4)"
    )
    parser.add_argument(
        "--safety-max-new-tokens", type=int, default=64, help="safety: tokens per generation (default 64)"
    )
    parser.add_argument(
        "--draft-layers", type=int, default=2, help="safety: layers of the random-weight draft model (default 2)"
    )
    parser.add_argument(
        "--drafters",
        default="ngram",
        type=comma_list,
        help="quality: comma-separated drafters, each run alone at every fixed k, "
        "and auto choosing among them per step (default ngram; e.g. ngram,head)",
    )
    parser.add_argument(
        "--ks", default="1,2,3,4,6,8", type=comma_list, help="fixed k values to compare (default 1,2,3,4,6,8)"
    )
    parser.add_argument("--k-max", type=int, default=8, help="largest k auto may choose (default 8)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds over all prompts and settings; medians are kept (default 1)"
    )
    add_runtime_arguments(parser, "the target and the random draft")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="directory for adaptive.json, adaptive.md, the raw measurements and the plot",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from quickdraft.bench import adaptive, adaptive_report
    from quickdraft.engine import Engine
    from quickdraft.models.loading import load_model_dir

    cases = args.cases
    if not set(cases) <= {"safety", "quality"}:
        raise UsageError(f"--cases must name safety and/or quality, got {','.join(cases)!r}")
    if not all(k.isdigit() for k in args.ks):
        raise UsageError(f"--ks must be non-negative integers, got {','.join(args.ks)!r}")
    ks = [int(k) for k in args.ks]
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    drafters = args.drafters
    SpecConfig(drafter=",".join(drafters), k="auto", k_max=args.k_max)  # validate before loading models
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = load_prompts(args.prompts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target_dir = local_model_dir(args.model)
    engine = Engine(load_model_dir(target_dir, runtime=args.runtime, dtype=args.dtype, name=args.model))
    results, raw = {}, {}
    for case in cases:
        trials, costs = _run_case(case, engine, target_dir, prompts, args, ks, drafters)
        raw[case] = trials
        adaptive.save_raw(raw, out / "adaptive-raw.json")  # first, so a long run's numbers survive any report error
        speeds = adaptive.speeds(trials)
        overall = speeds["overall"]
        best, _ = adaptive_report.best_fixed(overall, adaptive_report.fixed_labels(overall))
        results[case] = {
            "speeds": speeds,
            "cpu_speeds": adaptive.speeds(trials, clock="cpu"),
            "mismatches": adaptive.mismatches(trials),
            "adaptation": adaptive.adaptation(trials),
            "same_work": adaptive.same_work_timing(trials, best),
            "costs": costs,
            "drafters": [RANDOM_DRAFT] if case == "safety" else drafters,
        }
    command = "quickdraft " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    (out / "adaptive.md").write_text(adaptive_report.markdown(results, command))
    (out / "adaptive.json").write_text(json.dumps({"command": command, "results": results}, indent=1))
    adaptive_report.plot(results, out / "adaptive.png")
    print(adaptive_report.markdown(results, command))
    return 0


def _run_case(
    case: str,
    engine: "Engine",
    target_dir: Path,
    dataset: list[Prompt],
    args: argparse.Namespace,
    ks: list[int],
    drafters: list[str],
) -> tuple[list, dict]:
    """The case's trials, and the engine's cost model at its start and end."""
    from quickdraft.bench import adaptive

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if case == "safety":
        draft_dir = adaptive.random_draft_dir(target_dir, cache_dir() / "bench", args.draft_layers)  # built once
        adaptive.add_random_draft(engine, draft_dir, RANDOM_DRAFT, args.runtime, args.dtype)
        firsts = select_prompts(dataset, limit=1)
        prompts = firsts[:: max(1, len(firsts) // args.safety_prompts)][: args.safety_prompts]
        settings, max_new_tokens = adaptive.settings([RANDOM_DRAFT], ks, args.k_max), args.safety_max_new_tokens
    else:
        prompts = select_prompts(dataset, limit=args.per_category)
        settings, max_new_tokens = adaptive.settings(drafters, ks, args.k_max), args.max_new_tokens
    start = adaptive.cost_profile(engine, settings[-1].spec)  # calibrated on first use
    trials = adaptive.run_case(engine, case, prompts, settings, max_new_tokens, args.repeats, log)
    return trials, {"start": start, "end": adaptive.cost_profile(engine, settings[-1].spec)}
