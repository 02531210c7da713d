"""Weights read from safetensors, fused and converted once at load time.

q/k/v projections become one matrix and gate/up another, so an attention block and an MLP each
start with a single matmul. RMSNorm weights are stored ready to multiply (Gemma's +1 applied).
Only `safetensors.safe_open` is used: nothing is unpickled.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from quickdraft.errors import InternalError, ModelError
from quickdraft.models.native.gguf_blocks import Blocks, EightBitBlocks, FourBitBlocks, GgufFile, matched_rows
from quickdraft.models.native.kernels import eight_bit_matmul, four_bit_matmul, pack_eight_bit, pack_four_bit
from quickdraft.models.native.spec import DecoderSpec

# Rows of every dense product over verification rows on a GPU; see `dense_row_tile`.
GPU_ROW_TILE = 16
# Checkpoint prefixes of the decoder stack, tried in order (plain CausalLM, then multimodal wrappers).
_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


@dataclass(frozen=True)
class RowGroup:
    """Rows of a batched forward that go through a matrix product together."""

    rows: slice  # of the stacked activations
    prompt_block: bool  # the rows of one PREFILL_BLOCK of a prompt chunk; else a verification's (or logit) rows


def prompt_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype prompt blocks multiply in: the compute dtype, or float32 for bfloat16 on a CPU without native
    bfloat16 products, where a 128-row float32 product is 5-6x faster (AVX2; docs/native_runtime.md)."""
    no_native_bf16 = device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.float32 if dtype == torch.bfloat16 and no_native_bf16 else dtype


def dense_row_tile(device: torch.device) -> int | None:
    """How many rows each dense product of verification rows runs on `device` (None: as many as it has).

    A GPU's matrix library picks its kernel, tiling and split of the sum by the row count, so a row of a 5-row
    product need not carry the bits of the same row multiplied alone. At one fixed row count every row goes through
    the same kernel the same way, whatever the other rows hold, so there every product runs in tiles of
    `GPU_ROW_TILE` rows, zero rows padding the last: a k-token verification row equals a 1-token row, a batched row
    its solo row. A 16-row product of a decode-size matrix costs a GPU what a 1-row product costs (both wait on
    reading the weights). None on the CPU, whose exact dtypes run row-invariant kernels of their own (int8, gguf)
    and where 16 rows would multiply the compute of a float32 decode step."""
    return None if device.type == "cpu" else GPU_ROW_TILE


class Linear:
    """y = x @ W.T (+ b), with W in one of four forms: dense in the compute dtype; int8 with one scale per
    output row (`int8`); or a GGUF's blocks exactly as the file holds them (`blocks`): int4 in groups of 32
    columns, each with a scale and an offset (`gguf_blocks.FourBitBlocks` on `kernels.four_bit_matmul`), or
    int8 in groups of 32 columns with a scale each ("int8/32": `EightBitBlocks` on `kernels.eight_bit_matmul`).

    Prompt blocks (`batched`) of int4 blocks go through their one kernel, whose panels serve one row and a 128-row
    block alike (1.7x a dense float32 product of a 128-row block on AVX2), so a prompt row is the bits of the decode
    row of the same input. Every other form multiplies prompt blocks densely in `prompt_dtype`, through a
    de-quantized copy where that is not its own (the int8 and 8-bit group kernels are compute-bound past a few rows).

    A dense weight with a `row_tile` multiplies in products of exactly that many rows (`dense_row_tile`), which
    makes it row-invariant too.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        int8: bool,
        prompt_dtype: torch.dtype | None = None,
        blocks: Blocks | None = None,
        row_tile: int | None = None,
    ) -> None:
        self.bias = bias  # [out] or None
        self.row_tile = row_tile  # rows of each dense product (zero rows pad the last); None: all rows in one
        self.scales = None  # [out] when int8 per row
        self.weight = weight  # [out, in]; blocks: `kernels.pack_four_bit`'s or `pack_eight_bit`'s panels (uint8)
        self._blocks = blocks  # the file's blocks, kept for dense()
        if isinstance(blocks, FourBitBlocks):
            self.weight = pack_four_bit(blocks.integers(), blocks.scales, blocks.mins)
        elif isinstance(blocks, EightBitBlocks):
            self.weight = pack_eight_bit(blocks.values, blocks.scales)
        elif int8:
            self.weight, self.scales = quantize_rows(weight)
        self.out_features, self.in_features = weight.shape if blocks is None else blocks.shape
        self.prompt_weight = None  # [out, in] in the prompt dtype; None: no dense prompt product (see below)
        if prompt_dtype is not None and not isinstance(blocks, FourBitBlocks):  # None: no prompt block comes here
            same = self.form == "dense" and prompt_dtype == weight.dtype
            self.prompt_weight = self.weight if same else self.dense().to(prompt_dtype)
        self.prompt_bias = None if bias is None or prompt_dtype is None else bias.to(prompt_dtype)

    @property
    def form(self) -> str:
        """How the weight is stored: "dense", "int8" (per row), "int4" or "int8/32" (32-column groups)."""
        if self._blocks is not None:
            return "int4" if isinstance(self._blocks, FourBitBlocks) else "int8/32"
        return "int8" if self.scales is not None else "dense"

    @property
    def prompt_form(self) -> str | None:
        """How prompt blocks multiply this matrix: "own" (its own kernel, int4 blocks), "dense", or None (none come
        here)."""
        if self.form == "int4":
            return "own"
        return None if self.prompt_weight is None else "dense"

    @property
    def row_invariant(self) -> bool:
        """Whether the kernel computes every row the same way whatever the row count (int8, blocks and dense
        products in fixed tiles do)."""
        return self.form != "dense" or self.row_tile is not None

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: the weight in its stored form (blocks with their scales and offsets), its
        per-row scales and bias."""
        return sum(t.nbytes for t in (self.weight, self.scales, self.bias) if t is not None)

    def dense(self) -> torch.Tensor:
        """The weight [out, in] as a float tensor (int8 and blocks de-quantized from what their kernels read)."""
        if self._blocks is not None:
            return self._blocks.dequantize()
        return self.weight if self.scales is None else self.weight.float() * self.scales.float()[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [n, in] -> [n, out]
        form = self.form
        if form == "dense":
            return F.linear(x, self.weight, self.bias) if self.row_tile is None else self._tiled(x)
        if form == "int4":
            y = four_bit_matmul(x, self.weight, self.out_features)
        elif form == "int8/32":
            y = eight_bit_matmul(x, self.weight, self.out_features)
        else:
            y = torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)
        return y if self.bias is None else y + self.bias

    def batched(self, x: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
        """x [N, in], stacked rows of several sequences -> [N, out], every group's rows equal to what they give
        in a forward of their own sequence alone, bit for bit.

        Verification rows through a row-invariant kernel run one product over all of them:
        `_weight_int8pack_mm`, the block kernels and dense products in fixed tiles (`row_tile`, off the CPU)
        compute every row the same way whatever the row count. Untiled dense float kernels do not (oneDNN changes
        blocking and accumulation with the row count), so each group of verification rows gets a product of its
        own, shaped as it would be alone. int4 blocks run prompt blocks
        through the same kernel, in the one product of all rows. Other forms give a prompt block a product of its
        own (dense; the de-quantized matrix for int8 and 8-bit groups): its shape depends only on the prompt, never
        on the load.
        """
        if self.form == "int4" or (
            all(not group.prompt_block for group in groups) and (self.row_invariant or len(groups) == 1)
        ):
            return self(x)
        pieces, shared_rows = [], []  # shared_rows: consecutive verification groups waiting for one product
        for group in groups:
            if not group.prompt_block and self.row_invariant:
                shared_rows.append(group.rows)
                continue
            if shared_rows:
                pieces.append(self(x[shared_rows[0].start : shared_rows[-1].stop]))
                shared_rows = []
            pieces.append(self._prompt_product(x[group.rows]) if group.prompt_block else self(x[group.rows]))
        if shared_rows:
            pieces.append(self(x[shared_rows[0].start : shared_rows[-1].stop]))
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def _tiled(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> [n, out] in products of exactly `row_tile` rows each, zero rows padding the last."""
        n = x.shape[0]
        padded = F.pad(x, (0, 0, 0, -n % self.row_tile))  # [tiles * row_tile, in]
        products = [F.linear(tile, self.weight, self.bias) for tile in padded.split(self.row_tile)]
        return (products[0] if len(products) == 1 else torch.cat(products))[:n]  # one tile: no copy

    def _prompt_product(self, x: torch.Tensor) -> torch.Tensor:
        if self.prompt_weight is None:
            raise InternalError("this matrix keeps no dense form for prompt blocks")
        return F.linear(x.to(self.prompt_weight.dtype), self.prompt_weight, self.prompt_bias).to(x.dtype)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: weight ~= q * scale[:, None]."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)  # [out, in]
    return q.contiguous(), scales.to(weight.dtype)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer, fused."""

    input_norm: torch.Tensor  # [d]
    qkv: Linear  # [(H + 2 KV) * hd, d]
    qk_norm: torch.Tensor | None  # [H + KV, hd]: q_norm rows for query heads, k_norm rows for key heads
    o: Linear  # [d, H * hd]
    post_attention_norm: torch.Tensor | None  # [d], sandwich norms only
    pre_mlp_norm: torch.Tensor  # [d]
    gate_up: Linear  # [2 I, d]: gate rows then up rows
    down: Linear  # [d, I]
    post_mlp_norm: torch.Tensor | None  # [d], sandwich norms only


@dataclass(frozen=True)
class ModelWeights:
    embedding: torch.Tensor  # [vocab, d]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [d]
    lm_head: Linear  # [vocab, d]


class _Checkpoint:
    """Tensor names of every *.safetensors file in a directory, read lazily as float32."""

    def __init__(self, model_dir: Path) -> None:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise ModelError(f"no *.safetensors files in {model_dir}; convert the model first")
        self._handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}
        self.prefix = next((p for p in _PREFIXES if f"{p}embed_tokens.weight" in self._where), None)
        if self.prefix is None:
            raise ModelError(f"{model_dir}: no embed_tokens.weight under {', '.join(_PREFIXES)}")

    def get(self, name: str, required: bool = True) -> torch.Tensor | None:
        handle = self._where.get(name)
        if handle is None:
            if required:
                raise ModelError(f"checkpoint is missing tensor {name!r}")
            return None
        return handle.get_tensor(name).float()

    def decoder(self, name: str, required: bool = True) -> torch.Tensor | None:
        return self.get(self.prefix + name, required)


def load_weights(
    model_dir: Path,
    spec: DecoderSpec,
    dtype: torch.dtype,
    device: torch.device,
    int8: bool,
    gguf: Path | None = None,
) -> ModelWeights:
    """Read, fuse and convert all weights of `spec`'s model to `dtype` on `device`; with `gguf` (the file the
    checkpoint was converted from), every matrix the file stores in 4-bit blocks runs on those blocks (int4)."""
    ckpt = _Checkpoint(model_dir)
    place = lambda t: None if t is None else t.to(device=device, dtype=dtype).contiguous()  # noqa: E731
    tile = dense_row_tile(device)
    matrices = _Matrices(ckpt, place, int8, None if gguf is None else GgufFile(gguf, spec.num_layers), tile)
    embedding = place(ckpt.decoder("embed_tokens.weight"))
    if spec.tie_embeddings and gguf is None:
        head = Linear(embedding, None, int8, row_tile=tile)  # the embedding's own tensor (no copy when dense)
    else:  # a GGUF's blocks are matched against the checkpoint's exact float32 weights, read again
        head = matrices([ckpt.prefix + "embed_tokens.weight" if spec.tie_embeddings else "lm_head.weight"], None, None)
    prompts = prompt_dtype(dtype, device)
    layers = tuple(_layer(ckpt, spec, i, place, matrices, prompts) for i in range(spec.num_layers))
    final_norm = place(ckpt.decoder("norm.weight") + spec.norm_weight_offset)
    return ModelWeights(embedding, layers, final_norm, head)


class _Matrices:
    """Builds each (fused) Linear from checkpoint tensors: on a GGUF's blocks where the file stores every part in
    block formats of one kind (4-bit, or 8-bit groups), else int8 per row or dense as the dtype says."""

    def __init__(self, ckpt: _Checkpoint, place, int8: bool, gguf: GgufFile | None, row_tile: int | None) -> None:
        self._ckpt, self._place, self._int8, self._gguf, self._row_tile = ckpt, place, int8, gguf, row_tile

    def __call__(self, names: list[str], bias: torch.Tensor | None, prompts: torch.dtype | None) -> Linear:
        parts = [self._ckpt.get(name) for name in names]  # float32 [out_i, in] each
        blocks = self._blocks(names, parts)
        weight, bias = self._place(torch.cat(parts)), self._place(bias)
        return Linear(weight, bias, self._int8, prompts, blocks=blocks, row_tile=self._row_tile)

    def _blocks(self, names: list[str], parts: list[torch.Tensor]) -> Blocks | None:
        if self._gguf is None:
            return None
        found = [self._gguf.blocks(name) for name in names]
        if any(f is None for f in found) or len({type(blocks) for _, blocks in found}) != 1:
            return None
        kind = type(found[0][1])
        if kind is EightBitBlocks and any((blocks.values == -128).any() for _, blocks in found):
            return None  # the kernel's sign trick needs |value| <= 127 (llama.cpp's quantizers write no -128)
        return kind.stack(
            [
                matched_rows(blocks, part, f"{self._gguf.path}: {gguf_name}")
                for (gguf_name, blocks), part in zip(found, parts)
            ]
        )


def _layer(ckpt: _Checkpoint, spec: DecoderSpec, i: int, place, matrices: _Matrices, prompts) -> LayerWeights:
    def name(suffix: str) -> str:
        return f"{ckpt.prefix}layers.{i}.{suffix}"

    def tensor(suffix: str, required: bool = True) -> torch.Tensor | None:
        return ckpt.get(name(suffix), required)

    def norm(suffix: str) -> torch.Tensor:
        return place(tensor(suffix) + spec.norm_weight_offset)

    qkv_names = [name(f"self_attn.{p}_proj.weight") for p in "qkv"]
    qkv_rows = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim)
    qkv_bias = _fused_bias([tensor(f"self_attn.{p}_proj.bias", False) for p in "qkv"], qkv_rows)
    qk_norm = None
    if spec.qk_norm:
        rows = (
            norm("self_attn.q_norm.weight").expand(spec.num_heads, -1),
            norm("self_attn.k_norm.weight").expand(spec.num_kv_heads, -1),
        )
        qk_norm = torch.cat(rows).contiguous()
    sandwich = spec.sandwich_norms
    return LayerWeights(
        input_norm=norm("input_layernorm.weight"),
        qkv=matrices(qkv_names, qkv_bias, prompts),
        qk_norm=qk_norm,
        o=matrices([name("self_attn.o_proj.weight")], tensor("self_attn.o_proj.bias", False), prompts),
        post_attention_norm=norm("post_attention_layernorm.weight") if sandwich else None,
        pre_mlp_norm=norm("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight"),
        gate_up=matrices([name("mlp.gate_proj.weight"), name("mlp.up_proj.weight")], None, prompts),
        down=matrices([name("mlp.down_proj.weight")], None, prompts),
        post_mlp_norm=norm("post_feedforward_layernorm.weight") if sandwich else None,
    )


def _fused_bias(biases: list[torch.Tensor | None], rows: tuple[int, ...]) -> torch.Tensor | None:
    """One bias for the fused q/k/v matmul; zeros (of each projection's `rows`) stand in where one has none."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(biases, rows)])
