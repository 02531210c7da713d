// The kernels blocks.cpp defines, for the decoder (decoder.cpp) to call without going through the dispatcher.
// Contracts: models/native/kernels/__init__.py.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace quickdraft {

// x [M, K] @ weight.T -> [M, N] in x's dtype; weight = nibble * scale + offset per group of 32, packed in tiles.
at::Tensor four_bit_matmul(at::Tensor x, at::Tensor packed, int64_t outputs);
// x [M, K] @ weight.T -> [M, N] in x's dtype; weight = value * scale per group of 32, packed in tiles.
at::Tensor eight_bit_matmul(at::Tensor x, at::Tensor packed, int64_t outputs);
// Each query row [R, H, hd] alone over positions begin[r]..end[r]-1 of sequence sequence[r]'s keys and values.
at::Tensor attend(at::Tensor queries, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                  at::Tensor sequence, at::Tensor begin, at::Tensor end, double scale);
// x [N, heads, hd] rotated by cos, sin_signed [N, 1, hd].
at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin_signed);
// gate_up [N, 2 I] -> silu(gate) * up [N, I].
at::Tensor silu_mul(at::Tensor gate_up);
// x [..., d] / rms(x) * weight.
at::Tensor rms_norm(at::Tensor x, c10::optional<at::Tensor> weight, double eps);

}  // namespace quickdraft
