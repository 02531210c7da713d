"""`quickdraft generate`: one streamed speculative generation, with stats and an optional comparison."""

import argparse
import json
import sys
from typing import TYPE_CHECKING

from quickdraft.commands.arguments import add_model_arguments, load_engine
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.errors import UsageError
from quickdraft.stats import GenerationStats

if TYPE_CHECKING:  # the engine (torch, transformers) is imported when the command runs: --help and usage errors at once
    from quickdraft.engine import Engine, Finished

WARMUP_TOKENS = 4  # a short untimed run first, so neither timed run pays one-time start-up costs


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate text with speculative decoding; the output is exactly what the target alone would write."
    )
    parser.add_argument(
        "prompt", help="the prompt: a user message in the model's chat template when it has one, else plain text"
    )
    add_model_arguments(parser)
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default 0)")
    parser.add_argument("--top-k", type=int, default=0, help="sample only from the k most likely tokens; 0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 = off")
    parser.add_argument("--seed", type=int, default=None, help="seed of this request's RNG, for reproducible sampling")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when this text appears (repeatable); it is not printed",
    )
    formats = parser.add_mutually_exclusive_group()
    formats.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message in the model's chat template (the default when the model has one; "
        "with --chat a model without one is an error)",
    )
    formats.add_argument(
        "--raw",
        action="store_true",
        help="feed the prompt as plain text for the model to continue, without the chat template; special tokens' "
        "strings in it (such as <|im_start|>) stay text",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run the target alone, then print the speedup and whether outputs are identical",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object {text, stats} instead of streaming")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    engine = load_engine(args)
    has_template = bool(engine.target.tokenizer.chat_template)
    chat = args.chat or (has_template and not args.raw)
    prompt_ids = engine.encode(args.prompt, chat=chat)
    if args.compare:
        engine.generate(prompt_ids, SamplingParams(max_new_tokens=WARMUP_TOKENS))
    result = engine.generate(prompt_ids, params) if args.json else _stream_to_stdout(engine, prompt_ids, params)
    baseline = engine.generate(prompt_ids, params, spec=engine.spec_with(drafter="none")) if args.compare else None
    if args.json:
        print(json.dumps(_json_report(engine.spec, result, baseline)))
    else:
        _print_report(engine.spec, result, baseline)
    note = empty_answer_note(result, chat, has_template)
    if note:
        print(note, file=sys.stderr)
    return 0


def empty_answer_note(result: "Finished", chat: bool, has_template: bool) -> str | None:
    """Why nothing was printed, when nothing was (else None)."""
    if result.text:
        return None
    if result.stats.generated_tokens:
        return (
            f"quickdraft: the answer's {result.stats.generated_tokens} tokens hold no text "
            "(special tokens only, or a --stop string at its very start)"
        )
    if chat:
        hint = "try another wording, or sample with --temperature 0.7"
    elif has_template:
        hint = "the model has a chat template: drop --raw to send the prompt through it"
    else:
        hint = "this model continues text: give it the beginning of what it should write"
    return f"quickdraft: the model ended its answer at once (end of sequence), so there is no text; {hint}"


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    if not args.prompt.strip():
        raise UsageError("the prompt is empty; pass some text to continue")
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
    )


def _stream_to_stdout(engine: "Engine", prompt_ids: list[int], params: SamplingParams) -> "Finished":
    from quickdraft.engine import TextDelta

    for event in engine.stream(prompt_ids, params):
        if isinstance(event, TextDelta):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        else:
            sys.stdout.write("\n")
            return event
    raise AssertionError("stream ended without a Finished event")


def _json_report(spec: SpecConfig, result: "Finished", baseline: "Finished | None") -> dict:
    report = {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "drafter": spec.drafter,
        "k": spec.k,
        "stats": result.stats.to_dict(),
    }
    if baseline is not None:
        report["stats"]["baseline_tokens_per_second"] = baseline.stats.tokens_per_second
        report.update(
            baseline_text=baseline.text,
            identical=baseline.token_ids == result.token_ids,
            speedup=_speedup(result.stats, baseline.stats),
        )
    return report


def _speedup(spec: GenerationStats, baseline: GenerationStats) -> float:
    return spec.tokens_per_second / baseline.tokens_per_second if baseline.tokens_per_second else 0.0


def _print_report(spec: SpecConfig, result: "Finished", baseline: "Finished | None") -> None:
    stats = result.stats
    positions = " ".join(f"{rate:.2f}" for rate in stats.acceptance_by_position) or "-"
    lines = [
        "",
        f"--- {stats.generated_tokens} tokens in {stats.total_seconds:.2f} s: {stats.tokens_per_second:.1f} tok/s "
        f"(finish: {result.finish_reason}; drafter {spec.drafter}, k {spec.k})",
        f"target forwards {stats.target_forwards}, drafted {stats.draft_tokens}, accepted {stats.accepted_tokens} "
        f"(acceptance {stats.acceptance_rate:.1%}), mean accepted length tau {stats.mean_accepted_length:.2f}",
        f"acceptance by draft position: {positions}",
        f"accepted-length histogram (0..k): {stats.accepted_length_histogram}",
        f"steps by drafted k (0..k): {stats.k_histogram}, by drafter: {stats.drafter_steps}",
        f"time: first token {stats.prefill_seconds * 1000:.0f} ms, drafting {stats.draft_seconds:.2f} s, "
        f"verifying {stats.verify_seconds:.2f} s",
    ]
    if baseline is not None:
        identical = baseline.token_ids == result.token_ids
        lines.append(
            f"target alone: {baseline.stats.tokens_per_second:.1f} tok/s "
            f"-> speedup {_speedup(stats, baseline.stats):.2f}x, "
            f"outputs {'identical' if identical else 'DIFFERENT'}"
        )
    print("\n".join(lines))
