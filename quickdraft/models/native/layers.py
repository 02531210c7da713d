"""Stateless tensor functions of one decoder layer, positions (of one sequence, or stacked sequences) along dim 0."""

import torch
import torch.nn.functional as F

from quickdraft.models.native.kernels import silu_mul
from quickdraft.models.native.weights import LayerWeights, RowGroup


def key_begin(position: int, window: int | None) -> int:
    """The first cached position a query at `position` reads: 0, or where its sliding window of W keys starts."""
    return 0 if window is None else max(0, position - window + 1)


def block_mask(start: int, n: int, window: int | None, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask [n, L] in `dtype` (0 or -inf) of queries start..start+n-1 over keys key_begin(start)..
    start+n-1: causal, and with a window W also sliding (key > query - W)."""
    query_pos = torch.arange(start, start + n, device=device)[:, None]  # [n, 1]
    key_pos = torch.arange(key_begin(start, window), start + n, device=device)[None, :]  # [1, L]
    blocked = key_pos > query_pos  # [n, L]
    if window is not None:
        blocked |= key_pos <= query_pos - window
    return torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, float("-inf"))


def attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, mask: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention of a prompt block, one fused product: q [n, H, hd], keys/values [KV, L, hd] and
    `block_mask`'s [n, L] -> [n, H * hd] in q's dtype. Devices other than the CPU run prompt blocks through it; on
    the CPU prompt rows attend alone (`kernels.attend`, 1.2-1.3x faster there by `scripts/attend_cost.py`:
    docs/native_runtime.md, stop 46).

    torch's `scaled_dot_product_attention` (on the CPU its flash kernel: query-key products in float32 from
    bfloat16 inputs, an online softmax in float32 over fixed key blocks, its weights rounded to the inputs' dtype
    before the product with the values). A row's result depends on the block's shapes and its own values, and a
    prompt's blocks have the same shapes however the prompt was cut into forwards (`tests/test_devices.py` checks
    its logits against transformers' across sliding windows and block boundaries).
    """
    n, heads, head_dim = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask, scale=scale, enable_gqa=True
    )  # [1, H, n, hd]
    return out[0].transpose(0, 1).reshape(n, heads * head_dim)


def gated_mlp(x: torch.Tensor, weights: LayerWeights, activation: str, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), gate and up in one matmul: x [N, d] -> [N, d] (`groups`: `Linear.batched`)."""
    gate_up = weights.gate_up.batched(x, groups)  # [N, 2 I]
    if activation == "silu":
        return weights.down.batched(silu_mul(gate_up), groups)
    gate, up = gate_up.chunk(2, dim=-1)  # [N, I] each
    return weights.down.batched(F.gelu(gate, approximate="tanh") * up, groups)
