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
from quickdraft.models.native.spec import DecoderSpec

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


class Linear:
    """y = x @ W.T (+ b), with W either in the compute dtype or int8 with one scale per output row.

    A matrix that prompt blocks go through (`batched`) multiplies them densely in `prompt_dtype`: an int8
    matrix keeps a de-quantized copy for it (the int8 kernel is compute-bound past a few rows, a dense
    product of a whole block several times faster), as does a matrix whose prompt dtype is not its own.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, int8: bool, prompt_dtype: torch.dtype | None = None
    ) -> None:
        self.bias = bias  # [out] or None
        self.scales = None  # [out] when int8
        self.weight = weight  # [out, in]
        if int8:
            self.weight, self.scales = quantize_rows(weight)
        self._prompt_weight = None  # [out, in] in the prompt dtype; None: no prompt block comes here (output layer)
        if prompt_dtype is not None:
            same = not int8 and prompt_dtype == weight.dtype
            self._prompt_weight = self.weight if same else self.dense().to(prompt_dtype)
        self._prompt_bias = None if bias is None or prompt_dtype is None else bias.to(prompt_dtype)

    def dense(self) -> torch.Tensor:
        """The weight [out, in] as a float tensor (de-quantized when int8)."""
        return self.weight if self.scales is None else self.weight.float() * self.scales.float()[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [n, in] -> [n, out]
        if self.scales is None:
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)
        return y if self.bias is None else y + self.bias

    def batched(self, x: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
        """x [N, in], stacked rows of several sequences -> [N, out], every group's rows equal to what they give
        in a forward of their own sequence alone, bit for bit.

        Verification rows in int8 run one product over all of them: `_weight_int8pack_mm` computes every
        row the same way whatever the row count. Dense float kernels do not (oneDNN changes blocking and
        accumulation with the row count), so each group of verification rows gets a product of its own,
        shaped as it would be alone. A prompt block always gets a dense product of its own (the
        de-quantized matrix in int8): its shape depends only on the prompt, never on the load.
        """
        if all(not group.prompt_block for group in groups) and (self.scales is not None or len(groups) == 1):
            return self(x)
        pieces, int8_rows = [], []  # int8_rows: consecutive verification groups waiting for one product
        for group in groups:
            if not group.prompt_block and self.scales is not None:
                int8_rows.append(group.rows)
                continue
            if int8_rows:
                pieces.append(self(x[int8_rows[0].start : int8_rows[-1].stop]))
                int8_rows = []
            pieces.append(self._prompt_product(x[group.rows]) if group.prompt_block else self(x[group.rows]))
        if int8_rows:
            pieces.append(self(x[int8_rows[0].start : int8_rows[-1].stop]))
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def _prompt_product(self, x: torch.Tensor) -> torch.Tensor:
        if self._prompt_weight is None:
            raise InternalError("this matrix keeps no dense form for prompt blocks")
        return F.linear(x.to(self._prompt_weight.dtype), self._prompt_weight, self._prompt_bias).to(x.dtype)


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
    model_dir: Path, spec: DecoderSpec, dtype: torch.dtype, device: torch.device, int8: bool
) -> ModelWeights:
    """Read, fuse and convert all weights of `spec`'s model to `dtype` on `device`."""
    ckpt = _Checkpoint(model_dir)
    place = lambda t: None if t is None else t.to(device=device, dtype=dtype).contiguous()  # noqa: E731
    embedding = place(ckpt.decoder("embed_tokens.weight"))
    head = embedding if spec.tie_embeddings else place(ckpt.get("lm_head.weight"))
    prompts = prompt_dtype(dtype, device)
    layers = tuple(_layer(ckpt, spec, i, place, int8, prompts) for i in range(spec.num_layers))
    final_norm = place(ckpt.decoder("norm.weight") + spec.norm_weight_offset)
    return ModelWeights(embedding, layers, final_norm, Linear(head, None, int8))


def _layer(ckpt: _Checkpoint, spec: DecoderSpec, i: int, place, int8: bool, prompts: torch.dtype) -> LayerWeights:
    def tensor(name: str, required: bool = True) -> torch.Tensor | None:
        return ckpt.decoder(f"layers.{i}.{name}", required)

    def norm(name: str) -> torch.Tensor:
        return place(tensor(name) + spec.norm_weight_offset)

    q, k, v = (tensor(f"self_attn.{p}_proj.weight") for p in "qkv")
    qkv_bias = _fused_bias([tensor(f"self_attn.{p}_proj.bias", False) for p in "qkv"], (q, k, v))
    qk_norm = None
    if spec.qk_norm:
        rows = (
            norm("self_attn.q_norm.weight").expand(spec.num_heads, -1),
            norm("self_attn.k_norm.weight").expand(spec.num_kv_heads, -1),
        )
        qk_norm = torch.cat(rows).contiguous()
    gate, up = tensor("mlp.gate_proj.weight"), tensor("mlp.up_proj.weight")
    sandwich = spec.sandwich_norms
    return LayerWeights(
        input_norm=norm("input_layernorm.weight"),
        qkv=Linear(place(torch.cat((q, k, v))), place(qkv_bias), int8, prompts),
        qk_norm=qk_norm,
        o=Linear(
            place(tensor("self_attn.o_proj.weight")), place(tensor("self_attn.o_proj.bias", False)), int8, prompts
        ),
        post_attention_norm=norm("post_attention_layernorm.weight") if sandwich else None,
        pre_mlp_norm=norm("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight"),
        gate_up=Linear(place(torch.cat((gate, up))), None, int8, prompts),
        down=Linear(place(tensor("mlp.down_proj.weight")), None, int8, prompts),
        post_mlp_norm=norm("post_feedforward_layernorm.weight") if sandwich else None,
    )


def _fused_bias(biases: list[torch.Tensor | None], weights: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    """One bias for the fused q/k/v matmul; zeros stand in for projections without one."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(w.shape[0]) for b, w in zip(biases, weights)])
