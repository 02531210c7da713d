"""`--dtype gguf`: the native runtime computing with a GGUF file's own 4-bit blocks.

Each 4-bit format unpacks to exactly what the `gguf` package de-quantizes, and the four-bit kernel computes
with exactly those weights; a tiny model written to a GGUF file here (4-bit layer
matrices, q and k rows permuted as llama.cpp's converter does, a Q8_0 output layer) runs in the new dtype
close to its exact de-quantized float32 weights, with k-token rows equal to 1-token rows and batched rows
equal to solo ones bit for bit.
"""

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from quickdraft.errors import ModelError, UsageError
from quickdraft.models.loading import load_model_dir
from quickdraft.models.native import native_runner_for
from quickdraft.models.native.gguf_blocks import (
    EIGHT_BIT_TYPES,
    FOUR_BIT_TYPES,
    GROUP,
    Blocks,
    EightBitBlocks,
    unpack,
)
from quickdraft.models.native.weights import Linear
from tests.test_batch_runtime import batch_differences, cache_differences
from tests.test_native_runtime import VARIANTS, _save_random_model, python_layers

CONFIGS = {"llama_gqa2_tied_linear": "llama", "mistral_sliding": "llama", "gemma3_interleaved": "gemma3"}
PROMPT = [3, 17, 42, 8, 29, 23, 4, 61, 15, 37, 5, 12]


def random_blocks(kind: str, rows: int, width: int, seed: int = 0) -> np.ndarray:
    """Raw bytes of random `kind` blocks [rows, bytes per row] whose fp16 fields are finite and moderate."""
    weights, per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows * width // weights, per_block), dtype=np.uint8)
    halves = 2 if kind in ("Q4_0", "Q8_0", "Q5_0", "Q6_K") else 4  # d, or d and m / dmin
    at = per_block - 2 if kind == "Q6_K" else 0  # Q6_K keeps its d last
    fields = rng.normal(0, 0.05, size=(raw.shape[0], halves // 2)).astype(np.float16).view(np.uint8)
    raw[:, at : at + halves] = fields
    return raw.reshape(rows, -1)


def kernel_blocks(kind: str, rows: int, width: int, seed: int) -> Blocks:
    """Random `kind` blocks unpacked, as llama.cpp's quantizers write them: Q8_0 values in -127..127 (the loader
    keeps -128 off the kernel)."""
    raw = random_blocks(kind, rows, width, seed)
    if kind == "Q8_0":
        values = raw.reshape(-1, 34)[:, 2:]
        values[values == 0x80] = 0x81
    return unpack(raw, kind, (rows, width))


@pytest.mark.parametrize("kind", FOUR_BIT_TYPES + EIGHT_BIT_TYPES)
def test_each_block_format_unpacks_to_the_gguf_packages_own_dequantization(kind):
    rows, width = 24, 512
    raw = random_blocks(kind, rows, width)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(rows, width)
    assert torch.equal(unpack(raw, kind, (rows, width)).dequantize(), torch.from_numpy(expected))


@pytest.mark.parametrize("kind", FOUR_BIT_TYPES + EIGHT_BIT_TYPES)
def test_the_block_forms_compute_with_the_files_exact_weights(kind):
    rows, width = 64, 256
    blocks = kernel_blocks(kind, rows, width, seed=1)
    linear = Linear(blocks.dequantize().bfloat16(), None, int8=False, blocks=blocks)
    assert linear.form == ("int4" if kind in FOUR_BIT_TYPES else "int8/32")
    assert torch.equal(linear.dense(), blocks.dequantize())
    x = torch.randn(5, width).bfloat16()
    exact = x.float() @ blocks.dequantize().T
    steps = x.float().view(5, -1, GROUP).abs().amax(-1).repeat_interleave(GROUP, dim=1) / 127  # int8 activations
    bound = (steps / 2) @ blocks.dequantize().abs().T + 2**-8 * exact.abs()  # plus the bfloat16 output
    assert ((linear(x).float() - exact).abs() <= bound * 1.01 + 1e-6).all()


def test_a_fused_matrix_of_32_and_16_weight_groups_computes_each_part_as_alone():
    """Q6_K's scales per 16 weights fused with Q8_0's per 32 (llama.cpp's mixes put Q6_K next to Q8_0 or Q5_0):
    every part keeps its exact weights, and its columns are the bits its own matrix gives."""
    parts = [kernel_blocks("Q8_0", 8, 256, seed=2), kernel_blocks("Q6_K", 12, 256, seed=3)]
    fused = EightBitBlocks.stack(parts)
    assert fused.group == 16 and parts[0].group == 32
    assert torch.equal(fused.dequantize(), torch.cat([part.dequantize() for part in parts]))

    def linear(blocks: EightBitBlocks) -> Linear:
        return Linear(blocks.dequantize().bfloat16(), None, int8=False, blocks=blocks)

    x = torch.randn(3, 256).bfloat16()
    assert torch.equal(linear(fused)(x), torch.cat([linear(part)(x) for part in parts], dim=1))


def write_gguf(model_dir, arch: str, path, kinds=("Q4_0", "Q4_1")) -> dict[str, str]:
    """Quantize the tiny checkpoint's layer matrices to 4-bit blocks (alternating `kinds`) and its embedding to
    Q8_0 in a GGUF file, q and k rows permuted as llama.cpp stores them; then rewrite the checkpoint to the
    file's exact de-quantization, as converting the GGUF would. Returns {hf name: ggml type}."""
    config = AutoConfig.from_pretrained(model_dir).get_text_config()
    weights_file = model_dir / "model.safetensors"
    tensors = load_file(weights_file)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    kinds_by_name = {}
    for i, (name, tensor) in enumerate(sorted(tensors.items())):
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if tensor.dim() != 2 or gguf_name is None:
            continue
        kind = "Q8_0" if "embed_tokens" in name or "lm_head" in name else kinds[i % len(kinds)]
        heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
        permute = next((h for key, h in heads.items() if key in name and arch == "llama"), None)
        stored = _llama_permute(tensor, permute) if permute else tensor
        quantized = gguf.quants.quantize(stored.float().numpy(), gguf.GGMLQuantizationType[kind])
        writer.add_tensor(gguf_name, quantized, raw_dtype=gguf.GGMLQuantizationType[kind])
        exact = torch.from_numpy(gguf.quants.dequantize(quantized, gguf.GGMLQuantizationType[kind]))
        tensors[name] = _llama_permute(exact, permute, inverse=True) if permute else exact
        kinds_by_name[name] = kind
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file(tensors, weights_file, metadata={"format": "pt"})
    return kinds_by_name


def _llama_permute(weight: torch.Tensor, heads: int, inverse: bool = False) -> torch.Tensor:
    """llama.cpp's row order for q and k (each head's two RoPE halves interleaved), or back."""
    rows, cols = weight.shape
    if inverse:
        return weight.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
    return weight.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def gguf_model(request, tmp_path_factory):
    """(checkpoint directory, GGUF file it was converted from, {hf name: ggml type})."""
    root = tmp_path_factory.mktemp(request.param)
    model_dir = root / "model"
    _save_random_model(VARIANTS[request.param](), model_dir)
    path = root / "model.gguf"
    return model_dir, path, write_gguf(model_dir, CONFIGS[request.param], path, kinds=("Q4_0", "Q4_1", "Q5_0"))


def test_block_matrices_run_on_the_files_blocks_and_the_rest_in_int8(gguf_model):
    """A fused matrix runs on the file's blocks when all its parts share a kind (4-bit, or 8-bit groups: Q8_0
    and Q5_0), else in int8 per row; the Q8_0 output layer on its blocks."""
    model_dir, path, kinds = gguf_model
    runner = native_runner_for(model_dir, "gguf", gguf=path)
    *layer_matrices, head = runner.linear_layers()
    assert head.form == "int8/32" and head.row_invariant
    forms = {linear.form for linear in layer_matrices}
    assert forms == {"int4", "int8/32", "int8"} and all(linear.row_invariant for linear in layer_matrices)
    # prompt blocks: 4-bit matrices through their own kernel, the others through a dense copy; the output layer none
    assert {(linear.form, linear.prompt_form) for linear in layer_matrices} == {
        ("int4", "own"),
        ("int8/32", "dense"),
        ("int8", "dense"),
    }
    assert head.prompt_form is None
    assert set(kinds.values()) == {"Q4_0", "Q4_1", "Q5_0", "Q8_0"}


def test_the_gguf_dtype_follows_the_exact_float32_weights_within_its_activation_rounding(gguf_model):
    """gguf computes with the file's exact weights; its verification rows quantize the products' activations to
    int8 per group of 32 (as llama.cpp does), and so do its prompt blocks through 4-bit matrices (the same kernel),
    while through the others they multiply the exact weights densely. The float32
    runner computes with the same exact weights, so their distance is the activations' rounding: bounded by a
    small multiple of bfloat16's (whose steps are 2^-9 of each value, where int8 steps are a group's max / 127).
    int8 per row is not compared: re-quantizing 4-bit weights to 8 bits moves them about as little. Compared on
    the final hidden states: the output layer is not in them."""
    model_dir, path, _ = gguf_model

    def final_states(dtype: str) -> torch.Tensor:  # [n, d] of a prompt block, then of verification rows
        runner = native_runner_for(model_dir, dtype, gguf=path)
        final = runner.spec.num_layers  # the final-norm state
        _, prompt = runner.prefill(PROMPT[:4], hidden_layers=(final,))
        _, verified = runner.forward(PROMPT[4:], hidden_layers=(final,))
        return torch.cat((prompt, verified))

    exact = final_states("float32")
    distance = {dtype: (final_states(dtype) - exact).abs().max().item() for dtype in ("gguf", "bfloat16")}
    assert distance["gguf"] <= 5 * distance["bfloat16"], distance


def test_gguf_verification_rows_equal_one_token_rows_and_batched_rows_equal_solo_ones(gguf_model):
    model_dir, path, _ = gguf_model
    runner = native_runner_for(model_dir, "gguf", gguf=path)
    runner.prefill(PROMPT)
    draft = [9, 31, 2, 57, 14]  # token ids below the tiny vocabulary of 64
    together = runner.forward(draft)
    runner.rollback(len(PROMPT))
    one_by_one = torch.cat([runner.forward([token]) for token in draft])
    assert torch.equal(together, one_by_one)
    batched, alone = (native_runner_for(model_dir, "gguf", gguf=path) for _ in range(2))
    assert batch_differences(batched, alone, sequences=4, rounds=20, seed=7) == []


def test_the_cpp_decoder_gives_the_bits_of_the_python_layers_on_a_ggufs_blocks(gguf_model, monkeypatch):
    """The C++ decoder's products on the block forms (4-bit prompt blocks in the one product of all rows, the others'
    through their dense copies) against the Python layers' (`Linear.batched`), in forwards that mix prompt chunks
    and verifications."""
    model_dir, path, _ = gguf_model
    batched, alone = (native_runner_for(model_dir, "gguf", gguf=path) for _ in range(2))
    assert batched.decoder is not None
    python_layers(alone, monkeypatch)
    assert batch_differences(batched, alone, sequences=3, rounds=20, seed=11) == []
    assert cache_differences(batched, alone) == []


def test_a_gguf_that_does_not_match_the_checkpoint_is_refused(gguf_model, tmp_path):
    model_dir, _, _ = gguf_model
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    for file in model_dir.iterdir():
        (other_dir / file.name).write_bytes(file.read_bytes())
    config = next(name for name, arch in CONFIGS.items() if (model_dir.parent.name.startswith(name)))
    write_gguf(other_dir, CONFIGS[config], tmp_path / "other.gguf", kinds=("Q4_1",))
    with pytest.raises(ModelError, match="do not de-quantize to the checkpoint's weights"):
        native_runner_for(model_dir, "gguf", gguf=tmp_path / "other.gguf")


def test_the_gguf_dtype_needs_a_model_that_came_from_a_gguf_file(tiny_dirs):
    with pytest.raises(UsageError, match="did not come from one"):
        load_model_dir(tiny_dirs["llama"], dtype="gguf")
