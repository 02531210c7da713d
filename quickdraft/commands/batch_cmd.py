"""`quickdraft batch`: a JSONL file of prompts through the batched engine, results to a JSONL file.

    quickdraft batch prompts.jsonl --out answers.jsonl --max-batch 8

Each input line is a JSON object with `prompt` (text: sent through the model's chat template as a
user message when it has one, unless --raw) or `messages` (chat messages), and optionally `id`,
`max_tokens`, `temperature`, `top_p` and `seed` (the command's flags are the defaults). Every
line is checked before anything runs. Each output line is written as its request finishes:
`index` (the input line's position among the prompts), `id` when given, `text`, `finish_reason`,
`prompt_tokens`, `completion_tokens` and `mean_accepted_length`. A progress bar on stderr counts
finished requests.
"""

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from quickdraft.commands.arguments import add_batch_arguments, add_model_arguments, load_engine
from quickdraft.config import SamplingParams
from quickdraft.errors import UsageError

if TYPE_CHECKING:  # the engine (torch, transformers) is imported when the command runs: --help and usage errors at once
    from quickdraft.engine import Engine
    from quickdraft.text import Messages

LINE_FIELDS = {"prompt", "messages", "id", "max_tokens", "temperature", "top_p", "seed"}


@dataclass(frozen=True)
class BatchLine:
    """One input line, checked."""

    prompt: "str | Messages"
    params: SamplingParams
    id: object = None


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Generate answers for a JSONL file of prompts, many at once; results go to a JSONL file."
    parser.add_argument("input", type=Path, help="JSONL: one object per line with prompt or messages")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the results are written to")
    add_model_arguments(parser)
    add_batch_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="default most tokens per answer (128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="default sampling temperature; 0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="default nucleus sampling mass; 1 = off")
    parser.add_argument("--seed", type=int, default=None, help="default seed of each request's RNG")
    parser.add_argument("--raw", action="store_true", help="send prompt texts as they are, without the chat template")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    defaults = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, seed=args.seed, max_new_tokens=args.max_new_tokens
    )
    lines = read_lines(args.input, defaults)
    engine = load_engine(args, args.max_batch, args.step_tokens)
    chat = not args.raw and bool(engine.target.tokenizer.chat_template)
    prompts = [engine.encode(line.prompt, chat=chat or isinstance(line.prompt, list)) for line in lines]
    failures = write_results(engine, lines, prompts, args.out)
    return 1 if failures else 0


def read_lines(path: Path, defaults: SamplingParams) -> list[BatchLine]:
    """Every line of the input, checked; UsageError naming file:line and the fix."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    lines = [_parse(raw, defaults, f"{path}:{n}") for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    if not lines:
        raise UsageError(f"{path} holds no prompts; write one JSON object per line with prompt or messages")
    return lines


def _parse(raw: str, defaults: SamplingParams, where: str) -> BatchLine:
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc.msg}); write one JSON object per line") from exc
    if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
        raise UsageError(f"{where}: expected an object with exactly one of prompt (text) or messages (a list)")
    if unknown := sorted(set(item) - LINE_FIELDS):
        raise UsageError(f"{where}: unknown fields {', '.join(unknown)}; use {', '.join(sorted(LINE_FIELDS))}")
    prompt = item.get("prompt", item.get("messages"))
    if not prompt or not isinstance(prompt, str | list):
        raise UsageError(f"{where}: prompt must be non-empty text, messages a non-empty list of messages")
    overrides = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "seed": "seed"}
    try:
        params = replace(defaults, **{field: item[key] for key, field in overrides.items() if key in item})
    except (UsageError, TypeError) as exc:
        raise UsageError(f"{where}: {exc}") from exc
    return BatchLine(prompt, params, item.get("id"))


def write_results(engine: "Engine", lines: list[BatchLine], prompts: list[list[int]], out: Path) -> int:
    """Run every prompt, writing each result as it finishes; returns how many failed."""
    from quickdraft.engine import Failed, Finished

    failures = 0
    with out.open("w", encoding="utf-8") as sink, tqdm(total=len(lines), unit="req", desc="batch") as progress:
        for index, event in engine.stream_many(prompts, [line.params for line in lines]):
            if not isinstance(event, Finished | Failed):
                continue
            record = {"index": index} | ({"id": lines[index].id} if lines[index].id is not None else {})
            if isinstance(event, Failed):
                failures += 1
                record["error"] = str(event.error)
            else:
                record |= {
                    "text": event.text,
                    "finish_reason": event.finish_reason,
                    "prompt_tokens": event.stats.prompt_tokens,
                    "completion_tokens": event.stats.generated_tokens,
                    "mean_accepted_length": event.stats.mean_accepted_length,
                }
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
            sink.flush()
            progress.update(1)
    return failures
