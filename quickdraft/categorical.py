"""Drawing tokens from categorical distributions with a request's own generator.

Each row is drawn by inverting its cumulative distribution at one uniform number: the cumulative sums are taken
in float64 (so a float32 row's interval boundaries carry no rounding that matters) and the draw is the first
token whose cumulative sum exceeds the uniform number scaled to the row's total, which a zero-probability token
never is. torch.multinomial draws one exponential per vocabulary entry instead, many times slower on CPU
(`scripts/draw_cost.py`).
"""

import torch


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probabilities [n, vocab] (non-negative, each row's sum positive) -> ids [n] int64."""
    cumulative = probs.double().cumsum(dim=-1)  # [n, vocab]
    total = cumulative[:, -1:]  # [n, 1]
    uniform = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    below_total = torch.nextafter(total, torch.zeros_like(total))  # [n, 1]: uniform * total may round up to it
    point = torch.minimum(uniform * total, below_total)  # [n, 1], in [0, total)
    return torch.searchsorted(cumulative, point, right=True).squeeze(-1)  # [n]
