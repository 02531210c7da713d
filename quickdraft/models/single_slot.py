"""`SingleSlot`: a batch-1 runner (transformers) seen as a `BatchRunner` that holds one sequence.

The engine steps every target through `forward_batch`; a runner that owns one cache can run one
sequence at a time, so this view hands out a single slot and refuses a second.
"""

from collections.abc import Sequence

from quickdraft.errors import InternalError
from quickdraft.models.base import BatchRunner, ModelRunner, SequenceOutput, SequenceStep

SLOT = 1


class SingleSlot:
    """One slot over `runner`'s own cache; forwards of one sequence at a time."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._open = False

    def open_slot(self) -> int:
        if self._open:
            raise InternalError(f"{type(self.runner).__name__} holds one sequence; its slot is in use")
        self._open = True
        self.runner.rollback(0)
        return SLOT

    def close_slot(self, slot: int) -> None:
        self._open = False

    def slot_length(self, slot: int) -> int:
        return self.runner.cache_length

    def rollback_slot(self, slot: int, length: int) -> None:
        self.runner.rollback(length)

    def slot_bytes(self) -> int:
        return 0  # the runner's cache grows as it needs; nothing is reserved per slot

    def forward_batch(self, steps: Sequence[SequenceStep]) -> list[SequenceOutput]:
        if len(steps) != 1:
            raise InternalError(f"{type(self.runner).__name__} runs one sequence per forward, got {len(steps)}")
        (step,) = steps
        if self.runner.cache_length == 0 and step.logits != "all":  # a prompt's first chunk
            out = self.runner.prefill(step.token_ids, hidden_layers=step.hidden_layers)
            logits, hidden = out if step.hidden_layers else (out, None)
            return [SequenceOutput(None if step.logits == "none" else logits[None], hidden)]
        out = self.runner.forward(step.token_ids, hidden_layers=step.hidden_layers)
        logits, hidden = out if step.hidden_layers else (out, None)
        rows = {"all": logits, "last": logits[-1:], "none": None}[step.logits]
        return [SequenceOutput(rows, hidden)]


def batch_view(runner: ModelRunner) -> tuple[BatchRunner | SingleSlot, int | None]:
    """(the runner as the engine steps it, the most sequences it holds at once: None for no limit)."""
    if isinstance(runner, BatchRunner):
        return runner, None
    return SingleSlot(runner), 1
