"""The draft head: EAGLE-3 (Li et al. 2025), one Llama-style decoder layer over the target's own states.

Notation: x_t is the token at position t; a_t the target's states at position t from three of its
layers (low, middle, high: `HeadConfig.aux_layers`, ids as in `models/base.py`, each what that decoder
layer reads), concatenated [3 * target_hidden]. The head's stream at position t starts from
g_t = fc(a_t) [d]. One decoder layer reads the pair (g_t, x_{t+1}):

    attention input  = [input_layernorm(embed(x_{t+1})) ; hidden_norm(g_t)]       [2d]
    residual         = g_t (hidden_norm(g_t) with `norm_before_residual`)
    h                = residual + attention(...)      (causal, over the earlier pairs; RoPE at position t)
    out_t            = h + mlp(post_attention_layernorm(h))                         [d], before the final norm
    draft logits     = lm_head(norm(out_t))             over the reduced vocabulary [draft_vocab]

`out_t` predicts the token x_{t+2}. Drafting k tokens runs the layer on its own outputs: the pair at
the next position is (out_t, drafted x_{t+2}), with no `fc` (it maps only the target's states).
Training imitates that with `unrolled` (training-time test): step s feeds the outputs of step s-1
while attending to true pairs for the earlier context.

Draft id i is target token `vocab_ids[i]` (`d2t[i] = vocab_ids[i] - i` on disk, as vLLM and SGLang
store it). The token embedding is the target's own (frozen, taken from the target at load time, not
stored with the head). Parameter names are those of the speculators format (`files.py`), so a
state dict is a checkpoint as vLLM loads it.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target states EAGLE-3 fuses: the inputs of layers 2, L // 2 and L - 3 (vLLM's and SpecForge's
    choice); for targets under 8 layers, of the first, middle and last (ids may repeat below 3 layers)."""
    if num_layers >= 8:
        return (2, num_layers // 2, num_layers - 3)
    return (0, num_layers // 2, num_layers - 1)


@dataclass(frozen=True)
class HeadConfig:
    """Shapes of the head (attention and MLP sizes copied from the target's layers by default)."""

    hidden_size: int  # the head's stream; the target's hidden size (it reads the target's token embeddings)
    target_hidden_size: int  # width of each target state in a_t
    intermediate_size: int  # SwiGLU width
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    draft_vocab_size: int
    aux_layers: tuple[int, ...]  # the target's state ids fused by fc, in order
    rms_norm_eps: float = 1e-6
    norm_before_residual: bool = False  # the attention's residual is hidden_norm(g) instead of g

    @classmethod
    def like_target(cls, text_config, draft_vocab_size: int, intermediate_size: int | None = None) -> "HeadConfig":
        """One decoder layer shaped like the target's (a transformers text config), its MLP `intermediate_size`
        wide (default the target's)."""
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        rope = getattr(text_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        return cls(
            hidden_size=text_config.hidden_size,
            target_hidden_size=text_config.hidden_size,
            intermediate_size=intermediate_size or text_config.intermediate_size,
            num_heads=text_config.num_attention_heads,
            num_kv_heads=text_config.num_key_value_heads,
            head_dim=head_dim,
            rope_theta=float(theta or getattr(text_config, "rope_theta", 10000.0)),
            draft_vocab_size=draft_vocab_size,
            aux_layers=default_aux_layers(text_config.num_hidden_layers),
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

    def reserve(self, count: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for `count` more positions (float32, CPU): the whole keys and values [kv_heads, capacity, head_dim],
        for a writer that fills positions length.. itself and then advances `length`."""
        end = self.length + count
        if self.keys is None or end > self.keys.shape[2]:
            self._grow(torch.empty(1, kv_heads, 0, head_dim), max(2 * end, 256))
        return self.keys[0], self.values[0]

    def _grow(self, like: torch.Tensor, capacity: int) -> None:
        shape = (1, like.shape[1], capacity, like.shape[3])
        keys, values = like.new_zeros(shape), like.new_zeros(shape)
        if self.keys is not None:
            keys[:, :, : self.length] = self.keys[:, :, : self.length]
            values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = keys, values


class Attention(nn.Module):
    """q, k, v over the pair's 2d-wide input; o back to d."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        d, h, kv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(2 * d, h * hd, bias=False)
        self.k_proj = nn.Linear(2 * d, kv * hd, bias=False)
        self.v_proj = nn.Linear(2 * d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.rotary = Rotary(hd, config.rope_theta)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, 2d] -> rotated queries [B, heads, T, hd], keys and values [B, kv_heads, T, hd]."""
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


class MLP(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        d, width = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, width, bias=False)
        self.up_proj = nn.Linear(d, width, bias=False)
        self.down_proj = nn.Linear(width, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """EAGLE-3's layer 0: attention over [normed embedding ; normed stream], then the MLP."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = RMSNorm(d, eps)  # on the token embedding
        self.hidden_norm = RMSNorm(d, eps)  # on the stream
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = MLP(config)

    def inputs(self, stream: torch.Tensor, embedded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """stream, embedded [B, T, d] -> (attention input [B, T, 2d], residual [B, T, d])."""
        normed = self.hidden_norm(stream)
        residual = normed if self.norm_before_residual else stream
        return torch.cat([self.input_layernorm(embedded), normed], dim=-1), residual

    def finish(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual attention output, then the MLP block: [B, T, d] -> the layer's output [B, T, d]."""
        h = residual + attended
        return h + self.mlp(self.post_attention_layernorm(h))


class DraftHead(nn.Module):
    """fc over the target's states, one decoder layer, the final norm and the reduced-vocabulary output."""

    def __init__(self, config: HeadConfig, embeddings: torch.Tensor, vocab_ids: torch.Tensor) -> None:
        """embeddings [target_vocab, d]: the target's token embeddings (frozen, not saved); vocab_ids
        [draft_vocab]: the target id of each draft logit."""
        super().__init__()
        if len(vocab_ids) != config.draft_vocab_size:
            raise ValueError(f"{len(vocab_ids)} vocabulary ids for a draft vocabulary of {config.draft_vocab_size}")
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(len(config.aux_layers) * config.target_hidden_size, d, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(config)])
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.lm_head = nn.Linear(d, config.draft_vocab_size, bias=False)
        self.register_buffer("embeddings", embeddings, persistent=False)  # [target_vocab, d]
        self.register_buffer("vocab_ids", vocab_ids, persistent=False)  # [draft_vocab] target id of each draft logit

    @property
    def layer(self) -> DecoderLayer:
        return self.layers[0]

    def fuse(self, target_states: torch.Tensor) -> torch.Tensor:
        """The target's states [..., 3 * target_hidden] -> the head's stream [..., d]."""
        return self.fc(target_states.float())

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer outputs [..., d] -> logits over the reduced vocabulary [..., draft_vocab]."""
        return self.lm_head(self.norm(out))

    def _attention_input(self, stream: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer.inputs(stream, self.embeddings[next_tokens].float())

    def step(self, stream: torch.Tensor, next_tokens: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """Inference: pairs at positions cache.length.. (stream [n, d], next_tokens [n]) -> outputs [n, d]."""
        start = cache.length
        positions = torch.arange(start, start + stream.shape[0], device=stream.device)  # [n]
        x, residual = self._attention_input(stream[None].float(), next_tokens[None])  # [1, n, 2d], [1, n, d]
        q, k, v = self.layer.self_attn.project(x, positions)
        keys, values = cache.append(k, v)
        mask = None if stream.shape[0] == 1 else _causal_mask(positions, keys.shape[2])
        return self.layer.finish(residual, self.layer.self_attn.attend(q, keys, values, mask))[0]

    def unrolled(self, stream: torch.Tensor, next_tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: the outputs [B, T, d] of each drafting step 1..steps, for every position at once.

        `stream` [B, T, d] is fc of the target's states. Step 1 reads it. Step s reads, at position t, step
        s-1's output made at t-1, and attends to true pairs at positions <= t-s+1 and to step m's pair at
        t-s+m for m = 2..s: exactly what drafting sees after s-1 draft tokens. Tokens stay the true ones.
        """
        length = stream.shape[1]
        positions = torch.arange(length, device=stream.device)  # [T]
        keys, values, outputs = [], [], []
        inputs = stream
        for step in range(1, steps + 1):
            x, residual = self._attention_input(inputs, next_tokens)  # [B, T, 2d], [B, T, d]
            q, k, v = self.layer.self_attn.project(x, positions)
            keys.append(k)
            values.append(v)
            mask = unrolled_mask(length, step, stream.device)  # [T, step * T]
            attended = self.layer.self_attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            out = self.layer.finish(residual, attended)
            outputs.append(out)
            inputs = F.pad(out[:, :-1], (0, 0, 1, 0))  # position t reads the output made at t-1
        return outputs


def unrolled_mask(length: int, step: int, device: torch.device) -> torch.Tensor:
    """[T, step * T] bool: block 1 (true pairs) j <= t-step+1; block m >= 2: j == t-step+m."""
    t = torch.arange(length, device=device)[:, None]  # [T, 1]
    j = torch.arange(length, device=device)[None, :]  # [1, T]
    blocks = [j <= t - step + 1] + [j == t - step + m for m in range(2, step + 1)]
    return torch.cat(blocks, dim=1)


def _causal_mask(positions: torch.Tensor, total: int) -> torch.Tensor:
    """[n, total] bool: query at positions[i] sees keys 0..positions[i]."""
    return torch.arange(total, device=positions.device)[None, :] <= positions[:, None]
