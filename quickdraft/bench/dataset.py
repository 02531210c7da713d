"""Prompt files in the Spec-Bench `question.jsonl` format, loaded and validated.

One JSON object a line: `question_id` (int or string), `category` (non-empty string), `turns` (a
non-empty list of non-empty strings: user messages), optionally `reference`. Blank lines are
skipped. Every problem is reported as one line naming the file, the line and the fix.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import UsageError


@dataclass(frozen=True)
class Prompt:
    """One benchmark question."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]  # user messages; the benchmark sends the first one

    @property
    def first_turn(self) -> str:
        return self.turns[0]


def load_prompts(path: str | Path) -> list[Prompt]:
    """Every prompt of a JSONL file, in file order; raises UsageError naming file:line on bad input."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read dataset {path}: {exc}") from exc
    prompts: list[Prompt] = []
    line_of_id: dict[int | str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompt = _parse_line(line, f"{path}:{number}")
        if prompt.question_id in line_of_id:
            raise UsageError(
                f"{path}:{number}: question_id {prompt.question_id!r} is already used on line "
                f"{line_of_id[prompt.question_id]}; ids must be unique"
            )
        line_of_id[prompt.question_id] = number
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"{path}: no prompts; expected one JSON object per line with question_id, category, turns")
    return prompts


def select_prompts(
    prompts: list[Prompt], categories: list[str] | None = None, limit: int | None = None
) -> list[Prompt]:
    """Prompts of the given categories (all when None), at most `limit` per category, in file order."""
    available = list(dict.fromkeys(p.category for p in prompts))
    unknown = [c for c in categories or [] if c not in available]
    if unknown:
        raise UsageError(f"unknown categories {', '.join(unknown)}; the dataset has: {', '.join(available)}")
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be >= 1, got {limit}")
    wanted = set(categories or available)
    taken = dict.fromkeys(wanted, 0)
    selected = []
    for prompt in prompts:
        if prompt.category in wanted and (limit is None or taken[prompt.category] < limit):
            taken[prompt.category] += 1
            selected.append(prompt)
    return selected


def _parse_line(line: str, where: str) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); write one JSON object per line"
        ) from exc
    if not isinstance(record, dict):
        raise UsageError(
            f"{where}: expected a JSON object with question_id, category, turns, got {type(record).__name__}"
        )
    missing = [key for key in ("question_id", "category", "turns") if key not in record]
    if missing:
        raise UsageError(f"{where}: missing {', '.join(missing)}; each line needs question_id, category and turns")
    question_id, category, turns = record["question_id"], record["category"], record["turns"]
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str)):
        raise UsageError(f"{where}: question_id must be an integer or a string, got {type(question_id).__name__}")
    if not isinstance(category, str) or not category.strip():
        raise UsageError(f"{where}: category must be a non-empty string, got {category!r}")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise UsageError(f"{where}: turns must be a non-empty list of non-empty strings (user messages)")
    return Prompt(question_id=question_id, category=category, turns=tuple(turns))
