"""quickdraft's native model runtime: its own forward pass over a preallocated KV cache.

`native_runner_for` returns a runner for Llama-family and Gemma 3 text checkpoints and None for
every other architecture (or for a supported one using a feature not implemented here), in which
case the caller falls back to the transformers runner.
"""

from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoConfig

from quickdraft.errors import UsageError
from quickdraft.models.checkpoint import model_info
from quickdraft.models.native.gemma3 import GEMMA3_FAMILY, gemma3_spec
from quickdraft.models.native.llama import LLAMA_FAMILY, llama_spec
from quickdraft.models.native.runner import NativeRunner
from quickdraft.models.native.spec import DecoderSpec
from quickdraft.models.native.weights import load_weights

NATIVE_ARCHITECTURES = LLAMA_FAMILY | GEMMA3_FAMILY
NATIVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16}
# The fastest native dtype whose k-token verification forwards equal its own 1-token forwards, so
# speculation stays exact with respect to the target run in that dtype. Measured with
# `quickdraft bench-runtime --dtypes bfloat16,int8` (docs/native_runtime.md): int8 weights with
# bfloat16 activations decode fastest and `_weight_int8pack_mm` computes each row independently,
# so its logits are bit-identical across batch sizes; bfloat16 matmuls are not (logits move by up
# to ~0.4 between a 5-token and five 1-token forwards on SmolLM2), so greedy ties flip there.
DEFAULT_NATIVE_DTYPE = "int8"

__all__ = [
    "DEFAULT_NATIVE_DTYPE",
    "NATIVE_ARCHITECTURES",
    "NATIVE_DTYPES",
    "NativeRunner",
    "native_runner_for",
    "native_spec",
]


def native_spec(model_dir: Path) -> DecoderSpec | None:
    """The decoder spec for a checkpoint directory, or None if the native runtime does not support it."""
    hf_config = AutoConfig.from_pretrained(model_dir)
    architecture = (getattr(hf_config, "architectures", None) or [""])[0]
    if architecture in LLAMA_FAMILY:
        return llama_spec(hf_config, architecture)
    if architecture in GEMMA3_FAMILY:
        return gemma3_spec(hf_config, architecture)
    return None


def native_runner_for(model_dir: Path, dtype: str = "float32", device: str = "cpu") -> NativeRunner | None:
    """Load a native runner; dtype "float32", "bfloat16" or "int8" (int8 weights, bfloat16 activations)."""
    if dtype not in NATIVE_DTYPES:
        raise UsageError(f"native dtype must be one of {', '.join(NATIVE_DTYPES)}, got {dtype!r}")
    if dtype == "int8" and torch.device(device).type != "cpu":
        raise UsageError(f"int8 weights use a CPU kernel; use float32 or bfloat16 on {device}")
    model_dir = Path(model_dir)
    spec = native_spec(model_dir)
    if spec is None:
        return None
    torch_device = torch.device(device)
    weights = load_weights(model_dir, spec, NATIVE_DTYPES[dtype], torch_device, int8=dtype == "int8")
    info = replace(model_info(model_dir, name=str(model_dir), vocab_size=spec.vocab_size), max_context=spec.max_context)
    return NativeRunner(info, spec, weights, NATIVE_DTYPES[dtype], torch_device)
