"""quickdraft's own CPU kernels (`models/native/kernels`): what they compute and the row contract.

The four-bit product is checked against an emulation of its arithmetic in float64 (activations quantized to
int8 per group of 32, exact integer dot products), against the exact float product within the bound that
activation rounding allows, and for the contract the runtime's exactness rests on: every output row is the
same bits whatever other rows share the call, however many threads run it.
"""

import pytest
import torch

from quickdraft.models.native.kernels import four_bit_matmul

GROUP = 32


def random_four_bit(outputs: int, width: int, seed: int):
    """(nibbles [N, K / 2] in the kernel's group layout, scales, offsets [N, K / 32], q [N, K] int) for random
    4-bit groups."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (outputs, width), generator=generator, dtype=torch.uint8)
    groups = q.view(outputs, width // GROUP, GROUP)
    nibbles = (groups[..., :16] | (groups[..., 16:] << 4)).reshape(outputs, width // 2).contiguous()
    scales = torch.rand(outputs, width // GROUP, generator=generator) * 0.02
    offsets = -8 * scales + torch.randn(outputs, width // GROUP, generator=generator) * 0.002
    return nibbles, scales, offsets, q


def dequantized(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    outputs, width = q.shape
    groups = q.double().view(outputs, width // GROUP, GROUP) * scales.double()[..., None] + offsets.double()[..., None]
    return groups.view(outputs, width)


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's int8 activations: (q [M, K] float64 integers, scale [M, K / 32] float64) per group of 32."""
    groups = x.float().view(x.shape[0], -1, GROUP)
    scale = groups.abs().amax(dim=-1) / 127.0  # float32, as the kernel divides
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(groups * inverse[..., None])  # half to even, as nearbyint
    return q.view(x.shape).double(), scale.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_four_bit_product_is_the_int8_activation_product_of_the_exact_weights(dtype):
    nibbles, scales, offsets, q = random_four_bit(70, 256, seed=1)
    x = torch.randn(9, 256).to(dtype)
    y = four_bit_matmul(x, nibbles, scales, offsets)
    assert y.dtype == dtype and y.shape == (9, 70)
    qx, x_scale = quantized_activations(x)
    emulated = (qx.view(9, -1, GROUP) * x_scale[..., None]).view(9, 256) @ dequantized(q, scales, offsets).T
    tolerance = 1e-5 if dtype == torch.float32 else 2**-8  # float32 sums in another order; the bfloat16 output
    assert torch.allclose(y.double(), emulated, rtol=tolerance, atol=tolerance * emulated.abs().max())
    exact = x.double() @ dequantized(q, scales, offsets).T
    # each activation moves by at most half its group's step: |error| <= sum |w| * step / 2, plus float rounding
    steps = x_scale.repeat_interleave(GROUP, dim=1)  # [M, K]
    bound = (steps / 2) @ dequantized(q, scales, offsets).abs().T
    assert ((y.double() - exact).abs() <= bound * 1.001 + tolerance * exact.abs().max()).all()
    assert not torch.allclose(y.double(), exact, rtol=1e-6, atol=0)  # the activations really are rounded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_four_bit_rows_are_the_same_bits_whatever_else_is_in_the_call(dtype):
    nibbles, scales, offsets, _ = random_four_bit(70, 512, seed=2)  # 70 columns: tiles of 4 and a remainder
    x = torch.randn(37, 512).to(dtype)
    together = four_bit_matmul(x, nibbles, scales, offsets)
    alone = torch.cat([four_bit_matmul(x[i : i + 1], nibbles, scales, offsets) for i in range(37)])
    assert torch.equal(together, alone)
    generator = torch.Generator().manual_seed(3)
    for _ in range(10):
        rows = torch.randperm(37, generator=generator)[: int(torch.randint(1, 37, (1,), generator=generator))]
        assert torch.equal(four_bit_matmul(x[rows], nibbles, scales, offsets), together[rows])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(four_bit_matmul(x, nibbles, scales, offsets), together)
    finally:
        torch.set_num_threads(threads)


def test_four_bit_product_refuses_shapes_it_cannot_compute():
    nibbles, scales, offsets, _ = random_four_bit(8, 64, seed=4)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        four_bit_matmul(torch.randn(2, 48), nibbles[:, :24].contiguous(), scales, offsets)
    with pytest.raises(RuntimeError, match=r"nibbles must be \[N, K / 2\]"):
        four_bit_matmul(torch.randn(2, 96), nibbles, scales, offsets)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        four_bit_matmul(torch.randn(2, 64).half(), nibbles, scales, offsets)
