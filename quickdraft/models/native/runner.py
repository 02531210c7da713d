"""`NativeRunner`: quickdraft's own decoder forward over a preallocated KV cache.

One Python loop over layers, fused projections, no module hooks and no per-step allocation
beyond the activations; see `spec.py` for what distinguishes the supported families.
"""

from collections.abc import Sequence

import torch

from quickdraft.errors import InternalError
from quickdraft.models.base import ModelInfo
from quickdraft.models.native.kv_cache import KVCache
from quickdraft.models.native.layers import AttentionWindow, attention, gated_mlp, rms_norm, windowed_attention
from quickdraft.models.native.rope import RopeTable, apply_rope
from quickdraft.models.native.spec import DecoderSpec
from quickdraft.models.native.weights import LayerWeights, Linear, ModelWeights

PREFILL_CHUNK = 512  # prompt tokens per forward during prefill: bounds the [n, L] attention scores


class NativeRunner:
    """A `ModelRunner` for one Llama-family or Gemma 3 model, batch 1."""

    def __init__(
        self, info: ModelInfo, spec: DecoderSpec, weights: ModelWeights, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.info = info
        self.device = device
        self.spec = spec
        self.dtype = dtype  # activations and KV cache
        self._weights = weights
        self._cache = KVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.max_context, dtype, device)
        self._rope = self._rope_tables()
        self._qk_width = (spec.num_heads + spec.num_kv_heads) * spec.head_dim
        self._embedding_scale = (
            None if spec.embedding_scale is None else torch.tensor(spec.embedding_scale, dtype=dtype, device=device)
        )

    @property
    def cache_length(self) -> int:
        return self._cache.length

    def prefill(self, token_ids: Sequence[int], return_hidden: bool = False):
        """Reset the cache, run the prompt in chunks; logits [vocab] of its last position (and hidden [n, d])."""
        if not token_ids:
            raise InternalError("prefill needs at least one token")
        self._cache.rollback(0)
        hidden_chunks = []
        for begin in range(0, len(token_ids), PREFILL_CHUNK):
            chunk = token_ids[begin : begin + PREFILL_CHUNK]
            logits, hidden = self._run(chunk, last_only=True, return_hidden=return_hidden)
            if return_hidden:
                hidden_chunks.append(hidden.float())
        return (logits[0], torch.cat(hidden_chunks)) if return_hidden else logits[0]

    def forward(self, token_ids: Sequence[int], return_hidden: bool = False):
        """Append tokens at positions cache_length..; logits [n, vocab] float32 (and hidden [n, d])."""
        if not token_ids:
            raise InternalError("forward needs at least one token")
        logits, hidden = self._run(token_ids, last_only=False, return_hidden=return_hidden)
        return (logits, hidden.float()) if return_hidden else logits

    def embedding_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token embeddings [vocab, d], output layer [vocab, d]) as stored (embedding scale not applied)."""
        return self._weights.embedding, self._weights.lm_head.dense()

    def rollback(self, length: int) -> None:
        self._cache.rollback(length)

    def linear_layers(self) -> list[Linear]:
        """Every matrix product a forward runs, in order (the benchmark times them alone: a decode ceiling)."""
        per_layer = [
            linear for layer in self._weights.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        return [*per_layer, self._weights.lm_head]

    @torch.inference_mode()
    def _run(
        self, token_ids: Sequence[int], last_only: bool, return_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n or 1, vocab] float32 and, when asked, the final-norm hidden states [n, d]
        the output layer reads."""
        n, start = len(token_ids), self._cache.length
        if self._cache.reserve(n):
            self._rope = self._rope_tables()
        x = self._embed(token_ids)  # [n, d]
        windows = self._windows(
            start, n, exact_rows=not last_only
        )  # rows whose logits are returned match 1-token forwards
        rope = {
            key: (table.cos[start : start + n], table.sin_signed[start : start + n])
            for key, table in self._rope.items()
        }
        for i, layer in enumerate(self._weights.layers):
            x = self._layer(i, layer, x, start, windows[self.spec.layer_windows[i]], rope[self.spec.layer_rope[i]])
        self._cache.length = start + n
        normed = rms_norm(
            x[-1:] if last_only and not return_hidden else x, self._weights.final_norm, self.spec.rms_norm_eps
        )  # [n or 1, d]
        return self._logits(normed[-1:] if last_only else normed), normed if return_hidden else None

    def _layer(
        self,
        i: int,
        layer: LayerWeights,
        x: torch.Tensor,
        start: int,
        window: AttentionWindow,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        spec, n = self.spec, x.shape[0]
        qk, values = self._attention_inputs(layer, x, rope)
        self._cache.write(i, start, qk[:, spec.num_heads :], values)
        queries = qk[:, : spec.num_heads]  # [n, H, hd]
        if window.rows:  # one query at a time over exactly its own window (see AttentionWindow.build)
            attended = torch.cat(
                [
                    attention(
                        queries[j : j + 1], *self._cache.read(i, row.begin, start + j + 1), row, spec.attention_scale
                    )
                    for j, row in enumerate(window.rows)
                ]
            )
        else:
            cached_keys, cached_values = self._cache.read(i, window.begin, start + n)
            attended = (
                windowed_attention(queries, cached_keys, cached_values, window.size, spec.attention_scale)
                if window.size
                else attention(queries, cached_keys, cached_values, window, spec.attention_scale)
            )
        return self._attention_output_and_mlp(layer, x, attended)

    def _attention_inputs(
        self, layer: LayerWeights, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, d] -> rotated queries|keys [n, H + KV, hd], values [n, KV, hd]. Tensors only, no cache."""
        spec, n = self.spec, x.shape[0]
        qkv = layer.qkv(rms_norm(x, layer.input_norm, spec.rms_norm_eps))  # [n, (H + 2 KV) hd]
        qk = qkv[:, : self._qk_width].view(n, spec.num_heads + spec.num_kv_heads, spec.head_dim)
        values = qkv[:, self._qk_width :].view(n, spec.num_kv_heads, spec.head_dim)
        if layer.qk_norm is not None:
            qk = rms_norm(qk, None, spec.rms_norm_eps) * layer.qk_norm
        return apply_rope(qk, *rope), values

    def _attention_output_and_mlp(self, layer: LayerWeights, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x, attended [n, d] -> the next layer's input [n, d]. Tensors only, no cache."""
        spec = self.spec
        out = layer.o(attended)
        if layer.post_attention_norm is not None:
            out = rms_norm(out, layer.post_attention_norm, spec.rms_norm_eps)
        x = x + out
        out = gated_mlp(rms_norm(x, layer.pre_mlp_norm, spec.rms_norm_eps), layer, spec.activation)
        if layer.post_mlp_norm is not None:
            out = rms_norm(out, layer.post_mlp_norm, spec.rms_norm_eps)
        return x + out

    def _embed(self, token_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)  # [n]
        x = torch.nn.functional.embedding(ids, self._weights.embedding)  # [n, d]
        return x if self._embedding_scale is None else x * self._embedding_scale

    def _logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Output layer over final-norm states [m, d] -> [m, vocab] float32."""
        logits = self._weights.lm_head(normed).float()
        cap = self.spec.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _windows(self, start: int, n: int, exact_rows: bool) -> dict[int | None, AttentionWindow]:
        groups = self.spec.num_heads // self.spec.num_kv_heads
        return {
            w: AttentionWindow.build(start, n, w, groups, self.dtype, self.device, exact_rows)
            for w in set(self.spec.layer_windows)
        }

    def _rope_tables(self) -> dict[str, RopeTable]:
        return {
            key: RopeTable.build(freqs, self._cache.capacity, self.dtype, self.device)
            for key, freqs in self.spec.rope.items()
        }
