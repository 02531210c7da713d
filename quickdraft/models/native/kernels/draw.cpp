// Drawing one token per row of probabilities by inverting its cumulative distribution at a uniform number:
// `torch.ops.quickdraft.draw`, the rule quickdraft/categorical.py states and computes in torch with the same bits.
// Here a row costs a pass over its values, its blocks' sums taken side by side, and one over the chosen block,
// instead of torch's float64 copy and a cumulative sum whose additions wait on one another (scripts/draw_cost.py).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace quickdraft {
namespace {

constexpr int64_t kChains = 8;  // blocks summed side by side: independent chains of additions, each in order

// One row p [n] (non-negative, positive sum) at uniform u in [0, 1) -> its token. `running`: scratch for the
// blocks' running totals.
int64_t draw_row(const float* p, int64_t n, double u, int64_t block, std::vector<double>& running) {
  const int64_t blocks = (n + block - 1) / block;
  running.resize(blocks);
  int64_t b = 0;
  for (; (b + kChains) * block <= n; b += kChains) {  // whole blocks, kChains at a time
    double sums[kChains] = {};
    for (int64_t i = 0; i < block; ++i) {
      for (int64_t c = 0; c < kChains; ++c) sums[c] += static_cast<double>(p[(b + c) * block + i]);
    }
    std::copy(sums, sums + kChains, running.begin() + b);
  }
  for (; b < blocks; ++b) {  // the rest, the last block perhaps short
    double sum = 0.0;
    for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) sum += static_cast<double>(p[i]);
    running[b] = sum;
  }
  for (b = 1; b < blocks; ++b) running[b] += running[b - 1];  // each block's sum -> the total up to its end
  const double total = running[blocks - 1];
  const double point = std::min(u * total, std::nextafter(total, 0.0));  // in [0, total)
  b = std::upper_bound(running.begin(), running.end(), point) - running.begin();  // the first total past it
  const double rest = point - (b > 0 ? running[b - 1] : 0.0);
  double sum = 0.0;
  int64_t last = -1;  // the block's last token with a probability
  for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
    sum += static_cast<double>(p[i]);
    if (sum > rest) return i;
    if (p[i] > 0.0f) last = i;
  }
  return last;  // `rest` rounded to the block's own sum or past it
}

// probs [R, V] float32, contiguous, each row non-negative with a positive sum; uniform [R] float64 in [0, 1);
// block: tokens per block -> int64 [R].
at::Tensor draw(at::Tensor probs, at::Tensor uniform, int64_t block) {
  TORCH_CHECK(probs.dim() == 2 && probs.size(1) > 0 && probs.is_contiguous() && probs.scalar_type() == at::kFloat,
              "probs must be a contiguous float32 [R, V] tensor, V > 0");
  TORCH_CHECK(uniform.dim() == 1 && uniform.size(0) == probs.size(0) && uniform.is_contiguous() &&
                  uniform.scalar_type() == at::kDouble,
              "uniform must be a contiguous float64 [R] tensor");
  TORCH_CHECK(block > 0, "block must be positive");
  const int64_t rows = probs.size(0), n = probs.size(1);
  auto result = at::empty({rows}, probs.options().dtype(at::kLong));
  int64_t* out = result.data_ptr<int64_t>();
  const float* p = probs.data_ptr<float>();
  const double* u = uniform.data_ptr<double>();
  std::vector<double> running;
  for (int64_t r = 0; r < rows; ++r) {
    out[r] = draw_row(p + r * n, n, u[r], block, running);
    TORCH_CHECK(out[r] >= 0, "row ", r, " has no positive probability");
  }
  return result;
}

}  // namespace
}  // namespace quickdraft

TORCH_LIBRARY_FRAGMENT(quickdraft, m) { m.def("draw(Tensor probs, Tensor uniform, int block) -> Tensor"); }

TORCH_LIBRARY_IMPL(quickdraft, CPU, m) { m.impl("draw", &quickdraft::draw); }
