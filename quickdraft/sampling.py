"""Turning logits into token probabilities, identically for target and draft.

`warp` applies temperature, top-k and top-p to logits and returns probabilities. The same
function with the same `SamplingParams` is used on the target's and the draft's logits, so the
rejection sampler compares like with like. Greedy decoding (temperature 0) never samples: it
takes the argmax, and `warp` returns the one-hot distribution of that argmax.

Randomness comes only from a per-request `torch.Generator` (`make_generator`), never from the
global RNG, so a request with a seed is reproducible whatever else runs in the process (on the CPU,
the probabilities' last bits depend on whether quickdraft's kernels are loaded: `softmax`; a process
with a native runner has them from its start).
"""

import secrets

import torch

from quickdraft.categorical import draw
from quickdraft.config import SamplingParams


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private RNG for one request; a fresh random seed when `seed` is None."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else secrets.randbits(63))
    return generator


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [n, vocab] -> probabilities [n, vocab] float32 under temperature, top-k, top-p."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    top_k = 0 < params.top_k < logits.shape[-1]
    if not top_k and params.top_p == 1.0:
        return softmax(logits, params.temperature)
    logits = logits.float() / params.temperature
    if top_k:
        logits = _mask_outside_top_k(logits, params.top_k)
    if params.top_p < 1.0:
        logits = _mask_outside_top_p(logits, params.top_p)
    return softmax(logits, 1.0)


def softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) over the last dim of [n, vocab] -> float32 (a caller that has divided already
    passes 1.0: x / 1 is x). On the CPU, once quickdraft's kernels are loaded (the native runtime loads them
    before its first step, so a request's target and draft rows take one path), `torch.ops.quickdraft.softmax`
    in one call: its own exponential, so its last bits are not torch's (`scripts/draw_cost.py` times both)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16):
        if hasattr(torch.ops.quickdraft, "softmax"):
            return torch.ops.quickdraft.softmax(logits.contiguous(), temperature)
    return torch.softmax(logits.float() / temperature, dim=-1)


def _mask_outside_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [n, 1]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def _mask_outside_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of tokens (by descending probability) whose mass reaches top_p."""
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True)  # [n, vocab]
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [n, vocab]
    drop_sorted = mass_before >= top_p  # the first token always survives
    drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_ids, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class WarpedRows:
    """`warp(logits, params)` row by row, each row warped when first asked for: what rejection sampling reads,
    which stops at its first rejected draft token and never needs the rows after it. A row comes out as it would
    from warping all of them at once (every step of `warp` works on each row alone)."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams) -> None:
        self._logits = logits  # [n, vocab]
        self._params = params

    def __getitem__(self, row: int) -> torch.Tensor:
        """Row `row`'s probabilities [vocab]."""
        return warp(self._logits[row : row + 1], self._params)[0]


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Pick one token per row of logits [n, vocab] -> [n]: argmax when greedy, else a warped sample."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return draw(warp(logits, params), generator)
