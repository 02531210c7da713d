"""The drafters a run uses when none are named (`quickdraft generate` and `serve`, `Engine.from_names`).

Under k="auto": n-gram lookup, joined by the target's shipped draft head when one ships for it
(`quickdraft/heads/<target name>/`, trained on the same weights). The controller drafts with
whichever pays at each step, so the pair helps both where the output copies its context (n-gram)
and where it does not (the head); BENCHMARKS.md measures the pair against each alone. A fixed k
drives a single drafter: n-gram, which suits a fixed k better than the head does.
"""

from quickdraft.drafters.head.drafter import shipped_head_for
from quickdraft.models.loading import LoadedModel


def default_drafter(target: LoadedModel, k: int | str) -> str:
    """The drafter spec for `target` at `k` ("ngram" or "ngram,head")."""
    if k == "auto" and shipped_head_for(target) is not None:
        return "ngram,head"
    return "ngram"
