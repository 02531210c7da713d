"""Replaying speculation on a recorded greedy output: the draft sizes a policy chooses, step by step.

Measured tokens/s on a shared machine swings by 10-20% between runs of identical work, which can
be as large as the differences between `--k auto` and the best fixed k. A replay takes timing
out: the engine's own loop decodes the target's recorded greedy output (from `quickdraft
bench-adaptive`) again, with the real n-gram drafter and either a fixed k or the real adaptive
controller, but with `RecordedTarget` standing in for the target. Its logits put all mass on the
recorded next token at every position, so greedy verification accepts a draft token exactly when
it equals the recorded one; and each of its forwards over n tokens advances the engine's clock by
t(n) of a cost model (in units of t(1)), so the controller's choices follow that model alone.
`scripts/replay_controller.py` prices the steps and compares policies per category.
"""

from collections.abc import Sequence

import torch
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.controller import ControllerMemory
from quickdraft.costs import TargetCost
from quickdraft.engine import Engine
from quickdraft.errors import InternalError
from quickdraft.models.base import ModelInfo
from quickdraft.models.loading import LoadedModel


class VirtualClock:
    """Seconds that pass only when `advance` says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordedTarget:
    """A `ModelRunner` whose next token at every position is the recorded one, at the cost model's price."""

    def __init__(self, sequence: Sequence[int], cost: TargetCost, clock: VirtualClock) -> None:
        self.sequence = list(sequence)  # the prompt followed by the recorded output
        vocab_size = max(self.sequence) + 1
        self.info = ModelInfo(name="recorded", architecture="recorded", vocab_size=vocab_size, max_context=10**9)
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self._cost = cost
        self._clock = clock
        self._length = 0

    @property
    def cache_length(self) -> int:
        return self._length

    def prefill(self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()) -> torch.Tensor:
        """The prompt's last row; free (the replay prices decode steps only)."""
        _no_states(hidden_layers)
        self._length = 0
        return self._rows(token_ids)[-1]

    def forward(self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()) -> torch.Tensor:
        """One-hot rows [n, vocab] at the recorded tokens after positions cache_length..; costs t(n)."""
        _no_states(hidden_layers)
        self._clock.advance(self._cost.seconds(len(token_ids)))
        return self._rows(token_ids)

    def _rows(self, token_ids: Sequence[int]) -> torch.Tensor:
        n, start = len(token_ids), self._length
        following = torch.tensor(self.sequence[start + 1 : start + n + 1])  # [n]
        if following.numel() != n:
            raise InternalError(f"a forward past the recorded output ({start + n} of {len(self.sequence)} tokens)")
        logits = torch.full((n, self.info.vocab_size), float("-inf"))
        logits[torch.arange(n), following] = 0.0
        self._length = start + n
        return logits

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise InternalError(f"cannot roll back to {length}: {self._length} tokens are cached")
        self._length = length

    def embedding_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise InternalError("a recorded target has no weights")

    def linear_layers(self) -> list:
        return []


def _no_states(hidden_layers: Sequence[int]) -> None:
    if hidden_layers:
        raise InternalError("a recorded target has no hidden states; replay drafters that read none")


def replay(
    prompt_ids: list[int],
    output: Sequence[int],
    k: int | None,
    memory: ControllerMemory,
    tokenizer: PreTrainedTokenizerBase,
) -> list[int]:
    """Draft tokens per step (as `GenerationStats.k_per_step`) of the engine decoding `output` after `prompt_ids`.

    k: a fixed k, or None for the adaptive controller (up to the largest k the cost model prices), whose costs
    and carried acceptance are `memory`; its target cost model also prices every step. `tokenizer` is the one
    the output was written with.
    """
    k_max = memory.target.max_tokens - 1  # so the engine never recalibrates: the memory covers every size
    clock = VirtualClock()
    runner = RecordedTarget([*prompt_ids, *output], memory.target, clock)
    target = LoadedModel(runner, tokenizer, PretrainedConfig())  # a stand-in: no checkpoint behind it
    spec = SpecConfig(drafter="ngram", k="auto" if k is None else k, k_max=k_max)
    engine = Engine(target, spec, costs=memory, clock=clock)
    params = SamplingParams(max_new_tokens=len(output), ignore_eos=True)
    return engine.generate(list(prompt_ids), params).stats.k_per_step
