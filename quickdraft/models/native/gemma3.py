"""Gemma 3 text configs: local sliding-window layers interleaved with global ones, q/k norms,
pre- and post-norms around both sublayers, sqrt(d)-scaled embeddings, GELU-tanh MLP, one RoPE
base per layer type."""

from quickdraft.models.native.rope import rope_frequencies, rope_supported
from quickdraft.models.native.spec import DecoderSpec

GEMMA3_FAMILY = frozenset({"Gemma3ForCausalLM"})


def gemma3_spec(hf_config, architecture: str) -> DecoderSpec | None:
    """The decoder spec of a Gemma 3 text config, or None when it uses a feature we do not implement."""
    if hf_config.attn_logit_softcapping is not None or getattr(hf_config, "use_bidirectional_attention", False):
        return None
    if hf_config.hidden_activation != "gelu_pytorch_tanh":
        return None
    layer_types = tuple(hf_config.layer_types)
    rope_params = hf_config.rope_parameters
    if not all(rope_supported(rope_params[kind]) for kind in set(layer_types)):
        return None
    head_dim = hf_config.head_dim
    return DecoderSpec(
        architecture=architecture,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=hf_config.intermediate_size,
        rms_norm_eps=hf_config.rms_norm_eps,
        norm_weight_offset=1.0,
        activation="gelu_tanh",
        attention_scale=hf_config.query_pre_attn_scalar**-0.5,
        embedding_scale=hf_config.hidden_size**0.5,
        sandwich_norms=True,
        qk_norm=True,
        final_logit_softcap=hf_config.final_logit_softcapping,
        tie_embeddings=bool(hf_config.tie_word_embeddings),
        max_context=hf_config.max_position_embeddings,
        layer_windows=tuple(hf_config.sliding_window if k == "sliding_attention" else None for k in layer_types),
        layer_rope=layer_types,
        rope={kind: rope_frequencies(hf_config, rope_params[kind], head_dim, kind) for kind in set(layer_types)},
    )
