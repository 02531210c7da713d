"""`SlotView`: one KV cache slot of a `BatchRunner`, used as a batch-1 `ModelRunner` (a draft model drafting
for one of several running requests)."""

from collections.abc import Sequence

from quickdraft.errors import InternalError
from quickdraft.models.base import BatchRunner, SequenceStep


class SlotView:
    """The batch-1 methods (prefill, forward, rollback) on a slot of its own, opened now, closed by `close`."""

    def __init__(self, runner: BatchRunner) -> None:
        self.runner = runner
        self.info, self.device, self.dtype = runner.info, runner.device, runner.dtype
        self.slot = runner.open_slot()

    @property
    def cache_length(self) -> int:
        return self.runner.slot_length(self.slot)

    def prefill(self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()):
        self.runner.rollback_slot(self.slot, 0)
        step = SequenceStep(self.slot, tuple(token_ids), "last", tuple(hidden_layers))
        (out,) = self.runner.forward_batch([step])
        return (out.logits[0], out.hidden) if hidden_layers else out.logits[0]

    def forward(self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()):
        if not token_ids:
            raise InternalError("forward needs at least one token")
        (out,) = self.runner.forward_batch([SequenceStep(self.slot, tuple(token_ids), "all", tuple(hidden_layers))])
        return (out.logits, out.hidden) if hidden_layers else out.logits

    def rollback(self, length: int) -> None:
        self.runner.rollback_slot(self.slot, length)

    def embedding_matrices(self):
        return self.runner.embedding_matrices()

    def linear_layers(self):
        return self.runner.linear_layers()

    def close(self) -> None:
        self.runner.close_slot(self.slot)
