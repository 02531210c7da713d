"""Drawing tokens from categorical distributions with a request's own generator.

Each row is drawn by inverting its cumulative distribution at one uniform number u, in float64 (so a float32
row's interval boundaries carry no rounding that matters), over blocks of DRAW_BLOCK tokens: each block's sum
taken in token order, the blocks' running totals in block order, and point = u * total (kept below the total).
The block is the first whose running total exceeds the point; the token, the first of that block whose running
sum within the block exceeds what the point leaves past the blocks before it (or, where rounding leaves the rest
at the block's own sum or past it, the block's last token of positive probability). A zero-probability token is
never drawn. On the CPU, once quickdraft's kernels are loaded (the native runtime loads them),
`torch.ops.quickdraft.draw` computes the same bits in a pass over the row and one over the chosen block; elsewhere
torch does: on the CPU with the same bits, on another device perhaps not (its cumulative sums may add in another
order). `scripts/draw_cost.py` times both, and torch.multinomial, which draws one exponential per vocabulary entry.
"""

import torch

DRAW_BLOCK = 256  # tokens per block of the cumulative sums


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probabilities [n, vocab] (non-negative, each row's sum positive) -> ids [n] int64."""
    uniform = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device)  # [n]
    return inverse_cdf(probs, uniform)


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The tokens of rows [n, vocab] at uniform numbers [n] float64 in [0, 1) -> ids [n] int64 (module docstring)."""
    if probs.device.type == "cpu" and probs.dtype == torch.float32 and hasattr(torch.ops.quickdraft, "draw"):
        return torch.ops.quickdraft.draw(probs.contiguous(), uniform.contiguous(), DRAW_BLOCK)
    return inverse_cdf_in_torch(probs, uniform)


def inverse_cdf_in_torch(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """`inverse_cdf` in torch operations: the kernel's bits on the CPU, where torch's cumulative sums add in order."""
    rows, vocab = probs.shape
    blocks = -(-vocab // DRAW_BLOCK)
    padded = probs.double()  # [n, blocks * DRAW_BLOCK]: zeros past the vocabulary
    if vocab % DRAW_BLOCK:
        padded = torch.nn.functional.pad(padded, (0, blocks * DRAW_BLOCK - vocab))
    within = padded.view(rows, blocks, DRAW_BLOCK).cumsum(dim=-1)  # [n, blocks, DRAW_BLOCK]: running sums in a block
    running = within[..., -1].cumsum(dim=-1)  # [n, blocks]: totals up to each block's end
    total = running[:, -1:]  # [n, 1]
    below_total = torch.nextafter(total, torch.zeros_like(total))  # [n, 1]: uniform * total may round up to it
    point = torch.minimum(uniform[:, None] * total, below_total)  # [n, 1], in [0, total)
    block = torch.searchsorted(running, point, right=True)  # [n, 1]
    before = torch.where(block > 0, running.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(point))  # [n, 1]
    rest = point - before  # [n, 1]
    rows_of_block = block[:, :, None].expand(rows, 1, DRAW_BLOCK)  # [n, 1, DRAW_BLOCK]
    in_block = torch.searchsorted(within.gather(1, rows_of_block)[:, 0], rest, right=True)[:, 0]  # [n]
    positive = padded.view(rows, blocks, DRAW_BLOCK).gather(1, rows_of_block)[:, 0] > 0  # [n, DRAW_BLOCK]
    last_positive = DRAW_BLOCK - 1 - positive.flip(-1).int().argmax(dim=-1)  # [n]
    return block[:, 0] * DRAW_BLOCK + torch.where(in_block < DRAW_BLOCK, in_block, last_positive)
