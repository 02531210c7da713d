"""Rotary position embeddings: frequencies from the config, cos/sin tables per position.

Frequencies come from transformers' own RoPE initialisers (default, linear, dynamic, yarn,
llama3), so every scaling variant a config names gets the exact same `inv_freq`. Tables are
precomputed for the cache capacity with the formula transformers applies per call, and
rotation uses a half-swap with a sign-folded sine, which equals `x*cos + rotate_half(x)*sin`.

The angles are float32 products, as in transformers; their cosines and sines are taken in
float64 by numpy and rounded once to float32. torch's float32 `cos` is not a function of its
input alone here: in about one process in ten, two tables built from the same angles in one
process differed in the second half of their elements (torch 2.13, MKL, 2 threads). A table
that differs between two runners of one process breaks the promise that a batched row equals
the same sequence's row alone. numpy runs no threads; its float64 values rounded to float32
agree with Python's `math` rounded the same way (the test checks one 4096-position table).
"""

from dataclasses import dataclass

import numpy as np
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from quickdraft.models.native.spec import RopeFrequencies

# "dynamic" equals "default" for positions below max_position_embeddings, which is the runner's
# context limit; "longrope" switches frequencies with sequence length, so it is left to transformers.
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "dynamic", "yarn", "llama3"})


def rope_frequencies(hf_config, params: dict, head_dim: int, layer_type: str | None = None) -> RopeFrequencies:
    """`inv_freq` and attention scaling for one `rope_parameters` entry."""
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim  # [hd // 2]
        return RopeFrequencies(1.0 / (params["rope_theta"] ** exponents), 1.0)
    kwargs = {"layer_type": layer_type} if layer_type is not None else {}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), **kwargs)
    return RopeFrequencies(inv_freq.float(), float(scaling))


def rope_supported(params: dict) -> bool:
    return (
        params.get("rope_type", "default") in SUPPORTED_ROPE_TYPES and params.get("partial_rotary_factor", 1.0) == 1.0
    )


@dataclass(frozen=True)
class RopeTable:
    """cos and sign-folded sin for positions 0..capacity-1, in the compute dtype."""

    cos: torch.Tensor  # [capacity, 1, hd]
    sin_signed: torch.Tensor  # [capacity, 1, hd]: first half -sin, second half +sin

    @staticmethod
    def build(freqs: RopeFrequencies, capacity: int, dtype: torch.dtype, device: torch.device) -> "RopeTable":
        positions = torch.arange(capacity, dtype=torch.float)  # [capacity]
        angles = (positions[:, None] * freqs.inv_freq[None, :]).double().numpy()  # [capacity, hd // 2]
        cos = torch.from_numpy(np.cos(angles)).float() * freqs.attention_scaling  # [capacity, hd // 2]
        sin = torch.from_numpy(np.sin(angles)).float() * freqs.attention_scaling
        cos_full, sin_signed = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)  # [capacity, hd]
        return RopeTable(_place(cos_full, dtype, device), _place(sin_signed, dtype, device))


def _place(table: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return table[:, None, :].to(device=device, dtype=dtype).contiguous()
