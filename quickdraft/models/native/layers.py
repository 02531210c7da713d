"""Stateless tensor functions of one decoder layer, positions (of one sequence, or stacked sequences) along dim 0."""

import torch
import torch.nn.functional as F

from quickdraft.models.native.kernels import silu_mul
from quickdraft.models.native.weights import LayerWeights, RowGroup


def key_begin(position: int, window: int | None) -> int:
    """The first cached position a query at `position` reads: 0, or where its sliding window of W keys starts."""
    return 0 if window is None else max(0, position - window + 1)


def block_mask(start: int, n: int, window: int | None, groups: int, device: torch.device) -> torch.Tensor:
    """Additive float32 mask [G * n, L] (0 or -inf) of queries start..start+n-1 over keys key_begin(start)..
    start+n-1: causal, and with a window W also sliding (key > query - W). Rows ordered (group, query)."""
    query_pos = torch.arange(start, start + n, device=device)[:, None]  # [n, 1]
    key_pos = torch.arange(key_begin(start, window), start + n, device=device)[None, :]  # [1, L]
    blocked = key_pos > query_pos  # [n, L]
    if window is not None:
        blocked |= key_pos <= query_pos - window
    mask = torch.zeros(blocked.shape, device=device).masked_fill_(blocked, float("-inf"))
    return mask.repeat(groups, 1)


def attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Grouped-query attention without repeating keys, computed in float32: q [n, H, hd], keys/values
    [KV, L, hd] -> [n, H * hd] in q's dtype. Without a mask every query reads all L keys (one query over
    exactly its own keys); with one, `block_mask`'s [G * n, L].

    float32 because low-precision products of this shape are slow on CPUs without native bfloat16 (a quarter
    of float32's speed on AVX2) and it keeps the softmax's inputs unrounded.
    """
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    q_grouped = q.view(n, kv_heads, groups, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, groups * n, head_dim)
    scores = torch.bmm(q_grouped.float() * scale, keys.float().transpose(1, 2))  # [KV, G * n, L]
    if mask is not None:
        scores += mask
    out = torch.bmm(torch.softmax(scores, dim=-1), values.float())  # [KV, G * n, hd]
    return out.view(kv_heads, groups, n, head_dim).permute(2, 0, 1, 3).reshape(n, heads * head_dim).to(q.dtype)


def gated_mlp(x: torch.Tensor, weights: LayerWeights, activation: str, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), gate and up in one matmul: x [N, d] -> [N, d] (`groups`: `Linear.batched`)."""
    gate_up = weights.gate_up.batched(x, groups)  # [N, 2 I]
    if activation == "silu":
        return weights.down.batched(silu_mul(gate_up), groups)
    gate, up = gate_up.chunk(2, dim=-1)  # [N, I] each
    return weights.down.batched(F.gelu(gate, approximate="tanh") * up, groups)
