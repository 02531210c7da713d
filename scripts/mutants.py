"""Named mutants: deliberate bugs the test suite must catch, applied one at a time.

    python scripts/mutants.py            # every mutant (what `make mutants` runs)
    python scripts/mutants.py --list     # their names
    python scripts/mutants.py rollback-off-by-one ngram-shifted-by-one

Each mutant replaces one exact piece of code (which must occur exactly once, so a mutant whose code
has moved fails loudly instead of testing nothing) in a copy of the checkout, then runs the tests
that guard that promise, stopping at the first failure. A mutant is killed when they fail; one that
survives is a missing test. Exit status 1 when any survives. `docs/testing.md` says which test
guards which promise.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file to change, relative to the checkout
    before: str  # the exact code replaced (must occur once)
    after: str
    tests: tuple[str, ...]  # pytest arguments: the tests that must fail


MUTANTS = [
    Mutant(
        "rollback-off-by-one",
        "quickdraft/engine.py",
        "runner.rollback(committed_length + 1 + verdict.num_accepted)",
        "runner.rollback(committed_length + verdict.num_accepted)",
        ("tests/test_exactness.py", "-k", "cache_free"),
    ),
    Mutant(
        "residual-from-the-wrong-row",
        "quickdraft/verify.py",
        "residual_distribution(target_probs[num_accepted], draft_probs[num_accepted])",
        "residual_distribution(target_probs[num_accepted], draft_probs[max(num_accepted - 1, 0)])",
        ("tests/test_verify.py", "tests/test_exactness.py", "-k", "sampled or law"),
    ),
    Mutant(
        "draft-probs-left-unwarped",
        "quickdraft/drafters/draft_model.py",
        "rows.append(probs)",
        "rows.append(torch.softmax(self._fit_vocab(logits), -1))",
        ("tests/test_exactness.py", "-k", "sampled"),
    ),
    Mutant(
        "kv-write-one-position-late",
        "quickdraft/models/native/runner.py",
        "self._cache.write(i, start, qk[:, spec.num_heads :], values)",
        "self._cache.write(i, start + 1, qk[:, spec.num_heads :], values)",
        ("tests/test_exactness.py", "-k", "cache_free and native"),
    ),
    Mutant(
        "eos-ignored-inside-an-accepted-draft",
        "quickdraft/engine.py",
        "            if token in self._eos:\n",
        "            if token in self._eos and token == tokens[-1]:\n",
        ("tests/test_engine.py", "-k", "eos"),
    ),
    Mutant(
        "sliding-window-one-too-wide",
        "quickdraft/models/native/layers.py",
        "blocked |= key_pos <= query_pos - window",
        "blocked |= key_pos < query_pos - window",
        ("tests/test_native_runtime.py", "tests/test_exactness.py", "-k", "window or gemma3"),
    ),
    Mutant(
        "ngram-proposal-shifted-by-one",
        "quickdraft/drafters/ngram.py",
        "context_ids[start + n : start + n + k]",
        "context_ids[start + n + 1 : start + n + k + 1]",
        ("tests/test_drafters.py",),
    ),
    Mutant(
        "head-vocabulary-map-off-by-one",
        "quickdraft/drafters/head/drafter.py",
        "return int(self.vocab_ids[logits.argmax()]), None",
        "return int(self.vocab_ids[(logits.argmax() + 1) % len(self.vocab_ids)]), None",
        ("tests/test_head.py",),
    ),
]


def copy_checkout(destination: Path) -> None:
    """The files git tracks, plus untracked ones it does not ignore, as they are in the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    for relative in listed.stdout.splitlines():
        source = ROOT / relative
        if source.is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / relative)


def run(mutant: Mutant) -> tuple[bool, float]:
    """(killed, seconds) for one mutant, tested in a fresh copy of the checkout."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        copy = Path(scratch)
        copy_checkout(copy)
        target = copy / mutant.path
        source = target.read_text()
        if source.count(mutant.before) != 1:
            sys.exit(
                f"mutant {mutant.name}: {mutant.path} holds its code {source.count(mutant.before)} times; update it"
            )
        target.write_text(source.replace(mutant.before, mutant.after))
        env = {**os.environ, "PYTHONPATH": str(copy)}  # the copy's package, not the installed checkout
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode == 5:
            sys.exit(f"mutant {mutant.name}: its tests {' '.join(mutant.tests)} select nothing; update them")
        return result.returncode != 0, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants' names and exit")
    args = parser.parse_args()
    by_name = {mutant.name: mutant for mutant in MUTANTS}
    if args.list:
        print("\n".join(by_name))
        return 0
    if unknown := [name for name in args.names if name not in by_name]:
        parser.error(f"unknown mutants {', '.join(unknown)}; see --list")
    survivors = []
    for mutant in [by_name[name] for name in args.names] or MUTANTS:
        killed, seconds = run(mutant)
        print(f"{'killed  ' if killed else 'SURVIVED'} {mutant.name} ({seconds:.0f} s)", flush=True)
        if not killed:
            survivors.append(mutant.name)
    ran = len(args.names) or len(MUTANTS)
    print(f"{len(survivors)} of {ran} mutants survived" + (": each is a missing test" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
