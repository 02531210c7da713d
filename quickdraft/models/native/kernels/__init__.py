"""quickdraft's own CPU kernels (`blocks.cpp`, and the sampled draw in `draw.cpp`) and decoder layers
(`decoder.cpp`), compiled once per machine on first use.

`four_bit_matmul(x, packed, outputs)`: x [M, K] (float32 or bfloat16) times a matrix [N, K] of 4-bit groups
(weight = nibble * scale + offset, one scale and offset per 32 weights of a row), and
`eight_bit_matmul(x, packed, outputs)` of int8 groups (weight = value * scale, a scale per 32 weights or per 16),
the weights packed once (`pack_four_bit`, `pack_eight_bit`: panels of 8 rows) so that each thread
reads one sequential stream, computed as llama.cpp computes its block products: every activation row quantized to
int8 per group of 32, integer dot products per group, scaled and summed in float32 in group order. The contract
the runtime relies on: each output row is a function of its own input row only, bit for bit, whatever the row
count or thread count (so a k-token verification row equals a 1-token row, a batched row its solo row, and for
4-bit matrices a prompt row the decode row of the same input: one kernel serves every row count).

`argmax(x)`: each row's argmax, as torch's, in vector steps (the head drafter's greedy drafts call it);
`argmax_each(xs)` of several tensors' rows in one call, the rows spread over threads (the engine's greedy
verifications of a step).

`torch.ops.quickdraft.softmax(x, temperature)`: each row's softmax of x / temperature (`sampling.softmax` calls it
once the kernels are loaded), and `torch.ops.quickdraft.draw(probs, uniform, block)` (`draw.cpp`): a sampled token
per row, the same bits as `categorical.draw`'s torch computation, which calls it likewise.

`new_decoder(...)`: a `torch.classes.quickdraft.Decoder`, the runner's layers for a forward (verification rows, prompt
chunks, or both) in one call (runner.py fills it with the model's weights and says what it computes).
`new_head_layer(...)`: a `torch.classes.quickdraft.HeadLayer`, a draft head's drafting step in two calls
(drafters/head/inference.py).

Built with the machine's C++ compiler through `torch.utils.cpp_extension` (about a minute the first time; cached
under ~/.cache/torch_extensions). The build is named after the instruction set it targets, so a home directory
shared by machines with different CPUs never loads a build the CPU cannot run.
"""

import itertools
import os
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import torch

from quickdraft.errors import ModelError
from quickdraft.models.native.kernels import portable

SOURCES = [str(Path(__file__).with_name(name)) for name in ("blocks.cpp", "decoder.cpp", "draw.cpp")]
PANEL_ROWS = 8  # weight rows of a panel (`pack_four_bit`, `pack_eight_bit`): blocks.cpp's kColumns of each
# Each instruction set the kernels are built for: the /proc/cpuinfo flags it needs, and the compiler's -m flags.
_AVX2_FLAGS = ("avx2", "fma", "f16c")
INSTRUCTION_SETS = {
    "avx512vnni": (
        (*_AVX2_FLAGS, "avx512f", "avx512vl", "avx512_vnni"),
        (*_AVX2_FLAGS, "avx512f", "avx512vl", "avx512vnni"),
    ),
    "avxvnni": ((*_AVX2_FLAGS, "avx_vnni"), (*_AVX2_FLAGS, "avxvnni")),
    "avx2": (_AVX2_FLAGS, _AVX2_FLAGS),
    "portable": ((), ()),
}


def cpu_fields(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields in `cpuinfo` (vendor_id, cpu family, flags, ...; empty where it cannot be read)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        if not line.strip():  # the end of the first processor's block
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags /proc/cpuinfo lists for this CPU (empty where it cannot be read)."""
    return frozenset(cpu_fields().get("flags", "").split())


def pair_rows(fields: dict[str, str]) -> int:
    """Rows from which an AVX-512 build's products take two panels a pass (blocks.cpp's kPairRows), for the CPU of
    these /proc/cpuinfo `fields`: every row count on Intel's (a Xeon with AMX: a 1-token forward about 8% faster
    on smollm2 and 11-17% on gemma-3 than on single panels, 2 and 3 tokens likewise; stop 61); 6 on AMD's Zen 4
    (family 25 with AVX-512), which runs each 512-bit instruction as two 256-bit halves, so that a pair saves it no
    arithmetic and at 4 rows costs a 4-token forward about 8% more than single panels; 4 elsewhere (a Zen 5 EPYC,
    where pairs were slower at 2 and 3 rows; docs/native_runtime.md, stops 50, 57 and 61)."""
    if fields.get("vendor_id") == "GenuineIntel":
        return 1
    zen4 = fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
    return 6 if zen4 else 4


def instruction_sets() -> tuple[str, ...]:
    """The sets of INSTRUCTION_SETS whose flags the CPU has, best first: "avx512vnni" or "avxvnni" (AVX2 with byte
    dot products into 32-bit lanes), "avx2" (AVX2, FMA and F16C), "portable". QUICKDRAFT_KERNELS_ISA names the one
    to build instead (one this CPU runs), to compare the sets' bits on one machine; set but empty, it is unset."""
    flags = cpu_flags()
    runnable = tuple(name for name, (needs, _) in INSTRUCTION_SETS.items() if set(needs) <= flags)
    chosen = os.environ.get("QUICKDRAFT_KERNELS_ISA")
    if not chosen:  # `QUICKDRAFT_KERNELS_ISA= cmd`, as shells clear a variable for one command
        return runnable
    if chosen not in runnable:
        raise ModelError(f"QUICKDRAFT_KERNELS_ISA={chosen} is not one this CPU runs; use one of {', '.join(runnable)}")
    return (chosen,)


@cache
def built_instruction_set() -> str:
    """Builds and loads the kernels for the best of `instruction_sets()` the compiler takes (first call; an older
    compiler may not know a newer set's flags: the next set is tried, with a line on stderr) and returns its
    name. Raises ModelError with the compiler's complaint if none builds."""
    from torch.utils.cpp_extension import load

    candidates = instruction_sets()
    pair_rows_flag = f"-DQUICKDRAFT_PAIR_ROWS={pair_rows(cpu_fields())}"  # the same for every set tried
    failures = []
    for variant in candidates:
        try:
            load(
                name=f"quickdraft_blocks_{variant}",
                sources=SOURCES,
                extra_cflags=[
                    "-O3",
                    "-ffp-contract=off",
                    "-fopenmp",
                    pair_rows_flag,
                    *(f"-m{f}" for f in INSTRUCTION_SETS[variant][1]),
                ],
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=os.environ.get("QUICKDRAFT_KERNELS_VERBOSE") == "1",
            )
            return variant
        except (RuntimeError, OSError) as error:  # no compiler, no ninja, or a compile error
            failures.append(error)
            if variant != candidates[-1]:
                print(
                    f"quickdraft: could not build the {variant} kernels (QUICKDRAFT_KERNELS_VERBOSE=1 shows why); "
                    "trying the next instruction set",
                    file=sys.stderr,
                )
    raise ModelError(
        f"could not build quickdraft's CPU kernels ({failures[0]}); they need a C++ compiler (g++) and the Python "
        "headers; install them, or use --runtime hf (the transformers runner, slower)"
    ) from failures[0]


def kernels():
    """`torch.ops.quickdraft`, once the library is built and loaded (`built_instruction_set`)."""
    built_instruction_set()
    return torch.ops.quickdraft


def four_bit_matmul(x: torch.Tensor, packed: torch.Tensor, outputs: int) -> torch.Tensor:
    """x [M, K] @ weight.T -> [M, outputs] in x's dtype; packed: `pack_four_bit`'s panels of the weight."""
    return kernels().four_bit_matmul(x.contiguous(), packed, outputs)


def eight_bit_matmul(x: torch.Tensor, packed: torch.Tensor, outputs: int) -> torch.Tensor:
    """x [M, K] @ weight.T -> [M, outputs] in x's dtype; packed: `pack_eight_bit`'s panels of the weight. The same
    arithmetic and row contract as `four_bit_matmul`."""
    return kernels().eight_bit_matmul(x.contiguous(), packed, outputs)


def pack_four_bit(
    values: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, carrier: torch.dtype | None = None
) -> torch.Tensor:
    """A matrix of 4-bit groups as `four_bit_matmul` reads it: values [N, K] integers in 0..15 (a row's weights in
    order), scales and offsets [N, K // 32] -> uint8 [ceil(N / 8), K // 32, 160 or 192]. Per panel of 8 rows (zero
    rows past N) and group: 4 vectors of 32 bytes, vector v holding weights 4v..4v+3 of each of the 8 rows in its
    low nibbles and weights 4v+16..4v+19 in its high nibbles; then the 8 rows' scales, then their 8 offsets, as
    float16 where all of them are float16 values exactly, else as float32 (or as `carrier` says: float32 always
    can). One sequential stream per panel."""
    rows, groups = scales.shape
    weights = _tiles(values.to(torch.uint8).view(rows, groups, 32), PANEL_ROWS)  # [P, G, 8 rows, 32]
    quads = weights.view(*weights.shape[:3], 8, 4).transpose(2, 3)  # [P, G, 8 quads, 8 rows, 4]
    vectors = quads[:, :, :4] | (quads[:, :, 4:] << 4)  # [P, G, 4, 8 rows, 4]: quads v and v + 4 in one byte
    carrier = _scale_dtype(carrier, scales, offsets)
    per_row = (_tiles(factor.to(carrier)[..., None], PANEL_ROWS) for factor in (scales, offsets))  # [P, G, 8, 1]
    parts = (vectors, *per_row)
    return torch.cat([_bytes(part, weights.shape[0], groups) for part in parts], dim=2).contiguous()


def pack_eight_bit(values: torch.Tensor, scales: torch.Tensor, carrier: torch.dtype | None = None) -> torch.Tensor:
    """A matrix of int8 groups as `eight_bit_matmul` reads it: values [N, K] int8 in -127..127, scales [N, K // 32]
    -> uint8 [ceil(N / 8), K // 32, 272 or 288]. Per panel of 8 rows (zero rows past N) and group: 8 vectors of 32
    bytes, vector v holding weights 4v..4v+3 of each of the 8 rows; then the 8 rows' scales (float16 where all are
    float16 values exactly, else float32; or as `carrier` says). Scales [N, K // 16] (a scale per 16 weights, Q6_K's)
    -> [ceil(N / 8), K // 32, 320]: the 8 rows' scales of weights 0-15, then their 8 of weights 16-31, always
    float32. One sequential stream per panel."""
    rows = values.shape[0]
    weights = _tiles(values.view(rows, -1, 32), PANEL_ROWS)  # [P, G, 8 rows, 32]
    panels, groups = weights.shape[:2]
    vectors = weights.view(panels, groups, PANEL_ROWS, 8, 4).transpose(2, 3)  # [P, G, 8 quads, 8 rows, 4]
    if scales.shape[1] == 2 * groups:
        if carrier not in (None, torch.float32):
            raise ValueError(f"scales per 16 weights are carried as float32, not {carrier}")
        per_row = _tiles(scales.float().view(rows, groups, 2), PANEL_ROWS).transpose(2, 3)  # [P, G, 2 halves, 8]
    else:
        per_row = _tiles(scales.to(_scale_dtype(carrier, scales))[..., None], PANEL_ROWS)  # [P, G, 8, 1]
    return torch.cat([_bytes(part, panels, groups) for part in (vectors, per_row)], dim=2).contiguous()


def _scale_dtype(carrier: torch.dtype | None, *factors: torch.Tensor) -> torch.dtype:
    """float16 when every factor is a float16 value exactly (a GGUF's fp16 scales are), else float32: the kernels
    read fewer bytes, never other values. A `carrier` asked for must hold them exactly too."""
    exact = all(torch.equal(f.float().half().float(), f.float()) for f in factors)
    if carrier not in (None, torch.float16, torch.float32) or (carrier == torch.float16 and not exact):
        raise ValueError(f"scales cannot be carried exactly as {carrier}")
    return carrier or (torch.float16 if exact else torch.float32)


def _tiles(per_group: torch.Tensor, size: int) -> torch.Tensor:
    """[N, G, width] -> [ceil(N / size), G, size, width]: rows in tiles of `size` (zeros past N), group-major
    within a tile."""
    rows, groups, width = per_group.shape
    padded = torch.nn.functional.pad(per_group, (0, 0, 0, 0, 0, -rows % size))
    return padded.view(-1, size, groups, width).permute(0, 2, 1, 3)


def _bytes(part: torch.Tensor, tiles: int, groups: int) -> torch.Tensor:
    """[T, G, ...] of any dtype -> its bytes [T, G, bytes of the rest]."""
    return part.contiguous().view(torch.uint8).reshape(tiles, groups, -1)


def attend(
    queries: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    sequence: torch.Tensor,
    begin: torch.Tensor,
    end: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Each query row alone over its own sequence's cached keys: queries [R, H, hd]; keys[s], values[s]
    [KV, capacity, hd], one layer of sequence s's cache; row r reads positions begin[r]..end[r]-1 of sequence
    sequence[r] (int64 [R] each) -> [R, H * hd] in the queries' dtype. Scores, softmax and the weighted sum
    run in float32, each (row, key head) by one thread in a fixed order: a row's result never depends on the
    other rows. On a device other than the CPU, `portable.attend`."""
    if queries.device.type != "cpu":
        return portable.attend(queries, keys, values, sequence, begin, end, scale)
    return kernels().attend(queries.contiguous(), keys, values, sequence, begin, end, scale)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> int64 [...], what `x.argmax(dim=-1)` gives (the first index of each row's maximum; a NaN is larger
    than any number), vectorized: torch's reduction reads a logit row one value at a time. On another device or
    dtype, or while the kernels are not built (the transformers runner needs no compiler), torch's own."""
    if not _kernel_argmax_reads(x):
        return x.argmax(dim=-1)
    return torch.ops.quickdraft.argmax([x.reshape(-1, x.shape[-1]).contiguous()]).view(x.shape[:-1])


def argmax_each(xs: Sequence[torch.Tensor]) -> list[list[int]]:
    """`argmax` of each [n_i, V] tensor, as lists of ints, in one kernel call over all their rows; torch's per tensor
    where `argmax` would use torch's."""
    if not all(_kernel_argmax_reads(x) for x in xs):
        return [x.argmax(dim=-1).tolist() for x in xs]
    flat = torch.ops.quickdraft.argmax([x.contiguous() for x in xs]).tolist() if xs else []
    bounds = [0, *itertools.accumulate(x.shape[0] for x in xs)]
    return [flat[begin:end] for begin, end in zip(bounds, bounds[1:])]


def _kernel_argmax_reads(x: torch.Tensor) -> bool:
    """Whether the kernel takes x: a CPU float32 or bfloat16 tensor with non-empty rows, once the kernels are built
    in this process (nothing is built for this)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and bool(x.shape[-1])
        and built_instruction_set.cache_info().currsize > 0
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., d] / rms over d, times weight [d] (x's dtype) when given, in float32 per row, rounded once to x's
    dtype; on a device other than the CPU, `portable.rms_norm`."""
    if x.device.type != "cpu":
        return portable.rms_norm(x, weight, eps)
    return kernels().rms_norm(x.contiguous(), weight, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate x [N, heads, hd] (each row's heads contiguous, rows at any stride) by cos, sin_signed [N, 1, hd]:
    x * cos + x with its halves swapped * sin_signed, in float32 per element, rounded once -> [N, heads, hd]; on a
    device other than the CPU, `portable.rope`."""
    if x.device.type != "cpu":
        return portable.rope(x, cos, sin_signed)
    return kernels().rope(x, cos, sin_signed)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [N, 2 I] (gate columns, then up) -> silu(gate) * up [N, I], in float32, rounded once; on a device
    other than the CPU, `portable.silu_mul`."""
    if gate_up.device.type != "cpu":
        return portable.silu_mul(gate_up)
    return kernels().silu_mul(gate_up.contiguous())


def new_decoder(heads: int, kv_heads: int, head_dim: int, eps: float, attention_scale: float, gelu: bool):
    """An empty `torch.classes.quickdraft.Decoder` (`decoder.cpp`) for a model of these shapes; CPU only."""
    kernels()
    return torch.classes.quickdraft.Decoder(heads, kv_heads, head_dim, eps, attention_scale, gelu)


def new_head_layer(heads: int, kv_heads: int, head_dim: int, eps: float, norm_before_residual: bool, *norms):
    """A `torch.classes.quickdraft.HeadLayer` (`decoder.cpp`) without its matrices: a draft head's layer and output
    for these shapes, `norms` the input, hidden, post-attention and final norm weights [d]; CPU only."""
    kernels()
    return torch.classes.quickdraft.HeadLayer(heads, kv_heads, head_dim, eps, norm_before_residual, *norms)
