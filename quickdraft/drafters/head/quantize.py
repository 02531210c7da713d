"""The head's inference form: every matrix int8 in groups of 32 weights with a float32 scale each, multiplied by
quickdraft's own 8-bit group kernel (`kernels.eight_bit_matmul`, the one the native runtime runs a GGUF's Q8_0
matrices on).

Drafting one token reads every weight of the head once: the reduced-vocabulary output rows
(draft_vocab x d) dominate, then the layer's projections (and fc, once per committed position). In
float32 that traffic made a head step a large fraction of the target's one-token forward; int8 groups read a
quarter of the bytes, and the group kernel takes the float32 activations as they are (int8 activations per group
of 32, as for the target's blocks). At smollm2's head shapes its products take half the time torch's per-row int8
kernel took (`docs/native_runtime.md`). A head's card reports the measured ratio c
(`quickdraft.distill.evaluation.cost_ratio`). Norms, rotary and attention stay float32; only the matrix products
change precision. A matrix whose width is not a multiple of 32 stays float32.

Exactness does not depend on this: the verifier checks every draft token against the target, and
sampled drafts carry the distribution they were drawn from. Precision only moves acceptance,
which `tests/test_head.py` compares between the two forms.
"""

import torch
from torch import nn

from quickdraft.drafters.head.model import DraftHead
from quickdraft.models.native.gguf_blocks import GROUP, EightBitBlocks
from quickdraft.models.native.weights import Linear


class GroupLinear(nn.Module):
    """y = x @ W.T with W int8 in groups of 32 weights of a row, a float32 scale each; x [..., in] float32 ->
    y [..., out] float32."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        w = weight.detach().float()
        groups = w.view(w.shape[0], -1, GROUP)  # [out, in // 32, 32]
        scales = groups.abs().amax(dim=-1) / 127.0  # [out, in // 32]
        values = torch.round(groups / scales.clamp(min=1e-30)[..., None]).clamp(-127, 127).to(torch.int8)
        self.linear = Linear(w, None, int8=False, blocks=EightBitBlocks(values.view(w.shape), scales))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()  # [n, in]
        return self.linear(flat).reshape(*x.shape[:-1], -1)


def quantize_head(head: DraftHead) -> DraftHead:
    """Replace the head's matrices (fc, projections, MLP, output rows) by int8 group ones, in place (on CPU)."""
    if head.embeddings.device.type != "cpu":
        return head
    for owner in list(head.modules()):
        for name, child in list(owner.named_children()):
            if isinstance(child, nn.Linear) and child.in_features % GROUP == 0:
                setattr(owner, name, GroupLinear(child.weight))
    return head.eval()
