"""The runtime's row operations in plain torch, for devices the C++ kernels do not run on (a GPU).

Each computes what its C++ namesake in `kernels` computes, up to rounding (the C++ kernels work in float32 and
round once; these round where torch's operators do), and keeps the property the runtime's exactness rests on:
a row's result depends on that row alone, never on how many rows came with it. Tests run them on the CPU
against the C++ kernels.
"""

import torch


def attend(
    queries: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    sequence: torch.Tensor,
    begin: torch.Tensor,
    end: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`kernels.attend`, one product per row over exactly its own keys, with the shapes of that row alone:
    queries [R, H, hd]; keys[s], values[s] [KV, capacity, hd]; sequence, begin, end [R] int64 (on the CPU)
    -> [R, H * hd] in the queries' dtype, computed in float32."""
    rows, heads, head_dim = queries.shape
    out = torch.empty(rows, heads * head_dim, dtype=torch.float32, device=queries.device)
    for r, (s, first, last) in enumerate(zip(sequence.tolist(), begin.tolist(), end.tolist())):
        k, v = keys[s][:, first:last].float(), values[s][:, first:last].float()  # [KV, L, hd]
        q = queries[r].float().view(k.shape[0], -1, head_dim) * scale  # [KV, G, hd]
        out[r] = torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1), v).reshape(-1)
    return out.to(queries.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """`kernels.rms_norm`: x [..., d] / rms over d, times weight [d] when given -> x's shape and dtype."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`kernels.rope`: x [N, heads, hd] * cos + x with its halves swapped * sin_signed ([N, 1, hd] each)."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((x[..., half:], x[..., :half]), dim=-1), sin_signed)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`kernels.silu_mul`: gate_up [N, 2 I] (gate columns, then up) -> silu(gate) * up [N, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
