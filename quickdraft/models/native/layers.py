"""Stateless tensor functions of one decoder layer, batch 1, positions along dim 0."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quickdraft.models.native.weights import LayerWeights


@dataclass(frozen=True)
class AttentionWindow:
    """Which cached positions a forward's queries read, and the mask over them."""

    begin: int  # first cached position any query of this forward may attend to
    mask: torch.Tensor  # [G * n, end - begin] additive (0 or -inf), rows ordered (group, query)
    rows: tuple["AttentionWindow", ...] = ()  # one 1-query window per query, when queries must attend one at a time

    @staticmethod
    def build(start: int, n: int, window: int | None, groups: int, dtype: torch.dtype,
              device: torch.device) -> "AttentionWindow":
        """Causal (and, with a window W, sliding: key > query - W) mask for queries start..start+n-1.

        Exactness: a query must reduce over exactly the keys a 1-token forward at its position reads.
        Masked keys after a query's own (causal) leave its sums bit-identical, but masked keys before
        them shift where the reduction starts and change the rounding. Once a sliding window has
        moved past position 0, later queries would have such leading masked keys, so the forward gets
        `rows`: each query attends alone over its own window, as in 1-token decoding.
        """
        begin = 0 if window is None else max(0, start - window + 1)
        query_pos = torch.arange(start, start + n, device=device)[:, None]  # [n, 1]
        key_pos = torch.arange(begin, start + n, device=device)[None, :]  # [1, L]
        blocked = key_pos > query_pos  # [n, L]
        rows = ()
        if window is not None:
            blocked |= key_pos <= query_pos - window
            if n > 1 and start + n > window:
                rows = tuple(AttentionWindow.build(start + j, 1, window, groups, dtype, device) for j in range(n))
        mask = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, float("-inf"))
        return AttentionWindow(begin, mask.repeat(groups, 1), rows)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] normalised over d, times weight [d] (already offset for Gemma)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: AttentionWindow,
              scale: float) -> torch.Tensor:
    """Grouped-query attention without repeating keys: q [n, H, hd], keys/values [KV, L, hd] -> [n, H * hd]."""
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    q_grouped = q.view(n, kv_heads, groups, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, groups * n, head_dim)
    scores = torch.baddbmm(window.mask, q_grouped, keys.transpose(1, 2), alpha=scale)  # [KV, G * n, L]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.bmm(probs, values)  # [KV, G * n, hd]
    return out.view(kv_heads, groups, n, head_dim).permute(2, 0, 1, 3).reshape(n, heads * head_dim)


def gated_mlp(x: torch.Tensor, weights: LayerWeights, activation: str) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) with gate and up in one matmul: x [n, d] -> [n, d]."""
    gate, up = weights.gate_up(x).chunk(2, dim=-1)  # [n, I] each
    gate = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
    return weights.down(gate * up)
