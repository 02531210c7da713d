"""The head's int8 inference form: every matrix int8 with one scale per row, bfloat16 products.

Drafting one token reads every weight of the head once: the reduced-vocabulary output rows
(draft_vocab x d) dominate, then the layer's projections (and fc, once per committed position). In
float32 that traffic made a head step a large fraction of the target's one-token forward; the same
per-row int8 kernel the native runner uses (`_weight_int8pack_mm`, CPU only) reads a quarter of the bytes.
A head's card reports the measured ratio c (`quickdraft.distill.evaluation.cost_ratio`).
Norms, rotary and attention stay float32; only the matrix products change precision.

Exactness does not depend on this: the verifier checks every draft token against the target, and
sampled drafts carry the distribution they were drawn from. Precision only moves acceptance,
which `tests/test_head.py` compares between the two forms.
"""

import torch
from torch import nn

from quickdraft.drafters.head.model import DraftHead
from quickdraft.models.native.weights import Linear

COMPUTE_DTYPE = torch.bfloat16  # activations into the int8 kernel


class Int8Linear(nn.Module):
    """y = x @ W.T with W int8 per row; x [..., in] float32 -> y [..., out] float32."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.linear = Linear(weight.detach().to(COMPUTE_DTYPE), None, int8=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(COMPUTE_DTYPE)  # [n, in]
        return self.linear(flat).float().reshape(*x.shape[:-1], -1)


def quantize_head(head: DraftHead) -> DraftHead:
    """Replace the head's matrices (fc, projections, MLP, output rows) by int8 ones, in place."""
    if head.embeddings.device.type != "cpu":
        return head
    for owner in list(head.modules()):
        for name, child in list(owner.named_children()):
            if isinstance(child, nn.Linear):
                setattr(owner, name, Int8Linear(child.weight))
    return head.eval()
