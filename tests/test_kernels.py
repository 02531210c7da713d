"""quickdraft's own CPU kernels (`models/native/kernels`): what they compute and the row contract.

Each block product (4-bit groups with a scale and an offset, or int8 groups with a scale, in panels of 8 rows) is
checked against an
emulation of its arithmetic in float64 (activations quantized to int8 per group of 32, exact integer dot
products), against the exact float product within the bound that activation rounding allows, and for the
contract the runtime's exactness rests on: every output row is the same bits whatever other rows share the call,
however many threads run it. The attention kernel is checked against torch's softmax attention and for the same
contract.
"""

import hashlib
from functools import partial

import pytest
import torch

from quickdraft.categorical import DRAW_BLOCK, inverse_cdf_in_torch
from quickdraft.models.native.kernels import (
    argmax,
    argmax_each,
    attend,
    built_instruction_set,
    eight_bit_matmul,
    four_bit_matmul,
    kernels,
    pack_eight_bit,
    pack_four_bit,
    rms_norm,
    rope,
    silu_mul,
)

GROUP = 32
KINDS = (
    "four_bit",
    "eight_bit",
    "four_bit_half_scales",
    "eight_bit_half_scales",
    "eight_bit_per_16",
)


def random_matrix(kind: str, outputs: int, width: int, seed: int):
    """(product: x -> x @ W.T through the kernel, W [N, K] float64) for random weight groups of `kind`:
    "four_bit" (nibbles in the file's group layout, a scale and an offset per 32) or "eight_bit" (int8 in
    -127..127, a scale per 32); "_half_scales": every scale (and offset) a float16 value, which the packing then
    stores as float16; "eight_bit_per_16": a scale per 16 weights (Q6_K's)."""
    generator = torch.Generator().manual_seed(seed)
    group = 16 if kind.endswith("_per_16") else GROUP
    scales = torch.rand(outputs, width // group, generator=generator) * 0.02
    if kind.endswith("_half_scales"):
        scales = scales.half().float()
    if kind.startswith("eight_bit"):
        values = torch.randint(-127, 128, (outputs, width), generator=generator, dtype=torch.int8)
        weight = values.double().view(outputs, -1, group) * scales.double()[..., None]
        packed = pack_eight_bit(values, scales)
        return partial(eight_bit_matmul, packed=packed, outputs=outputs), weight.view(outputs, width)
    q = torch.randint(0, 16, (outputs, width), generator=generator, dtype=torch.uint8)
    groups = q.view(outputs, width // GROUP, GROUP)
    offsets = -8 * scales + torch.randn(outputs, width // GROUP, generator=generator) * 0.002
    if kind.endswith("_half_scales"):
        offsets = offsets.half().float()
    weight = groups.double() * scales.double()[..., None] + offsets.double()[..., None]
    packed = pack_four_bit(q, scales, offsets)
    return partial(four_bit_matmul, packed=packed, outputs=outputs), weight.view(outputs, width)


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's int8 activations: (q [M, K] float64 integers, scale [M, K / 32] float64) per group of 32."""
    groups = x.float().view(x.shape[0], -1, GROUP)
    scale = groups.abs().amax(dim=-1) / 127.0  # float32, as the kernel divides
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(groups * inverse[..., None])  # half to even, as nearbyint
    return q.view(x.shape).double(), scale.double()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_product_is_the_int8_activation_product_of_the_exact_weights(kind, dtype):
    product, weight = random_matrix(kind, 70, 256, seed=1)
    x = torch.randn(9, 256).to(dtype)
    y = product(x)
    assert y.dtype == dtype and y.shape == (9, 70)
    qx, x_scale = quantized_activations(x)
    emulated = (qx.view(9, -1, GROUP) * x_scale[..., None]).view(9, 256) @ weight.T
    tolerance = 1e-5 if dtype == torch.float32 else 2**-8  # float32 sums in another order; the bfloat16 output
    assert torch.allclose(y.double(), emulated, rtol=tolerance, atol=tolerance * emulated.abs().max())
    exact = x.double() @ weight.T
    # each activation moves by at most half its group's step: |error| <= sum |w| * step / 2, plus float rounding
    bound = (x_scale.repeat_interleave(GROUP, dim=1) / 2) @ weight.abs().T
    assert ((y.double() - exact).abs() <= bound * 1.001 + tolerance * exact.abs().max()).all()
    assert not torch.allclose(y.double(), exact, rtol=1e-6, atol=0)  # the activations really are rounded


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("outputs", [70, 78])  # 9 panels, the last of 6 columns alone; 10, the last in a pair
def test_block_product_rows_are_the_same_bits_whatever_else_is_in_the_call(kind, dtype, outputs):
    """A row is the same bits alone, among 1..39 others (on AVX-512 VNNI, 4 rows or more take panels in pairs, 6 or
    more on Zen 4, every row count on Intel (`pair_rows`), and an 8-bit product of up to 8 rows takes them in one
    pass, of more in passes of 4) and on 1 thread."""
    product, _ = random_matrix(kind, outputs, 512, seed=2)
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(4)).to(dtype)
    together = product(x)
    assert torch.equal(together, torch.cat([product(x[i : i + 1]) for i in range(40)]))
    generator = torch.Generator().manual_seed(3)
    for count in [*torch.randint(1, 32, (6,), generator=generator).tolist(), *range(2, 10), *range(32, 40)]:
        rows = torch.randperm(40, generator=generator)[:count]
        assert torch.equal(product(x[rows]), together[rows])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(product(x), together)
    finally:
        torch.set_num_threads(threads)


# sha256 (first 16 hex digits) of `test_block_products_are_the_same_bits_on_every_instruction_set`'s outputs, taken
# on one machine with every instruction set it runs (QUICKDRAFT_KERNELS_ISA=avx512vnni, avxvnni, avx2, portable):
# all four gave these.
PRODUCT_DIGESTS = {
    ("four_bit", torch.float32): "35afa60dc74073ca",
    ("four_bit", torch.bfloat16): "6c2dac649b24522b",
    ("eight_bit", torch.float32): "814e0e7d1f65b0d2",
    ("eight_bit", torch.bfloat16): "94d00d6036f6673f",
    ("four_bit_half_scales", torch.float32): "6a458e4027e486aa",
    ("four_bit_half_scales", torch.bfloat16): "6ee585f7578bd7cd",
    ("eight_bit_half_scales", torch.float32): "0b088820277f4121",
    ("eight_bit_half_scales", torch.bfloat16): "0c89873b12203f27",
    ("eight_bit_per_16", torch.float32): "417842ba9e15bf2f",
    ("eight_bit_per_16", torch.bfloat16): "e6295dba369e9cc0",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_products_are_the_same_bits_on_every_instruction_set(kind, dtype):
    """Whichever instruction set this machine built (VNNI's byte dot products, AVX2's pairwise multiply-adds or the
    portable loops), a product is the bits recorded above: the integer group sums are exact either way and every
    float step is the same operation in the same order. So a model's outputs do not depend on the CPU it runs on."""
    product, _ = random_matrix(kind, 70, 256, seed=5)
    x = (torch.randn(40, 256, generator=torch.Generator().manual_seed(6)) * 4).to(dtype)
    digest = hashlib.sha256()
    for rows in (1, 4, 9, 40):  # 40: panels in pairs on AVX-512 VNNI
        digest.update(product(x[:rows]).contiguous().view(torch.uint8).numpy().tobytes())
    assert digest.hexdigest()[:16] == PRODUCT_DIGESTS[kind, dtype], f"instruction set {built_instruction_set()}"


def test_an_instruction_set_the_cpu_cannot_run_is_refused_in_one_line_and_an_empty_one_is_unset(monkeypatch):
    from quickdraft.errors import ModelError
    from quickdraft.models.native.kernels import instruction_sets

    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "avx9000")
    with pytest.raises(
        ModelError, match=r"^QUICKDRAFT_KERNELS_ISA=avx9000 is not one this CPU runs; use one of .*portable$"
    ):
        instruction_sets()
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "portable")
    assert instruction_sets() == ("portable",)
    monkeypatch.delenv("QUICKDRAFT_KERNELS_ISA")
    unset = instruction_sets()
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "")  # set but empty (`QUICKDRAFT_KERNELS_ISA= cmd`): as if unset
    assert instruction_sets() == unset


def test_panel_pairs_from_1_row_on_intel_6_on_zen_4_and_4_elsewhere(tmp_path):
    """Zen 4 runs each 512-bit instruction as two 256-bit halves, and pairs pay there only from 6 rows; on an Intel
    Xeon they pay from a single row (blocks.cpp's kPairRows comes from `pair_rows`; the bits are the same either
    way, which the tests above check)."""
    from quickdraft.models.native.kernels import cpu_fields, pair_rows

    cpuinfo = tmp_path / "cpuinfo"
    block = "processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nflags\t\t: fpu avx2 avx512f\n\n"
    cpuinfo.write_text(block.format(n=0, vendor="AuthenticAMD", family=25) + block.format(n=1, vendor="X", family=6))
    fields = cpu_fields(cpuinfo)
    assert fields["vendor_id"] == "AuthenticAMD" and fields["flags"] == "fpu avx2 avx512f"  # the first processor's
    assert pair_rows(fields) == 6
    assert pair_rows({**fields, "cpu family": "26"}) == 4  # Zen 5: 512-bit instructions at full width
    assert pair_rows({"vendor_id": "GenuineIntel", "cpu family": "6"}) == 1
    assert cpu_fields(tmp_path / "missing") == {} and pair_rows({}) == 4


def test_block_products_refuse_shapes_they_cannot_compute():
    product, _ = random_matrix("four_bit", 8, 64, seed=4)
    packed = product.keywords["packed"]
    with pytest.raises(RuntimeError, match="multiple of 32"):
        four_bit_matmul(torch.randn(2, 48), packed, 8)
    shape = r"packed weights must be \[ceil\(N / 8\), K / 32, 160 or 192\]"
    with pytest.raises(RuntimeError, match=shape):
        four_bit_matmul(torch.randn(2, 96), packed, 8)
    with pytest.raises(RuntimeError, match=shape):
        four_bit_matmul(torch.randn(2, 64), packed, 9)
    with pytest.raises(RuntimeError, match=shape):
        four_bit_matmul(torch.randn(2, 64), pack_eight_bit(torch.ones(8, 64, dtype=torch.int8), torch.ones(8, 2)), 8)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        four_bit_matmul(torch.randn(2, 64).half(), packed, 8)
    with pytest.raises(RuntimeError, match="contiguous uint8"):
        eight_bit_matmul(torch.randn(2, 64), torch.zeros(2, 2, 144, dtype=torch.int8), 8)
    with pytest.raises(RuntimeError, match=r"\[ceil\(N / 8\), K / 32, 272, 288 or 320\]"):
        eight_bit_matmul(torch.randn(2, 64), packed, 8)  # 4-bit panels are not 8-bit panels


@pytest.mark.parametrize("half", [True, False])
def test_four_bit_panels_hold_four_consecutive_weights_of_eight_rows_per_nibble_quad(half):
    """`pack_four_bit` puts weight 4v + i of row 8p + c's group g in panel p, group g, byte 32v + 4c + i's low
    nibble and weight 4v + 16 + i in its high nibble; then the 8 rows' scales, then their offsets, as float16 when
    every one is a float16 value, else float32; rows past N are zeros."""
    rows, width = 11, 64
    weights = torch.arange(rows * width, dtype=torch.int32).remainder(16).to(torch.uint8).view(rows, 2, 32)
    weights = weights.roll(1, dims=0) ^ torch.arange(rows, dtype=torch.uint8)[:, None, None] % 16  # no two rows alike
    scales = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) / (8 if half else 7)
    offsets = -scales / (4 if half else 3)
    packed = pack_four_bit(weights.view(rows, width), scales, offsets)
    dtype = torch.float16 if half else torch.float32
    width_scales = 8 * dtype.itemsize  # bytes of a panel's 8 scales
    assert packed.shape == (2, 2, 128 + 2 * width_scales) and packed.dtype == torch.uint8
    for row in range(16):
        panel, slot = divmod(row, 8)
        for group in range(2):
            block = packed[panel, group]
            vectors = block[:128].view(4, 8, 4)[:, slot]  # [v, i] of this row
            got = torch.cat([vectors & 0x0F, vectors >> 4]).reshape(32)  # weights 0..15, then 16..31
            got_scale, got_offset = (
                block[128 + i * width_scales : 128 + (i + 1) * width_scales].view(dtype)[slot].float() for i in (0, 1)
            )
            if row < rows:
                assert torch.equal(got, weights[row, group])
                assert got_scale == scales[row, group] and got_offset == offsets[row, group]
            else:
                assert not got.any() and got_scale == 0 and got_offset == 0
    assert pack_four_bit(weights.view(rows, width), scales, offsets, torch.float32).shape == (2, 2, 192)
    if not half:
        with pytest.raises(ValueError, match="cannot be carried exactly"):
            pack_four_bit(weights.view(rows, width), scales, offsets, torch.float16)


@pytest.mark.parametrize("scale_kind", ["float16", "float32", "per_16"])
def test_eight_bit_panels_hold_four_consecutive_weights_of_eight_rows_per_quad(scale_kind):
    """`pack_eight_bit` puts weight 4v + i of row 8p + c's group g in panel p, group g, byte 32v + 4c + i; then the 8
    rows' scales (float16 when every one is a float16 value, else float32), or with scales [N, K / 16] the 8 rows'
    float32 scales of weights 0-15, then their 8 of weights 16-31; rows past N are zeros."""
    rows, width = 11, 64
    values = torch.arange(rows * width, dtype=torch.int32).remainder(255).sub(127).to(torch.int8).view(rows, width)
    values = values.roll(3, dims=0)  # no two rows alike
    per_group = 2 if scale_kind == "per_16" else 1
    scales = torch.arange(rows * 2 * per_group, dtype=torch.float32).view(rows, -1) / (
        8 if scale_kind == "float16" else 3
    )
    dtype = torch.float16 if scale_kind == "float16" else torch.float32
    packed = pack_eight_bit(values, scales)
    assert packed.shape == (2, 2, 256 + 8 * per_group * dtype.itemsize) and packed.dtype == torch.uint8
    for row in range(16):
        panel, slot = divmod(row, 8)
        for group in range(2):
            block = packed[panel, group]
            got_values = block[:256].view(8, 8, 4)[:, slot].reshape(32).view(torch.int8)
            got_scales = block[256:].view(dtype).view(per_group, 8)[:, slot].float()
            if row < rows:
                assert torch.equal(got_values, values[row, 32 * group : 32 * group + 32])
                assert torch.equal(got_scales, scales[row, per_group * group : per_group * (group + 1)])
            else:
                assert not got_values.any() and not got_scales.any()
    if scale_kind != "float16":
        with pytest.raises(ValueError, match="carried as float32|cannot be carried exactly"):
            pack_eight_bit(values, scales, torch.float16)


def reference_attention(queries, keys, values, sequence, begin, end, scale) -> torch.Tensor:
    """torch's softmax attention, one row at a time, in float64."""
    rows, heads, head_dim = queries.shape
    out = []
    for r in range(rows):
        k = keys[sequence[r]][:, begin[r] : end[r]].double()  # [KV, L, hd]
        v = values[sequence[r]][:, begin[r] : end[r]].double()
        q = queries[r].double().view(k.shape[0], -1, head_dim) * scale  # [KV, G, hd]
        out.append((torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v).reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_rows_follow_softmax_attention_and_never_depend_on_the_other_rows(dtype):
    generator = torch.Generator().manual_seed(5)
    kv_heads, heads, head_dim, capacity = 2, 6, 64, 80
    keys = [torch.randn(kv_heads, capacity, head_dim, generator=generator).to(dtype) for _ in range(3)]
    values = [torch.randn(kv_heads, capacity, head_dim, generator=generator).to(dtype) for _ in range(3)]
    queries = torch.randn(12, heads, head_dim, generator=generator).to(dtype)
    sequence = torch.randint(0, 3, (12,), generator=generator)
    begin = torch.randint(0, 40, (12,), generator=generator)
    end = begin + torch.randint(1, 41, (12,), generator=generator)  # spans of 1..40 keys: vector tails included
    out = attend(queries, keys, values, sequence, begin, end, 0.125)
    assert out.dtype == dtype and out.shape == (12, heads * head_dim)
    expected = reference_attention(queries, keys, values, sequence, begin, end, 0.125)
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7  # the bfloat16 output's rounding
    assert torch.allclose(out.double(), expected, rtol=tolerance, atol=tolerance)
    alone = [
        attend(queries[r : r + 1], keys, values, sequence[r : r + 1], begin[r : r + 1], end[r : r + 1], 0.125)
        for r in range(12)
    ]
    assert torch.equal(torch.cat(alone), out)
    assert attend(queries[:0], keys, values, sequence[:0], begin[:0], end[:0], 0.125).shape == (0, heads * head_dim)
    with pytest.raises(RuntimeError, match="empty or outside span"):
        attend(queries[:1], keys, values, sequence[:1], torch.tensor([5]), torch.tensor([5]), 0.125)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 72, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_verification_rows_is_each_rows_own_whatever_block_or_thread_count(dtype, head_dim, kv_heads):
    """Consecutive rows of one sequence (a verification: consecutive positions, under a sliding window here, so
    every row begins elsewhere) share the kernel's work items; each row must still get what it gets alone, with 1
    to 3 threads (which change the items' sizes, and split a lone row's query heads into parts where it has fewer key
    heads than threads), over one key head or two, and follow softmax attention. Three query heads a key head: a
    pass over the values that takes 2 or 4 queries (AVX2, AVX-512) then always reaches into the next row's."""
    generator = torch.Generator().manual_seed(9)
    heads, capacity, window = 3 * kv_heads, 120, 37
    keys = [torch.randn(kv_heads, capacity, head_dim, generator=generator).to(dtype) for _ in range(2)]
    values = [torch.randn(kv_heads, capacity, head_dim, generator=generator).to(dtype) for _ in range(2)]
    starts, counts = (60, 91), (7, 5)  # sequence s: rows at positions starts[s] .. starts[s] + counts[s] - 1
    positions = [p for s in range(2) for p in range(starts[s], starts[s] + counts[s])]
    sequence = torch.tensor([s for s in range(2) for _ in range(counts[s])])
    end = torch.tensor([p + 1 for p in positions])
    begin = torch.tensor([max(0, p + 1 - window) for p in positions])
    rows = len(positions)
    queries = torch.randn(rows, heads, head_dim, generator=generator).to(dtype)
    expected = reference_attention(queries, keys, values, sequence, begin, end, 0.1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        alone = torch.cat(
            [
                attend(queries[r : r + 1], keys, values, sequence[r : r + 1], begin[r : r + 1], end[r : r + 1], 0.1)
                for r in range(rows)
            ]
        )
        tolerance = 1e-5 if dtype == torch.float32 else 2**-7
        assert torch.allclose(alone.double(), expected, rtol=tolerance, atol=tolerance)
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            assert torch.equal(attend(queries, keys, values, sequence, begin, end, 0.1), alone)
            assert torch.equal(attend(queries[:1], keys, values, sequence[:1], begin[:1], end[:1], 0.1), alone[:1])
            first = slice(0, counts[0])
            together = attend(queries[first], keys, values, sequence[first], begin[first], end[first], 0.1)
            assert torch.equal(together, alone[first])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("shape", [(3, 64), (1, 72), (1, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_a_prompt_blocks_rows_is_each_rows_own(dtype, shape):
    """A prompt block's rows (causal, one sequence) fill work items of many queries, which an AVX-512 build scores
    from key blocks turned on their side and weighs from values widened a chunk at a time: each row must still get
    the bits it gets alone, over spans that cross those blocks and chunks (150 to 213 keys, then 40 under a window
    whose start moves with the row) and a head size 8 past a multiple of 16, and follow softmax attention."""
    kv_heads, head_dim = shape
    generator = torch.Generator().manual_seed(13)
    heads, start, rows = 3 * kv_heads, 149, 128
    keys = [torch.randn(kv_heads, 300, head_dim, generator=generator).to(dtype)]
    values = [torch.randn(kv_heads, 300, head_dim, generator=generator).to(dtype)]
    queries = torch.randn(rows, heads, head_dim, generator=generator).to(dtype)
    sequence = torch.zeros(rows, dtype=torch.long)
    end = torch.arange(start + 1, start + rows + 1)
    begin = torch.where(torch.arange(rows) < 64, 0, end - 40)  # the last 64 rows under a 40-key window
    together = attend(queries, keys, values, sequence, begin, end, 0.125)
    alone = [
        attend(queries[r : r + 1], keys, values, sequence[r : r + 1], begin[r : r + 1], end[r : r + 1], 0.125)
        for r in range(rows)
    ]
    assert torch.equal(together, torch.cat(alone))
    expected = reference_attention(queries, keys, values, sequence, begin, end, 0.125)
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7
    assert torch.allclose(together.double(), expected, rtol=tolerance, atol=tolerance)


# sha256 (first 16 hex digits) of `test_attention_is_the_same_bits_on_every_vector_instruction_set`'s outputs, taken
# on one machine with every instruction set it runs: the vector builds (avx512vnni, avxvnni, avx2) all gave the
# first, the portable loops (each query's sums in one lane, in another order) the second.
ATTENTION_DIGESTS = {
    (torch.float32, "vector"): "1408130927670478",
    (torch.bfloat16, "vector"): "b0e8d4bb518c4512",
    (torch.float32, "portable"): "5d474cb74832a6c9",
    (torch.bfloat16, "portable"): "fb9161fde3743476",
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_is_the_same_bits_on_every_vector_instruction_set(dtype):
    """Whichever vector instruction set this machine built, attention is the bits recorded above: wider vectors
    carry more lanes in one instruction, but every lane does the same operations in the same order (scores over
    head_dim in 16 lanes, folded to 8, then a fixed reduction; each value lane in position order, whichever queries
    share its pass). So a greedy text does not depend on the CPU.
    Decode rows of 3 sequences and a verification's 5 rows under a window; head sizes 64, 72 (a tail of 8 lanes)
    and 256; spans of 1 to 300 positions."""
    generator = torch.Generator().manual_seed(11)
    digest = hashlib.sha256()
    for head_dim in (64, 72, 256):
        keys = [torch.randn(3, 320, head_dim, generator=generator).to(dtype) for _ in range(3)]
        values = [torch.randn(3, 320, head_dim, generator=generator).to(dtype) for _ in range(3)]
        queries = torch.randn(8, 9, head_dim, generator=generator).to(dtype)
        sequence = torch.tensor([0, 1, 2, 2, 2, 2, 2, 2])
        end = torch.tensor([1, 300, 290, 291, 292, 293, 294, 295])
        begin = torch.tensor([0, 0, 250, 251, 252, 253, 254, 255])
        digest.update(attend(queries, keys, values, sequence, begin, end, 0.125).view(torch.uint8).numpy().tobytes())
    family = "portable" if built_instruction_set() == "portable" else "vector"
    assert digest.hexdigest()[:16] == ATTENTION_DIGESTS[dtype, family], f"instruction set {built_instruction_set()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_is_torchs_first_maximum_with_ties_nans_and_signed_zeros(dtype):
    """The kernel's argmax is torch's on every row: the first index of the maximum, wherever it falls (in a vector
    pass or the tail past the last whole vector, ties between and within vectors), a NaN larger than any number
    (the first NaN wins), -0 and +0 equal, rows of -inf; over widths around the vector sizes and a vocabulary's; and
    `argmax_each` over several such tensors' rows in one call gives each tensor's."""
    built_instruction_set()
    generator = torch.Generator().manual_seed(8)
    tensors = []
    for width in (1, 7, 8, 31, 32, 33, 100, 49152):
        x = torch.randn(12, width, generator=generator).to(dtype)
        top = x.max()
        ties = ([0], [width - 1], [width // 2, width - 1], [width - 1, 0], [width // 3, min(width // 3 + 1, width - 1)])
        for row, places in enumerate(ties):
            for place in places:
                x[row, place] = top + 1  # a tie where there are two places: the first must win
        x[5, width - 1] = float("nan")
        x[6, width // 2] = float("nan")
        x[6, width - 1] = float("nan")
        x[7] = float("-inf")
        x[8] = 0.0
        x[8, width - 1] = -0.0
        x[9] = -0.0
        x[9, width - 1] = 0.0
        assert torch.equal(argmax(x), x.argmax(dim=-1)), f"width {width}"
        tensors.append(x)
    assert argmax(x[0]).shape == () and argmax(x[:3].view(3, 1, -1)).shape == (3, 1)
    pieces = [tensors[0][:1], tensors[3][2:9], tensors[7], tensors[7][:1], tensors[2][4:6]]  # widths and counts mixed
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):  # the rows spread over the threads
            torch.set_num_threads(count)
            assert argmax_each(pieces) == [piece.argmax(dim=-1).tolist() for piece in pieces]
    finally:
        torch.set_num_threads(threads)
    assert argmax_each([]) == []


def test_the_draw_kernel_picks_the_tokens_the_torch_computation_picks():
    """`torch.ops.quickdraft.draw` and `categorical.inverse_cdf_in_torch` are one rule: the same token for every row
    and uniform number, over vocabularies of one token, a short last block and whole blocks; rows not normalised,
    with zeros scattered and whole blocks of zeros; uniforms at 0, just below 1, and at the blocks' running totals
    (where the block and the rest within it are decided by the last bit). Never a zero-probability token."""
    draw = kernels().draw
    generator = torch.Generator().manual_seed(12)
    for vocab in (1, 7, DRAW_BLOCK, DRAW_BLOCK + 1, 9 * DRAW_BLOCK - 3, 49152):
        probs = torch.rand(8, vocab, generator=generator) * torch.rand(8, 1, generator=generator) * 3  # [8, vocab]
        probs[1] *= torch.rand(vocab, generator=generator) < 0.2
        probs[2, : vocab // 2] = 0.0
        probs[3] = torch.softmax(torch.randn(vocab, generator=generator) * 8, dim=-1)
        probs[:, -1] += 1e-30  # every row some mass, the last token little of it
        blocks = -(-vocab // DRAW_BLOCK)
        padded = torch.nn.functional.pad(probs.double(), (0, blocks * DRAW_BLOCK - vocab))
        running = padded.view(8, blocks, DRAW_BLOCK).cumsum(-1)[..., -1].cumsum(-1)  # [8, blocks]
        at_totals = running.gather(1, torch.randint(0, blocks, (8, 1), generator=generator))[:, 0] / running[:, -1]
        for uniform in (
            torch.rand(8, generator=generator, dtype=torch.float64),
            torch.zeros(8, dtype=torch.float64),
            torch.full((8,), 1.0 - 2**-53, dtype=torch.float64),
            at_totals.clamp(max=1.0 - 2**-53),
        ):
            drawn = draw(probs, uniform, DRAW_BLOCK)
            assert torch.equal(drawn, inverse_cdf_in_torch(probs, uniform)), f"vocab {vocab}"
            assert bool((probs.gather(1, drawn[:, None]) > 0).all()), f"vocab {vocab}: a zero-probability token"


def test_the_softmax_kernel_follows_torch_gives_removed_tokens_nothing_and_keeps_rows_apart():
    """`torch.ops.quickdraft.softmax(x, t)` is softmax(x / t) within float32 rounding (its own exponential), exactly
    0 where x is -inf (a token top-k or top-p removed; the exponential alone clamps there), the same for bfloat16
    logits as for their float32 values, and each row is the same bits alone as beside other rows; over widths
    around the vector sizes and a vocabulary's."""
    softmax = kernels().softmax
    generator = torch.Generator().manual_seed(13)
    for width in (1, 7, 8, 17, 4099, 49152):
        x = torch.randn(6, width, generator=generator) * 6  # [6, width]
        x[1, torch.rand(width, generator=generator) < 0.5] = float("-inf")
        x[1, width // 2] = 3.0  # one kept token at least
        x[2, :-1] = float("-inf")
        for temperature in (0.3, 0.7, 1.0, 2.5):
            probs = softmax(x, temperature)
            expected = torch.softmax(x.double() / temperature, dim=-1)
            assert torch.allclose(probs.double(), expected, rtol=2e-5, atol=1e-9), f"width {width}, t {temperature}"
            assert bool((probs[x == float("-inf")] == 0).all()), f"width {width}: a removed token kept mass"
            assert all(torch.equal(probs[r], softmax(x[r : r + 1], temperature)[0]) for r in range(6))
            half = x.bfloat16()
            assert torch.equal(softmax(half, temperature), softmax(half.float(), temperature))
    broken = torch.randn(1, 41, generator=generator)  # [1, 41]: NaNs in a 16-wide pass, an 8-wide one and the tail
    broken[0, [3, 35, 40]] = float("nan")
    probs = softmax(broken, 0.7)[0]
    assert bool(probs.isfinite().all()) and probs[3] == probs[35] == probs[40] > 0, "a NaN logit depends on its place"


def test_the_draw_kernel_refuses_a_row_without_probability():
    with pytest.raises(RuntimeError, match="no positive probability"):
        kernels().draw(torch.zeros(1, 300), torch.zeros(1, dtype=torch.float64), DRAW_BLOCK)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_rows_follow_torch_and_never_depend_on_the_other_rows(dtype):
    generator = torch.Generator().manual_seed(6)
    x = (torch.randn(7, 3, 96, generator=generator) * 4).to(dtype)
    weight = torch.randn(96, generator=generator).to(dtype)
    for w in (weight, None):
        out = rms_norm(x, w, 1e-6)
        expected = torch.nn.functional.rms_norm(x.double(), (96,), None if w is None else w.double(), 1e-6)
        tolerance = 1e-6 if dtype == torch.float32 else 2**-8  # the output's rounding
        assert out.dtype == dtype and torch.allclose(out.double(), expected, rtol=tolerance, atol=tolerance)
        assert torch.equal(torch.cat([rms_norm(x[i : i + 1], w, 1e-6) for i in range(7)]), out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_silu_rows_follow_torch_and_never_depend_on_the_other_rows(dtype):
    generator = torch.Generator().manual_seed(8)
    qkv = torch.randn(6, 5 * 64 + 64, generator=generator).to(dtype)  # rows wider than the heads rotated
    x = qkv[:, : 5 * 64].view(6, 5, 64)  # [N, heads, hd], rows 384 apart: as the runner's queries|keys view
    angles = torch.rand(6, 1, 32, generator=generator) * 6
    cos, sin = torch.cat((angles.cos(),) * 2, dim=-1), torch.cat((-angles.sin(), angles.sin()), dim=-1)
    out = rope(x, cos.to(dtype), sin.to(dtype))
    wide = x.double()
    expected = wide * cos.to(dtype).double() + torch.cat((wide[..., 32:], wide[..., :32]), -1) * sin.to(dtype).double()
    tolerance = 1e-6 if dtype == torch.float32 else 2**-8
    assert out.dtype == dtype and torch.allclose(out.double(), expected, rtol=tolerance, atol=tolerance)
    alone = [rope(x[i : i + 1], cos[i : i + 1].to(dtype), sin[i : i + 1].to(dtype)) for i in range(6)]
    assert torch.equal(torch.cat(alone), out)
    gate_up = (torch.randn(6, 2 * 100, generator=generator) * 8).to(dtype)  # 100: vector lanes and a tail
    product = silu_mul(gate_up)
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    assert product.dtype == dtype and torch.allclose(product.double(), expected, rtol=tolerance, atol=tolerance)
    assert torch.equal(torch.cat([silu_mul(gate_up[i : i + 1]) for i in range(6)]), product)


def test_a_machine_that_cannot_build_the_kernels_gets_a_clear_error(monkeypatch):
    import torch.utils.cpp_extension

    from quickdraft.errors import ModelError
    from quickdraft.models.native import kernels as kernels_module

    def no_compiler(**_):
        raise RuntimeError("Error building extension: g++: command not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    with pytest.raises(ModelError, match=r"need a C\+\+ compiler \(g\+\+\).*use --runtime hf"):
        kernels_module.built_instruction_set.__wrapped__()  # the build itself, past this process's cached one


def test_a_compiler_that_cannot_build_the_best_set_builds_the_next_one(monkeypatch, capsys):
    """An older compiler may not know a newer set's flags (GCC 10 has no -mavxvnni): the next set is built."""
    import torch.utils.cpp_extension

    from quickdraft.models.native import kernels as kernels_module

    monkeypatch.delenv("QUICKDRAFT_KERNELS_ISA", raising=False)
    monkeypatch.setattr(kernels_module, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx_vnni"}))
    names = []

    def old_compiler(name, extra_cflags, **_):
        names.append(name)
        if "-mavxvnni" in extra_cflags:
            raise RuntimeError("c++: error: unrecognized command-line option '-mavxvnni'")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", old_compiler)
    assert kernels_module.built_instruction_set.__wrapped__() == "avx2"
    assert names == ["quickdraft_blocks_avxvnni", "quickdraft_blocks_avx2"]
    assert "could not build the avxvnni kernels" in capsys.readouterr().err


def test_the_kernels_are_built_for_the_best_set_this_compiler_takes():
    """The fallback to the next instruction set is for compilers that do not know a set's flags. A compile error in
    the vector code must not hide behind it: every bit test would still pass on the portable loops. So the set built
    is the first one of `instruction_sets()` whose -m flags this machine's compiler accepts."""
    import os
    import shlex
    import subprocess

    from quickdraft.models.native.kernels import INSTRUCTION_SETS, built_instruction_set, instruction_sets

    compiler = shlex.split(os.environ.get("CXX", "c++"))

    def takes(name: str) -> bool:  # compiles and assembles a unit with the set's flags
        flags = [f"-m{flag}" for flag in INSTRUCTION_SETS[name][1]]
        unit = b"#include <immintrin.h>\nint main() { return 0; }\n"
        command = [*compiler, *flags, "-x", "c++", "-c", "-o", os.devnull, "-"]
        return subprocess.run(command, input=unit, capture_output=True).returncode == 0

    best = next(name for name in instruction_sets() if takes(name))
    assert built_instruction_set() == best, "QUICKDRAFT_KERNELS_VERBOSE=1 shows the compiler's complaint"
