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
# The activation (and KV cache) dtype of each native dtype. "int8": int8 weights per row; "gguf": the GGUF
# file's own 4-bit blocks on the int4 kernel where it stores a matrix in one, int8 elsewhere (gguf_blocks.py).
NATIVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16, "gguf": torch.bfloat16}
QUANTIZED_DTYPES = ("int8", "gguf")  # CPU kernels only


def default_native_dtype(from_gguf: bool, device: str = "cpu") -> str:
    """The fastest native dtype whose k-token verification forwards equal its own 1-token forwards, so that
    speculation stays exact with respect to the target run in that dtype: the int8 and int4 kernels compute
    each row on its own (bit-identical across row counts), bfloat16 and float32 matmuls on the CPU do not
    (bfloat16 logits move by up to ~0.4 between a 5-token and five 1-token forwards on SmolLM2, so greedy ties
    flip).
    A model converted from a GGUF file runs on the file's own 4-bit blocks ("gguf": faster than int8 on both
    built-in models, and closer to the file's weights); any other on int8 weights per row. Measured with
    `quickdraft bench-runtime --dtypes gguf` (docs/native_runtime.md).

    On a GPU, where those kernels do not run, float32: dense products run in fixed tiles of rows there
    (`weights.dense_row_tile`), so verification rows equal 1-token rows in float32 and bfloat16 alike, and float32
    decoded faster than bfloat16 on both built-in models' shapes on an H200 (63 and 47 tok/s in bfloat16, 68 and
    82 in float32: `scripts/gpu_check.py`, docs/native_runtime.md "On a GPU")."""
    if torch.device(device).type != "cpu":
        return "float32"
    return "gguf" if from_gguf else "int8"


__all__ = [
    "NATIVE_ARCHITECTURES",
    "NATIVE_DTYPES",
    "QUANTIZED_DTYPES",
    "default_native_dtype",
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


def native_runner_for(
    model_dir: Path, dtype: str = "float32", device: str = "cpu", gguf: Path | None = None
) -> NativeRunner | None:
    """Load a native runner; dtype "float32", "bfloat16", "int8" (int8 weights, bfloat16 activations) or "gguf"
    (the 4-bit blocks of `gguf`, the file `model_dir` was converted from; int8 for its other matrices)."""
    if dtype not in NATIVE_DTYPES:
        raise UsageError(f"native dtype must be one of {', '.join(NATIVE_DTYPES)}, got {dtype!r}")
    if dtype in QUANTIZED_DTYPES and torch.device(device).type != "cpu":
        raise UsageError(f"{dtype} weights use a CPU kernel; use float32 or bfloat16 on {device}")
    if dtype == "gguf" and gguf is None:
        raise UsageError(
            f"--dtype gguf runs a GGUF file's own blocks, and {model_dir} did not come from one; "
            "pass a built-in model or a .gguf file, or use --dtype int8"
        )
    model_dir = Path(model_dir)
    spec = native_spec(model_dir)
    if spec is None:
        return None
    torch_device = torch.device(device)
    weights = load_weights(
        model_dir,
        spec,
        NATIVE_DTYPES[dtype],
        torch_device,
        int8=dtype in QUANTIZED_DTYPES,
        gguf=gguf if dtype == "gguf" else None,
    )
    info = replace(model_info(model_dir, name=str(model_dir), vocab_size=spec.vocab_size), max_context=spec.max_context)
    return NativeRunner(info, spec, weights, NATIVE_DTYPES[dtype], torch_device)
