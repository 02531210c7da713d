"""Llama family configs (Llama 2/3, SmolLM2, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norms)."""

from quickdraft.models.native.rope import rope_frequencies, rope_supported
from quickdraft.models.native.spec import DecoderSpec

LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})


def llama_spec(hf_config, architecture: str) -> DecoderSpec | None:
    """The decoder spec of a Llama-family config, or None when it uses a feature we do not implement."""
    rope_params = hf_config.rope_parameters
    if getattr(hf_config, "hidden_act", "silu") != "silu" or getattr(hf_config, "mlp_bias", False):
        return None
    if not rope_supported(rope_params):
        return None
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    windows = _layer_windows(hf_config, architecture)
    return DecoderSpec(
        architecture=architecture,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=hf_config.intermediate_size,
        rms_norm_eps=hf_config.rms_norm_eps,
        norm_weight_offset=0.0,
        activation="silu",
        attention_scale=head_dim**-0.5,
        embedding_scale=None,
        sandwich_norms=False,
        qk_norm=architecture == "Qwen3ForCausalLM",
        final_logit_softcap=None,
        tie_embeddings=bool(hf_config.tie_word_embeddings),
        max_context=hf_config.max_position_embeddings,
        layer_windows=windows,
        layer_rope=("rope",) * len(windows),
        rope={"rope": rope_frequencies(hf_config, rope_params, head_dim)},
    )


def _layer_windows(hf_config, architecture: str) -> tuple[int | None, ...]:
    """Mistral applies its sliding window to every layer; Qwen2/3 to the layers typed "sliding_attention"."""
    layers = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None)
    if architecture == "MistralForCausalLM" or window is None:
        return (window,) * layers
    layer_types = getattr(hf_config, "layer_types", None) or ["full_attention"] * layers
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
