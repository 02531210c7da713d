"""A GGUF file's weight blocks, unpacked as they are, for quickdraft's block kernels (`--dtype gguf`).

Q4_0, Q4_1 and Q4_K store each row in groups of 32 weights, every group one scale and one offset over
4-bit integers q in 0..15: w = q * scale + min (Q4_0: min = -8 * scale; Q4_K: scale and min are a
super-block's fp16 factors times the group's 6-bit ones). `FourBitBlocks` holds exactly that, in float32, and
its `dequantize` equals the `gguf` package's own de-quantization value for value (a zero may differ in sign).

Q8_0 and Q5_0 store groups of 32 signed integers with one scale: w = q * scale (Q5_0: q = a 5-bit value - 16);
Q6_K groups of 16 with one scale: w = (q - 32) * d * sc, q a 6-bit value, sc a signed 8-bit factor of the
super-block's fp16 d (their product is exact in float32). `EightBitBlocks` holds them as int8 with a float32 scale
per group of 32 (or 16), exactly.

quickdraft's own kernels (`kernels.four_bit_matmul`, `kernels.eight_bit_matmul`) read these blocks rearranged in
panels of 8 rows (`kernels.pack_four_bit`, `pack_eight_bit`), values unchanged: the weights they compute
with are the file's, exactly; like llama.cpp, they quantize the activations to int8 per
group of 32. Other formats (Q5_K, Q2_K, Q3_K, IQ*, ...) have no such kernel here; their matrices keep the
int8 per-row form the `int8` dtype uses (`weights.load_weights` decides per matrix).
"""

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quickdraft.errors import ModelError

GROUP = 32  # weights per scale and offset in every 4-bit format read here
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
EIGHT_BIT_TYPES = ("Q8_0", "Q5_0", "Q6_K")


@dataclass(frozen=True)
class FourBitBlocks:
    """A matrix [out, in] of 4-bit groups: w = q * scale + min, one scale and min per 32 weights of a row."""

    nibbles: torch.Tensor  # [out, in // 2] uint8, 16 bytes per group: byte j holds weight j (low) and j + 16 (high)
    scales: torch.Tensor  # [out, in // 32] float32
    mins: torch.Tensor  # [out, in // 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        return self.nibbles.shape[0], 2 * self.nibbles.shape[1]

    def integers(self) -> torch.Tensor:
        """q [out, in] int32 in 0..15."""
        groups = self.nibbles.view(self.shape[0], -1, GROUP // 2)  # [out, in // 32, 16]
        return torch.cat((groups & 0x0F, groups >> 4), dim=-1).reshape(self.shape).to(torch.int32)

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32, as the GGUF's own de-quantization computes it."""
        q = self.integers().float()
        return q * self.scales.repeat_interleave(GROUP, dim=1) + self.mins.repeat_interleave(GROUP, dim=1)

    def rows(self, order: torch.Tensor) -> "FourBitBlocks":
        """The same blocks with rows rearranged: row i of the result is row order[i]."""
        return FourBitBlocks(self.nibbles[order], self.scales[order], self.mins[order])

    @staticmethod
    def stack(parts: "list[FourBitBlocks]") -> "FourBitBlocks":
        """Matrices with the same input width, one above the other (a fused projection)."""
        return FourBitBlocks(*(torch.cat([getattr(p, f) for p in parts]) for f in ("nibbles", "scales", "mins")))


@dataclass(frozen=True)
class EightBitBlocks:
    """A matrix [out, in] of int8 groups: w = value * scale, one scale per 32 (or per 16) weights of a row."""

    values: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out, in // group] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.values.shape)

    @property
    def group(self) -> int:
        """Weights per scale: 32, or 16 (Q6_K)."""
        return self.values.shape[1] // self.scales.shape[1]

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32, as the GGUF's own de-quantization computes it."""
        return self.values.float() * self.scales.repeat_interleave(self.group, dim=1)

    def rows(self, order: torch.Tensor) -> "EightBitBlocks":
        return EightBitBlocks(self.values[order], self.scales[order])

    def halves(self) -> "EightBitBlocks":
        """The same weights with a scale per 16 (each scale of a 32-weight group twice)."""
        return self if self.group == 16 else EightBitBlocks(self.values, self.scales.repeat_interleave(2, dim=1))

    @staticmethod
    def stack(parts: "list[EightBitBlocks]") -> "EightBitBlocks":
        """One above the other; a scale per 16 weights for all when any part has one."""
        if len({p.group for p in parts}) > 1:
            parts = [p.halves() for p in parts]
        return EightBitBlocks(*(torch.cat([getattr(p, f) for p in parts]) for f in ("values", "scales")))


Blocks = FourBitBlocks | EightBitBlocks


def group_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [..., 32] uint8 in 0..15, one group's weights in order -> [..., 16] in `FourBitBlocks`' group layout (byte
    j: weight j low, j + 16 high); `FourBitBlocks.integers` reads it back."""
    return q[..., : GROUP // 2] | (q[..., GROUP // 2 :] << 4)


def unpack(data: np.ndarray, kind: str, shape: tuple[int, int]) -> Blocks:
    """A GGUF tensor's raw bytes (any shape, rows of whole blocks) of format `kind` as [out, in] blocks."""
    out, width = shape
    if kind not in _BLOCK_BYTES:
        raise ModelError(f"{kind} is not a block format read here ({', '.join(_BLOCK_BYTES)})")
    per_block, weights = _BLOCK_BYTES[kind]
    if width % weights:
        raise ModelError(f"a {kind} matrix needs rows of whole {weights}-weight blocks, got {width} columns")
    raw = np.array(data, copy=True).view(np.uint8)  # a writable copy: the reader maps the file read-only
    blocks = torch.from_numpy(raw).reshape(out * (width // weights), per_block)
    if kind in EIGHT_BIT_TYPES:
        unpack_eight_bit = {"Q8_0": _q8_0, "Q5_0": _q5_0, "Q6_K": _q6_k}[kind]
        values, scales = unpack_eight_bit(blocks)  # [blocks, weights] int8, [blocks, groups of 32 or 16]
        return EightBitBlocks(values.reshape(out, width), scales.reshape(out, -1))
    unpacked = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}[kind](blocks)
    nibbles, scales, mins = unpacked  # [blocks, weights // 2], [blocks, weights // 32] twice
    return FourBitBlocks(nibbles.reshape(out, width // 2), scales.reshape(out, -1), mins.reshape(out, -1))


_BLOCK_BYTES = {
    "Q4_0": (18, 32),
    "Q4_1": (20, 32),
    "Q4_K": (144, 256),
    "Q8_0": (34, 32),
    "Q5_0": (22, 32),
    "Q6_K": (210, 256),
}
# bytes, weights per block


def _fp16(raw: torch.Tensor) -> torch.Tensor:
    """[blocks, 2] uint8 little-endian halves -> [blocks, 1] float32."""
    return raw.contiguous().view(torch.float16).float()


def _q4_0(blocks: torch.Tensor):
    d = _fp16(blocks[:, :2])  # [blocks, 1]
    return blocks[:, 2:], d, -8 * d


def _q4_1(blocks: torch.Tensor):
    return blocks[:, 4:], _fp16(blocks[:, :2]), _fp16(blocks[:, 2:4])


def _q8_0(blocks: torch.Tensor):
    return blocks[:, 2:].contiguous().view(torch.int8), _fp16(blocks[:, :2])


def _q5_0(blocks: torch.Tensor):
    """32 weights: fp16 d, 32 high bits, then 16 bytes of low nibbles (weight j low, j + 16 high): w = (q - 16) d."""
    high_bits = blocks[:, 2:6].to(torch.int64)  # [blocks, 4] little-endian
    high = (high_bits << torch.tensor([0, 8, 16, 24])).sum(dim=1, keepdim=True)  # [blocks, 1]
    fifth = (high >> torch.arange(32)) & 1  # [blocks, 32]
    low = torch.cat((blocks[:, 6:] & 0x0F, blocks[:, 6:] >> 4), dim=1).to(torch.int64)  # [blocks, 32]
    return (low + (fifth << 4) - 16).to(torch.int8), _fp16(blocks[:, :2])


def _q6_k(blocks: torch.Tensor):
    """256 weights: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, fp16 d: w = (q - 32) d sc.
    Each half of 128 weights takes 64 low-nibble bytes (weights 0-31 and 32-63 low, 64-95 and 96-127 high) and
    32 high-bit bytes (weights 0-31, 32-63, 64-95, 96-127 in bit pairs 0, 2, 4, 6)."""
    low = blocks[:, :128].reshape(-1, 2, 1, 64)  # [blocks, half, 1, 64]
    low = torch.cat((low & 0x0F, low >> 4), dim=2).reshape(-1, 2, 4, 32)  # [blocks, half, quarter, 32]
    high = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    high = torch.cat([(high >> shift) & 3 for shift in (0, 2, 4, 6)], dim=2)  # [blocks, half, quarter, 32]
    values = (low.to(torch.int16) | (high.to(torch.int16) << 4)) - 32  # [blocks, 2, 4, 32] in -32..31
    sc = blocks[:, 192:208].contiguous().view(torch.int8).float()  # [blocks, 16]
    return values.reshape(-1, 256).to(torch.int8), _fp16(blocks[:, 208:210]) * sc


def _q4_k(blocks: torch.Tensor):
    """256 weights: 8 groups of 32 with 6-bit scales and mins packed in 12 bytes, times fp16 d and dmin."""
    d, dmin = _fp16(blocks[:, :2]), _fp16(blocks[:, 2:4])  # [blocks, 1]
    packed = blocks[:, 4:16].to(torch.int32)  # [blocks, 12]
    low, high, extra = packed[:, :4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat((low & 63, (extra & 0x0F) | ((low >> 6) << 4)), dim=1)  # [blocks, 8]
    mn = torch.cat((high & 63, (extra >> 4) | ((high >> 6) << 4)), dim=1)
    quants = blocks[:, 16:].reshape(-1, 4, 32)  # [blocks, 4 pairs of groups, 32 bytes]: group 2i low, 2i + 1 high
    groups = torch.stack((quants & 0x0F, quants >> 4), dim=2).reshape(-1, 8, 32)  # [blocks, 8 groups, 32] q values
    return group_nibbles(groups).reshape(-1, 128), d * sc.float(), -(dmin * mn.float())


class GgufFile:
    """The matrices of a GGUF file by their Hugging Face names, read lazily.

    Reads only the header, the architecture and the tensor index (`_TensorIndex`): the `gguf` package's reader
    also parses every metadata value, a 262,144-entry vocabulary included, which takes it 20 s on gemma-3-270m.
    """

    def __init__(self, path: Path, num_layers: int) -> None:
        import gguf  # imported on demand: only `--dtype gguf` reads GGUF tensors

        self.path = path
        try:
            self._data = np.memmap(path, dtype=np.uint8, mode="r")  # [file bytes], read as tensors are asked for
        except (OSError, ValueError) as error:
            raise ModelError(f"cannot read GGUF file {path}: {error}") from error
        self._index = _TensorIndex(memoryview(self._data), path)
        arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == self._index.architecture), None)
        if arch is None:
            raise ModelError(f"{path}: unknown GGUF architecture {self._index.architecture!r}")
        self._names = gguf.get_tensor_name_map(arch, num_layers)

    def blocks(self, hf_name: str) -> tuple[str, Blocks] | None:
        """(the GGUF tensor's name, its blocks) when `hf_name` is stored in a format read here; else None."""
        import gguf

        name = self._names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        entry = self._index.tensors.get(name) if name is not None else None
        if entry is None:
            return None
        kind, dims, offset = entry
        kind_name = gguf.GGMLQuantizationType(kind).name
        if kind_name not in _BLOCK_BYTES or len(dims) != 2:
            return None
        width, out = dims  # GGUF lists dimensions innermost first
        weights, per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        begin = self._index.data_start + offset
        raw = self._data[begin : begin + out * width // weights * per_block]
        if raw.size != out * width // weights * per_block:
            raise ModelError(f"{self.path}: tensor {name} runs past the end of the file (truncated?)")
        return name, unpack(raw, kind_name, (out, width))


class _TensorIndex:
    """A GGUF file's architecture and tensor index: name -> (ggml type, dimensions innermost first, offset)."""

    _SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    _STRING, _ARRAY = 8, 9

    def __init__(self, buffer: memoryview, path: Path) -> None:
        self._buffer = buffer  # the whole file, mapped: only the header's pages are read
        self._at = 0
        try:
            if self._take(4) != b"GGUF" or self._unpack("I") < 2:
                raise ModelError(f"{path} is not a GGUF file of version 2 or later")
            tensor_count, field_count = self._unpack("Q"), self._unpack("Q")
            fields = {}
            for _ in range(field_count):
                key = self._string()
                fields[key] = self._value(self._unpack("I"))
            self.tensors: dict[str, tuple[int, tuple[int, ...], int]] = {}
            for _ in range(tensor_count):
                name = self._string()
                dims = tuple(self._unpack("Q") for _ in range(self._unpack("I")))
                self.tensors[name] = (self._unpack("I"), dims, self._unpack("Q"))
        except (struct.error, UnicodeDecodeError) as error:
            raise ModelError(f"{path}: the GGUF header is cut short or corrupt ({error})") from error
        self.architecture = str(fields.get("general.architecture", ""))
        alignment = int(fields.get("general.alignment", 32))
        self.data_start = -(-self._at // alignment) * alignment
        del self._buffer

    def _take(self, n: int) -> bytes:
        chunk = bytes(self._buffer[self._at : self._at + n])
        if len(chunk) != n:
            raise struct.error("unexpected end of file")
        self._at += n
        return chunk

    def _unpack(self, code: str):
        (value,) = struct.unpack_from("<" + code, self._buffer, self._at)
        self._at += struct.calcsize(code)
        return value

    def _string(self) -> str:
        return self._take(self._unpack("Q")).decode("utf-8")

    def _value(self, kind: int):
        if kind in self._SCALARS:
            return self._unpack(self._SCALARS[kind])
        if kind == self._STRING:
            return self._string()
        if kind == self._ARRAY:  # skipped: the weights need no array-valued metadata
            item, count = self._unpack("I"), self._unpack("Q")
            if item in self._SCALARS:
                self._at += count * struct.calcsize(self._SCALARS[item])
                return None
            for _ in range(count):
                self._value(item)
            return None
        raise struct.error(f"unknown metadata type {kind}")


def matched_rows(blocks: Blocks, weight: torch.Tensor, where: str) -> Blocks:
    """`blocks` with rows arranged as `weight` [out, in] float32 (the checkpoint converted from this GGUF) holds
    them: converters permute some matrices' rows (llama.cpp interleaves q and k rows for its RoPE), so each
    row is found by exact equality of its de-quantized values. Raises when some row has no equal."""
    exact = blocks.dequantize()
    if exact.shape != weight.shape:
        raise ModelError(
            f"{where}: GGUF shape {tuple(exact.shape)} differs from the checkpoint's {tuple(weight.shape)}"
        )
    if torch.equal(exact, weight):
        return blocks
    index: dict[bytes, list[int]] = {}
    for i, row in enumerate((exact + 0.0).numpy()):  # + 0.0: -0.0 becomes 0.0, so rows are keyed by value
        index.setdefault(row.tobytes(), []).append(i)
    order = []
    for row in (weight + 0.0).numpy():
        candidates = index.get(row.tobytes())
        if not candidates:
            raise ModelError(
                f"{where}: the GGUF's blocks do not de-quantize to the checkpoint's weights; "
                "the model directory was not converted from this GGUF file (convert it again, or use --dtype int8)"
            )
        order.append(candidates.pop())
    return blocks.rows(torch.tensor(order))
