"""The head's inference form on a CPU: every matrix in 4-bit groups of 32 weights, each with a float16 scale and
offset (GGUF's Q4_1, quantized here from the head's float weights), on quickdraft's own 4-bit block kernel
(`kernels.four_bit_matmul`, the one the native runtime runs a GGUF's 4-bit matrices on), and the decoder layer and
output in C++ (`kernels.new_head_layer`: a drafting step in two calls).

Drafting one token reads every weight of the head once: the reduced-vocabulary output rows
(draft_vocab x d) dominate, then the layer's projections (and fc, once per committed position). The step is
bound by that traffic, so its cost against the target's one-token forward, c, follows the bytes: int8 groups
(the form before this one) made c 0.11-0.13 on smollm2's head; 4-bit groups read 0.56x their bytes and make it
about 0.1 (BENCHMARKS.md, "The head in 4-bit groups"), while the head's drafts barely move. The kernel takes the
float32 activations as they are (int8 activations per group of 32, as for the target's blocks). The C++ layer runs
the arithmetic around the products (the norms, rotary embedding and attention in float32, q, k and v in one
product, gate and up in another) without the dispatch cost of some sixty small torch operators. A head's card
reports the measured ratio c (`quickdraft.distill.evaluation.cost_ratio`). A matrix whose width is not a multiple
of 32 stays float32.

Exactness does not depend on this: the verifier checks every draft token against the target, and
sampled drafts carry the distribution they were drawn from. Precision only moves acceptance,
which `tests/test_head.py` compares between the two forms.
"""

import torch

from quickdraft.drafters.head.model import DraftHead, HeadCache, HeadConfig
from quickdraft.models.native.gguf_blocks import GROUP, FourBitBlocks, group_nibbles
from quickdraft.models.native.kernels import new_head_layer
from quickdraft.models.native.runner import MATRIX_FORMS
from quickdraft.models.native.weights import Linear


def four_bit_linear(weight: torch.Tensor) -> Linear:
    """W [out, in] -> 4-bit groups of 32 weights of a row, w = q * scale + min with q in 0..15 and scale and min
    float16 (GGUF's Q4_1: the min rounded down and the scale up, so the 16 steps still span the group), on
    quickdraft's 4-bit block kernel (float32 where in % 32 != 0)."""
    w = weight.detach().float()
    if w.shape[1] % GROUP:
        return Linear(w, None, int8=False)
    groups = w.view(w.shape[0], -1, GROUP)  # [out, in // 32, 32]
    mins = _half_toward(groups.amin(dim=-1), float("-inf"))  # [out, in // 32]
    scales = _half_toward((groups.amax(dim=-1) - mins) / 15.0, float("inf"))  # [out, in // 32]
    q = torch.round((groups - mins[..., None]) / scales.clamp(min=1e-30)[..., None]).clamp(0, 15).to(torch.uint8)
    nibbles = group_nibbles(q).reshape(w.shape[0], -1)  # [out, in // 2]
    return Linear(w, None, int8=False, blocks=FourBitBlocks(nibbles, scales, mins))


def _half_toward(x: torch.Tensor, limit: float) -> torch.Tensor:
    """x rounded to a float16 value, moved one step toward `limit` where rounding went the other way (as float32)."""
    half = x.half()
    wrong_side = half.float() < x if limit > 0 else half.float() > x
    return torch.where(wrong_side, torch.nextafter(half, torch.full_like(half, limit)), half).float()


class InferenceHead:
    """A `DraftHead`'s drafting calls (`fuse`, `step`, `draft_logits`) on its inference form; what the head drafter
    runs on a CPU."""

    def __init__(self, head: DraftHead) -> None:
        config, layer = head.config, head.layer
        attention, mlp = layer.self_attn, layer.mlp
        self.config: HeadConfig = config
        self.vocab_ids = head.vocab_ids  # [draft_vocab] target id of each draft logit
        self.embeddings = head.embeddings  # [target_vocab, d] the target's
        self._fc = four_bit_linear(head.fc.weight)
        norms = (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm, head.norm)
        self._layer = new_head_layer(
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.rms_norm_eps,
            layer.norm_before_residual,
            *(norm.weight.detach().float().contiguous() for norm in norms),
        )
        matrices = (
            torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]),
            attention.o_proj.weight,
            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            mlp.down_proj.weight,
            head.lm_head.weight,
        )
        for weight in matrices:
            linear = four_bit_linear(weight)
            self._layer.add_matrix(MATRIX_FORMS[linear.form], linear.weight, linear.out_features, linear.scales)
        self._inv_freq = attention.rotary.inv_freq  # [hd / 2]
        self._cos = self._sin_signed = torch.zeros(0, 1, config.head_dim)  # [capacity, 1, hd], grown on demand

    def fuse(self, target_states: torch.Tensor) -> torch.Tensor:
        """The target's states [n, 3 * target_hidden] -> the head's stream [n, d]."""
        return self._fc(target_states.float())

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer outputs [n, d] (or [d]) -> logits over the reduced vocabulary [n, draft_vocab] (or [draft_vocab])."""
        return self._layer.logits(out[None] if out.dim() == 1 else out).view(*out.shape[:-1], -1)

    def step(self, stream: torch.Tensor, next_tokens: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """Pairs at positions cache.length.. (stream [n, d], next_tokens [n]) -> the layer's outputs [n, d]."""
        start, n = cache.length, stream.shape[0]
        keys, values = cache.reserve(n, self.config.num_kv_heads, self.config.head_dim)  # [KV, capacity, hd] each
        if self._cos.shape[0] < start + n:
            self._rope_tables(keys.shape[1])
        out = self._layer.step(
            stream.float().contiguous(),
            self.embeddings[next_tokens].float(),
            keys,
            values,
            start,
            self._cos[start : start + n],
            self._sin_signed[start : start + n],
        )
        cache.length = start + n
        return out

    def _rope_tables(self, capacity: int) -> None:
        """cos and sign-folded sin [capacity, 1, hd] from the same float32 angles as the module's `Rotary`."""
        angles = torch.arange(capacity).float()[:, None] * self._inv_freq[None]  # [capacity, hd / 2]
        self._cos = torch.cat([angles, angles], -1).cos()[:, None].contiguous()
        self._sin_signed = torch.cat([-angles.sin(), angles.sin()], -1)[:, None].contiguous()


def inference_form(head: DraftHead) -> DraftHead | InferenceHead:
    """What the head drafter runs: `InferenceHead` on a CPU, the float module (in eval mode) elsewhere."""
    return InferenceHead(head) if head.embeddings.device.type == "cpu" else head.eval()
