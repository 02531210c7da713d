"""What the native decoder needs to know about an architecture, read once from `config.json`.

One `DecoderSpec` describes every supported family: the Llama family (Llama 2/3, SmolLM2,
Mistral, Qwen2, Qwen3) and Gemma 3 text models differ only in the flags below, so a single
decoder (`runner.py`) runs them all. Family modules (`llama.py`, `gemma3.py`) build the spec.
"""

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class RopeFrequencies:
    """Rotary embedding of one layer type, as transformers computes it for that config."""

    inv_freq: torch.Tensor  # [head_dim // 2] float32
    attention_scaling: float  # multiplies cos and sin (yarn); 1.0 for most variants


@dataclass(frozen=True)
class DecoderSpec:
    """Shapes and per-family choices of a pre-norm decoder-only transformer."""

    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int  # rows of the embedding and of the output layer
    hidden_size: int  # residual stream width d
    num_heads: int  # query heads H
    num_kv_heads: int  # key/value heads KV (H % KV == 0; grouped-query attention when KV < H)
    head_dim: int  # hd
    intermediate_size: int  # MLP width I
    rms_norm_eps: float
    norm_weight_offset: float  # Gemma stores RMSNorm weights as (scale - 1): 1.0; Llama family: 0.0
    activation: Literal["silu", "gelu_tanh"]  # applied to the gate projection of the gated MLP
    attention_scale: float  # multiplies q.k (head_dim**-0.5, or Gemma's query_pre_attn_scalar**-0.5)
    embedding_scale: float | None  # Gemma multiplies embeddings by sqrt(d); None for the Llama family
    sandwich_norms: bool  # Gemma 3: extra RMSNorm on the attention and MLP outputs before the residual add
    qk_norm: bool  # Qwen3 / Gemma 3: RMSNorm over head_dim on q and k before RoPE
    final_logit_softcap: float | None  # logits = cap * tanh(logits / cap) when set
    tie_embeddings: bool  # output layer reuses the embedding matrix
    max_context: int  # max_position_embeddings
    layer_windows: tuple[int | None, ...]  # per layer: sliding window (keys within the last W positions) or None
    layer_rope: tuple[str, ...]  # per layer: key into the runner's RoPE tables
    rope: dict[str, RopeFrequencies]  # RoPE frequencies per key

    @property
    def num_layers(self) -> int:
        return len(self.layer_windows)
