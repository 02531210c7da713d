"""Stateless tensor functions of one decoder layer, positions (of one sequence, or stacked sequences) along dim 0."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quickdraft.models.native.weights import LayerWeights, RowGroup


@dataclass(frozen=True)
class AttentionWindow:
    """Which cached positions a forward's queries read, and the mask over them."""

    begin: int  # first cached position any query of this forward may attend to
    mask: torch.Tensor  # [G * n, end - begin] additive (0 or -inf), rows ordered (group, query)
    size: int | None = None  # the sliding window W, when every query attends over its own W keys (`windowed_attention`)
    rows: tuple["AttentionWindow", ...] = ()  # one 1-query window per query, when they must attend one at a time

    @staticmethod
    def build(
        start: int,
        n: int,
        window: int | None,
        groups: int,
        dtype: torch.dtype,
        device: torch.device,
        exact_rows: bool = False,
    ) -> "AttentionWindow":
        """Causal (and, with a window W, sliding: key > query - W) mask for queries start..start+n-1.

        exact_rows (verification forwards; a prefill does not need it): every query must reduce over
        exactly the keys a 1-token forward at its position reads. Masked keys after a query's own (causal)
        leave its sums bit-identical, but masked keys before
        them shift where the reduction starts and change the rounding. Once a sliding window has
        moved past position 0, later queries would have such leading masked keys, so each query
        attends over its own window instead: all at once (`size`) when every query has a full
        window of W keys, else (a forward straddling position W - 1) one at a time (`rows`).
        """
        begin = 0 if window is None else max(0, start - window + 1)
        query_pos = torch.arange(start, start + n, device=device)[:, None]  # [n, 1]
        key_pos = torch.arange(begin, start + n, device=device)[None, :]  # [1, L]
        blocked = key_pos > query_pos  # [n, L]
        if window is not None:
            blocked |= key_pos <= query_pos - window
        size, rows = None, ()
        if window is not None and exact_rows and n > 1:
            if start >= window - 1:
                size = window
            elif start + n > window:
                rows = tuple(AttentionWindow.build(start + j, 1, window, groups, dtype, device) for j in range(n))
        mask = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, float("-inf"))
        return AttentionWindow(begin, mask.repeat(groups, 1), size, rows)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] normalised over d, times weight [d] (already offset for Gemma)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: AttentionWindow, scale: float
) -> torch.Tensor:
    """Grouped-query attention without repeating keys: q [n, H, hd], keys/values [KV, L, hd] -> [n, H * hd]."""
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    q_grouped = q.view(n, kv_heads, groups, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, groups * n, head_dim)
    scores = torch.baddbmm(window.mask, q_grouped, keys.transpose(1, 2), alpha=scale)  # [KV, G * n, L]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.bmm(probs, values)  # [KV, G * n, hd]
    return out.view(kv_heads, groups, n, head_dim).permute(2, 0, 1, 3).reshape(n, heads * head_dim)


def windowed_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int, scale: float
) -> torch.Tensor:
    """Each query over exactly the `window` keys ending at its own position, as a 1-token forward reads them.

    q [n, H, hd] for the last n of the L cached positions in keys/values [KV, L, hd], L = window + n - 1.
    The n windows are strided views batched into one product per step; every batch item has the
    shape of a 1-token forward's product.
    """
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    key_windows = (
        keys.unfold(1, window, 1).permute(0, 1, 3, 2).reshape(kv_heads * n, window, head_dim)
    )  # [KV * n, W, hd]
    value_windows = values.unfold(1, window, 1).permute(0, 1, 3, 2).reshape(kv_heads * n, window, head_dim)
    q_grouped = q.view(n, kv_heads, groups, head_dim).permute(1, 0, 2, 3).reshape(kv_heads * n, groups, head_dim)
    scores = torch.baddbmm(
        q.new_zeros(groups, window), q_grouped, key_windows.transpose(1, 2), alpha=scale
    )  # [KV * n, G, W]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.bmm(probs, value_windows)  # [KV * n, G, hd]
    return out.view(kv_heads, n, groups, head_dim).permute(1, 0, 2, 3).reshape(n, heads * head_dim)


def gated_mlp(x: torch.Tensor, weights: LayerWeights, activation: str, groups: tuple[RowGroup, ...]) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), gate and up in one matmul: x [N, d] -> [N, d] (`groups`: `Linear.batched`)."""
    gate, up = weights.gate_up.batched(x, groups).chunk(2, dim=-1)  # [N, I] each
    gate = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
    return weights.down.batched(gate * up, groups)
