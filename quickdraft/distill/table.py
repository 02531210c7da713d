"""A corpus table (`drafters.corpus`) counted over self-distillation data: the target's own answers."""

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from quickdraft.distill.data import MANIFEST, Shard, load_shards
from quickdraft.drafters.corpus import CorpusTable, count_table, save_table


def shard_answers(shards: Iterable[Shard]) -> Iterator[tuple[list[int], int]]:
    """(sequence tokens, answer start) of every sequence of `shards`: what `count_table` counts."""
    for shard in shards:
        for _, tokens, start in shard.sequences():
            yield tokens.tolist(), start


def write_table(data_dir: Path, path: Path, max_order: int, min_count: int) -> CorpusTable:
    """Count every answer of every shard in `data_dir` (a `quickdraft distill` run's data directory) into a table,
    saved at `path`."""
    shards = load_shards(data_dir)  # refuses a directory without data
    target = json.loads((data_dir / MANIFEST).read_text())["target"]
    table = count_table(shard_answers(shards), target["vocab_size"], target["name"], max_order, min_count)
    save_table(table, path)
    return table
