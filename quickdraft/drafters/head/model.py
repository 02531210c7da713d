"""The draft head: one Llama-style decoder layer that predicts the target's next hidden state.

Notation: x_t is the token at position t; f_t is the target's post-norm hidden state there (the
vector its output layer reads to predict x_{t+1}). The head's input at position t is the pair
(f_t, x_{t+1}): both are RMS-normalised, concatenated and fused by one linear map, then one
decoder layer (causal attention over the earlier pairs, SwiGLU MLP) outputs a prediction of
f_{t+1}. Draft logits are that prediction times the target's own output rows for a reduced
vocabulary (frozen, taken from the target at load time, not stored with the head).

Drafting k tokens runs the head autoregressively on its own predictions: the pair at the next
position is (predicted f_{t+1}, drafted x_{t+2}). Training imitates that with `unrolled`: step s
feeds the predictions of step s-1 while attending to true pairs for the earlier context.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    """Shapes of the head (attention and MLP sizes copied from the target's layers by default)."""

    hidden_size: int  # the target's hidden size: width of states, embeddings and the head's stream
    intermediate_size: int  # SwiGLU width
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float = 1e-6

    @classmethod
    def like_target(cls, text_config) -> "HeadConfig":
        """The shapes of one decoder layer of the target (a transformers text config)."""
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        rope = getattr(text_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        return cls(
            hidden_size=text_config.hidden_size,
            intermediate_size=text_config.intermediate_size,
            num_heads=text_config.num_attention_heads,
            num_kv_heads=text_config.num_key_value_heads,
            head_dim=head_dim,
            rope_theta=float(theta or getattr(text_config, "rope_theta", 10000.0)),
            rms_norm_eps=float(text_config.rms_norm_eps),
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [head_dim / 2]
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, heads, T, head_dim] rotated by positions [T]."""
        angles = positions.float()[:, None] * self.inv_freq[None]  # [T, head_dim / 2]
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # [T, head_dim]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class FrozenLinear(nn.Module):
    """y = x @ W.T with W a buffer: not trained, not saved (the target's output rows)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)  # [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class HeadCache:
    """Keys and values of one sequence, grown on demand; `length` is the valid prefix (O(1) rollback)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None  # [1, kv_heads, capacity, head_dim]
        self.values: torch.Tensor | None = None
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys/values [1, kv_heads, n, head_dim] at `length`; return all valid ones."""
        end = self.length + keys.shape[2]
        if self.keys is None or end > self.keys.shape[2]:
            self._grow(keys, max(2 * end, 256))
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _grow(self, like: torch.Tensor, capacity: int) -> None:
        shape = (1, like.shape[1], capacity, like.shape[3])
        keys, values = like.new_zeros(shape), like.new_zeros(shape)
        if self.keys is not None:
            keys[:, :, : self.length] = self.keys[:, :, : self.length]
            values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = keys, values


class Attention(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        d, h, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.rotary = Rotary(hd, config.rope_theta)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> rotated queries [B, heads, T, hd], keys and values [B, kv_heads, T, hd]."""
        c = self.config
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return self.rotary(q, positions), self.rotary(k, positions), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Queries [B, h, T, hd] over keys/values [B, kv, S, hd] with mask [T, S] (True = attend) -> [B, T, d]."""
        groups = self.config.num_heads // self.config.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, h, T, hd]
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DraftHead(nn.Module):
    """Fusion of (state, next-token embedding) plus one decoder layer; predicts the next state."""

    def __init__(
        self, config: HeadConfig, embeddings: torch.Tensor, output: torch.Tensor, vocab_ids: torch.Tensor
    ) -> None:
        """embeddings, output: the target's token embeddings and output layer [target_vocab, d];
        vocab_ids [draft_vocab]: the reduced vocabulary. Frozen, taken from the target, not saved."""
        super().__init__()
        self.config = config
        d, eps = config.hidden_size, config.rms_norm_eps
        self.state_norm = RMSNorm(d, eps)
        self.embed_norm = RMSNorm(d, eps)
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.attn_norm = RMSNorm(d, eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(d, eps)
        self.gate_proj = nn.Linear(d, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, d, bias=False)
        self.register_buffer("embeddings", embeddings, persistent=False)  # [target_vocab, d]
        self.output = FrozenLinear(output[vocab_ids].float())  # [draft_vocab, d] rows of the target's output layer
        self.register_buffer("vocab_ids", vocab_ids, persistent=False)  # [draft_vocab] target id of each draft logit

    def fuse_inputs(self, states: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """states [B, T, d], next_tokens [B, T] -> layer input [B, T, d]."""
        embedded = self.embeddings[next_tokens].float()  # [B, T, d]
        return self.fuse(torch.cat([self.state_norm(states), self.embed_norm(embedded)], dim=-1))

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual attention output, then the MLP block: [B, T, d] -> predicted states [B, T, d]."""
        x = x + attended
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def draft_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Predicted states [..., d] -> logits over the reduced vocabulary [..., draft_vocab]."""
        return self.output(predicted)

    def step(self, states: torch.Tensor, next_tokens: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """Inference: pairs at positions cache.length.. (states [n, d], next_tokens [n]) -> predictions [n, d]."""
        start = cache.length
        positions = torch.arange(start, start + states.shape[0], device=states.device)  # [n]
        x = self.fuse_inputs(states[None].float(), next_tokens[None])  # [1, n, d]
        q, k, v = self.attn.project(self.attn_norm(x), positions)
        keys, values = cache.append(k, v)
        mask = None if states.shape[0] == 1 else _causal_mask(positions, keys.shape[2])
        return self.finish(x, self.attn.attend(q, keys, values, mask))[0]

    def unrolled(self, states: torch.Tensor, next_tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training: predictions [B, T, d] of each drafting step 1..steps, for every position at once.

        Step 1 reads the true states. Step s reads, at position t, step s-1's prediction made at
        t-1, and attends to true pairs at positions <= t-s+1 and to step m's pair at t-s+m for
        m = 2..s: exactly what drafting sees after s-1 accepted draft tokens.
        """
        length = states.shape[1]
        positions = torch.arange(length, device=states.device)  # [T]
        keys, values, predictions = [], [], []
        inputs = states
        for step in range(1, steps + 1):
            x = self.fuse_inputs(inputs, next_tokens)  # [B, T, d]
            q, k, v = self.attn.project(self.attn_norm(x), positions)
            keys.append(k)
            values.append(v)
            mask = unrolled_mask(length, step, states.device)  # [T, step * T]
            predicted = self.finish(x, self.attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask))
            predictions.append(predicted)
            inputs = F.pad(predicted[:, :-1], (0, 0, 1, 0))  # position t reads the prediction made at t-1
        return predictions


def unrolled_mask(length: int, step: int, device: torch.device) -> torch.Tensor:
    """[T, step * T] bool: block 1 (true pairs) j <= t-step+1; block m >= 2: j == t-step+m."""
    t = torch.arange(length, device=device)[:, None]  # [T, 1]
    j = torch.arange(length, device=device)[None, :]  # [1, T]
    blocks = [j <= t - step + 1] + [j == t - step + m for m in range(2, step + 1)]
    return torch.cat(blocks, dim=1)


def _causal_mask(positions: torch.Tensor, total: int) -> torch.Tensor:
    """[n, total] bool: query at positions[i] sees keys 0..positions[i]."""
    return torch.arange(total, device=positions.device)[None, :] <= positions[:, None]
