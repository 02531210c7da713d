"""Corpus lookup: propose what the target itself most often wrote after the context's last tokens.

A table, counted over a corpus of the target's own answers (`quickdraft distill`'s data shards), maps each
context of 1..`max_order` tokens that preceded an answer token at least `min_count` times to the token that
most often came next, with that token's share of the context's occurrences. A proposal chains: the longest
tail of the context that the table holds gives the next token, which joins the tail, until k tokens or no
tail matches. No model and no distribution (point masses), a few dictionary lookups per token: it drafts the
target's stock phrases where prompt lookup (`ngram`) finds nothing to copy.

`Draft.source` is the first token's share in tenths ("share-7": 0.7 <= share < 0.8), so the adaptive
controller learns acceptance per confidence.

`corpus` uses the table shipped for the target (quickdraft/tables/<target name>.safetensors), `corpus:FILE`
another one; a table counted for one vocabulary is refused by a target with another.
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel

SHIPPED_TABLES = Path(__file__).resolve().parents[1] / "tables"  # quickdraft/tables/<target name>.safetensors
MAX_ORDER, MIN_COUNT = 3, 2  # the shipped tables' settings: contexts of 1..3 tokens seen at least twice
KEY_BITS = 62  # a context's key: its order above its tokens' ids, packed into a non-negative int64


@dataclass(frozen=True)
class CorpusTable:
    """Each counted context's most frequent next token, by context key (`context_key`)."""

    keys: torch.Tensor  # [N] int64, ascending
    next_tokens: torch.Tensor  # [N] int64: the token that most often followed the context
    best_counts: torch.Tensor  # [N] int64: how often it did
    totals: torch.Tensor  # [N] int64: how often the context preceded an answer token
    vocab_size: int
    max_order: int
    target: str  # the model whose answers were counted
    answer_tokens: int  # answer tokens counted

    def lookup(self) -> dict[int, tuple[int, float]]:
        """key -> (next token, its share): the form a drafter reads."""
        shares = (self.best_counts.double() / self.totals.double()).tolist()
        return dict(zip(self.keys.tolist(), zip(self.next_tokens.tolist(), shares)))


def token_bits(vocab_size: int) -> int:
    return max(1, (vocab_size - 1).bit_length())


def context_key(context: Sequence[int], bits: int) -> int:
    """The key of a context (its order above its packed token ids)."""
    key = len(context)
    for token in context:
        key = (key << bits) | token
    return key


def count_table(
    answers: Iterable[tuple[Sequence[int], int]],
    vocab_size: int,
    target: str,
    max_order: int = MAX_ORDER,
    min_count: int = MIN_COUNT,
) -> CorpusTable:
    """Count a table from (sequence, answer start) pairs: every answer token with the 1..max_order tokens before it
    (which may reach back into the prompt); contexts seen fewer than `min_count` times are dropped."""
    bits = token_bits(vocab_size)
    if max_order < 1 or max_order * bits + max_order.bit_length() > KEY_BITS:
        raise UsageError(f"a corpus table's contexts must hold 1..{KEY_BITS // bits - 1} tokens here, got {max_order}")
    pairs: Counter[tuple[int, int]] = Counter()  # (context key, next token) -> occurrences
    answer_tokens = 0
    for sequence, answer_start in answers:
        tokens = list(sequence)
        for position in range(max(answer_start, 1), len(tokens)):
            answer_tokens += 1
            for order in range(1, min(max_order, position) + 1):
                pairs[context_key(tokens[position - order : position], bits), tokens[position]] += 1
    totals: Counter[int] = Counter()
    best: dict[int, tuple[int, int]] = {}  # key -> (count, token), the most frequent (lowest id on ties)
    for (key, token), count in pairs.items():
        totals[key] += count
        if key not in best or (count, -token) > (best[key][0], -best[key][1]):
            best[key] = (count, token)
    kept = sorted(key for key, total in totals.items() if total >= min_count)
    return CorpusTable(
        keys=torch.tensor(kept, dtype=torch.int64),
        next_tokens=torch.tensor([best[key][1] for key in kept], dtype=torch.int64),
        best_counts=torch.tensor([best[key][0] for key in kept], dtype=torch.int64),
        totals=torch.tensor([totals[key] for key in kept], dtype=torch.int64),
        vocab_size=vocab_size,
        max_order=max_order,
        target=target,
        answer_tokens=answer_tokens,
    )


def save_table(table: CorpusTable, path: Path) -> None:
    """One safetensors file: the four columns (token ids as int32), the settings in its metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "keys": table.keys,
            "next_tokens": table.next_tokens.int(),
            "best_counts": table.best_counts.int(),
            "totals": table.totals.int(),
        },
        str(path),
        metadata={
            "vocab_size": str(table.vocab_size),
            "max_order": str(table.max_order),
            "target": table.target,
            "answer_tokens": str(table.answer_tokens),
        },
    )


def load_table(path: Path) -> CorpusTable:
    try:
        with safe_open(str(path), framework="pt") as file:
            meta = file.metadata() or {}
            columns = {name: file.get_tensor(name).long() for name in ("keys", "next_tokens", "best_counts", "totals")}
        return CorpusTable(
            **columns,
            vocab_size=int(meta["vocab_size"]),
            max_order=int(meta["max_order"]),
            target=meta["target"],
            answer_tokens=int(meta["answer_tokens"]),
        )
    except Exception as error:  # a foreign or damaged file, whatever safetensors makes of it
        raise UsageError(
            f"{path} is not a corpus table ({error}); build one with quickdraft distill table DATA --out FILE"
        ) from error


def table_path(argument: str, target_name: str) -> Path:
    """`corpus:FILE`, or bare `corpus`: the table shipped for the target."""
    if argument:
        path = Path(argument).expanduser()
        if path.is_file():
            return path
        raise UsageError(f"no corpus table at {argument}; build one with quickdraft distill table DATA --out FILE")
    path = SHIPPED_TABLES / f"{Path(target_name).name}.safetensors"
    if path.is_file():
        return path
    shipped = ", ".join(sorted(p.stem for p in SHIPPED_TABLES.glob("*.safetensors"))) or "none"
    raise UsageError(
        f"no corpus table shipped for {target_name} (shipped for: {shipped}); "
        "build one with quickdraft distill table DATA --out FILE and pass corpus:FILE"
    )


class CorpusDrafter(Drafter):
    lookup_only = True  # a proposal costs a few dictionary lookups, no model forward

    def __init__(self, table: CorpusTable, name: str = "corpus") -> None:
        self.name = name
        self.max_order = table.max_order
        self._bits = token_bits(table.vocab_size)
        self._next = table.lookup()  # shared by every fork: read only

    @classmethod
    def from_argument(cls, argument: str, target: LoadedModel, options: DrafterLoadOptions) -> "CorpusDrafter":
        path = table_path(argument, target.info.name)
        table = load_table(path)
        if table.vocab_size != target.info.vocab_size:
            raise UsageError(
                f"corpus table {path} counts {table.target}'s answers in a vocabulary of {table.vocab_size} tokens; "
                f"target {target.info.name} has {target.info.vocab_size}; build a table from this target's answers"
            )
        return cls(table, name=f"corpus:{argument}" if argument else "corpus")

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        pass  # no request state: the table is all it reads

    def propose(self, context_ids: list[int], k: int) -> Draft:
        tail = list(context_ids[-self.max_order :])
        tokens: list[int] = []
        first_share = 0.0
        while len(tokens) < k:
            hit = self._longest_match(tail)
            if hit is None:
                break
            token, share = hit
            first_share = first_share if tokens else share
            tokens.append(token)
            tail = [*tail, token][-self.max_order :]
        source = f"share-{min(9, int(first_share * 10))}" if tokens else ""
        return Draft(token_ids=tuple(tokens), source=source)

    def _longest_match(self, tail: list[int]) -> tuple[int, float] | None:
        for order in range(len(tail), 0, -1):
            hit = self._next.get(context_key(tail[len(tail) - order :], self._bits))
            if hit is not None:
                return hit
        return None
