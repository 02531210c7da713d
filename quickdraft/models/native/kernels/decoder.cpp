// The decoder layers of a forward on the CPU, in one call: `torch.classes.quickdraft.Decoder`. It computes exactly
// what runner.py's Python layers compute on the CPU for the same forward (verification rows, prompt chunks, or both),
// with the same kernels and the same ATen operators in the same order (so the rows are the same bits whichever path
// ran them), without the Python and dispatcher work around each of a step's ~1300 small operators. Devices other than
// the CPU keep the Python layers (and attend a prompt block in one masked product).

#include "kernels.h"

#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace quickdraft {
namespace {

// How a matrix is stored, as weights.Linear.form names it.
enum class Form : int64_t { kDense = 0, kInt8Rows = 1, kFourBit = 2, kEightBitGroups = 3 };

// Rows of a forward that go through a matrix product together (weights.RowGroup).
struct RowGroup {
  int64_t first, count;  // its first row of the stacked activations, its row count
  bool prompt_block;     // one PREFILL_BLOCK of a prompt chunk; else a verification's rows
};

struct Matrix {
  Form form;
  at::Tensor weight;  // dense [out, in]; int8 rows [out, in]; blocks: kernels.pack_four_bit's or pack_eight_bit's panels
  int64_t outputs;    // out
  at::Tensor scales;  // int8 rows: [out]; else undefined
  at::Tensor bias;    // [out] or undefined
  at::Tensor prompt_weight;  // [out, in] in the prompt dtype (weights.Linear.prompt_weight), or undefined
  at::Tensor prompt_bias;    // [out] in the prompt dtype, or undefined

  // weights.Linear.__call__: x [n, in] -> [n, out].
  at::Tensor product(const at::Tensor& x) const {
    at::Tensor y;
    switch (form) {
      case Form::kDense:
        return at::linear(x, weight, optional(bias));
      case Form::kInt8Rows:
        y = at::_weight_int8pack_mm(x, weight, scales);
        break;
      case Form::kFourBit:
        y = four_bit_matmul(x.contiguous(), weight, outputs);
        break;
      case Form::kEightBitGroups:
        y = eight_bit_matmul(x.contiguous(), weight, outputs);
        break;
    }
    return bias.defined() ? at::add(y, bias) : y;
  }

  // weights.Linear._prompt_product: a prompt block's rows [n, in] through the dense prompt-dtype copy.
  at::Tensor prompt_product(const at::Tensor& x) const {
    TORCH_CHECK(prompt_weight.defined(), "this matrix keeps no dense form for prompt blocks");
    return at::linear(x.to(prompt_weight.scalar_type()), prompt_weight, optional(prompt_bias)).to(x.scalar_type());
  }

  // weights.Linear.batched: x [N, in] -> [N, out], each group's rows what they give in a forward of their sequence
  // alone. Verification rows share one product where the kernel computes every row the same way whatever the row
  // count (every form but dense), else get one per group; 4-bit blocks take prompt blocks in that same product,
  // other forms give each prompt block a dense product of its own.
  at::Tensor batched(const at::Tensor& x, const std::vector<RowGroup>& groups) const {
    const bool row_invariant = form != Form::kDense;
    bool any_prompt = false;
    for (const RowGroup& group : groups) any_prompt = any_prompt || group.prompt_block;
    if (form == Form::kFourBit || (!any_prompt && (row_invariant || groups.size() == 1))) return product(x);
    std::vector<at::Tensor> pieces;
    int64_t shared_first = -1, shared_end = -1;  // consecutive verification rows waiting for one product
    for (const RowGroup& group : groups) {
      if (!group.prompt_block && row_invariant) {
        if (shared_first < 0) shared_first = group.first;
        shared_end = group.first + group.count;
        continue;
      }
      if (shared_first >= 0) {
        pieces.push_back(product(x.narrow(0, shared_first, shared_end - shared_first)));
        shared_first = -1;
      }
      const at::Tensor rows = x.narrow(0, group.first, group.count);
      pieces.push_back(group.prompt_block ? prompt_product(rows) : product(rows));
    }
    if (shared_first >= 0) pieces.push_back(product(x.narrow(0, shared_first, shared_end - shared_first)));
    return pieces.size() == 1 ? pieces[0] : at::cat(pieces);
  }

 private:
  static std::optional<at::Tensor> optional(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }
};

struct Layer {
  at::Tensor input_norm;           // [d]
  at::Tensor qk_norm;              // [H + KV, hd] or undefined
  at::Tensor post_attention_norm;  // [d] or undefined
  at::Tensor pre_mlp_norm;         // [d]
  at::Tensor post_mlp_norm;        // [d] or undefined
  int64_t window_slot;             // index into run()'s `begins`
  int64_t rope_slot;               // index into run()'s `cos` and `sin`
  std::vector<Matrix> matrices;    // qkv, o, gate_up, down
};

at::Tensor defined_or_empty(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// cache [KV, capacity, hd] positions start..start+count-1 <- rows first..first+count-1 of `rows` [N, KV, hd] (each
// head's hd values contiguous): KVCache.write's copy, by memcpy, without the dispatcher (a decode step of 16
// sequences writes 960 of them).
void write_positions(const at::Tensor& cache, int64_t start, const at::Tensor& rows, int64_t first, int64_t count) {
  TORCH_CHECK(cache.is_cpu() && rows.is_cpu() && cache.dim() == 3 && rows.dim() == 3 &&
                  cache.scalar_type() == rows.scalar_type() &&
                  cache.stride(2) == 1 && rows.stride(2) == 1 && cache.size(0) == rows.size(1) &&
                  cache.size(2) == rows.size(2) && 0 <= start && start + count <= cache.size(1) && 0 <= first &&
                  first + count <= rows.size(0),
              "a cache write needs [KV, capacity, hd] and [N, KV, hd] tensors of one dtype, in range");
  const int64_t element = rows.element_size(), bytes = rows.size(2) * element;
  char* to = static_cast<char*>(cache.data_ptr());
  const char* from = static_cast<const char*>(rows.data_ptr());
  for (int64_t head = 0; head < rows.size(1); ++head) {
    for (int64_t j = 0; j < count; ++j) {
      std::memcpy(to + (head * cache.stride(0) + (start + j) * cache.stride(1)) * element,
                  from + ((first + j) * rows.stride(0) + head * rows.stride(1)) * element, bytes);
    }
  }
}

// run()'s flat int64 list as structs: three values per row group.
std::vector<RowGroup> row_groups(const std::vector<int64_t>& flat) {
  TORCH_CHECK(flat.size() % 3 == 0, "give three values per row group: first row, row count, prompt block");
  std::vector<RowGroup> groups;
  for (size_t g = 0; g < flat.size(); g += 3) groups.push_back(RowGroup{flat[g], flat[g + 1], flat[g + 2] != 0});
  return groups;
}

class Decoder : public torch::CustomClassHolder {
 public:
  Decoder(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double attention_scale, bool gelu)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps), attention_scale_(attention_scale),
        gelu_(gelu) {}

  void add_layer(at::Tensor input_norm, std::optional<at::Tensor> qk_norm,
                 std::optional<at::Tensor> post_attention_norm, at::Tensor pre_mlp_norm,
                 std::optional<at::Tensor> post_mlp_norm, int64_t window_slot, int64_t rope_slot) {
    layers_.push_back(Layer{input_norm, defined_or_empty(qk_norm), defined_or_empty(post_attention_norm),
                            pre_mlp_norm, defined_or_empty(post_mlp_norm), window_slot, rope_slot, {}});
  }

  // The last added layer's next matrix, in the order qkv, o, gate_up, down (prompt_weight, prompt_bias: the dense
  // copy prompt blocks multiply, where the form keeps one).
  void add_matrix(int64_t form, at::Tensor weight, int64_t outputs, std::optional<at::Tensor> scales,
                  std::optional<at::Tensor> bias, std::optional<at::Tensor> prompt_weight,
                  std::optional<at::Tensor> prompt_bias) {
    TORCH_CHECK(!layers_.empty() && layers_.back().matrices.size() < 4, "add a layer before its four matrices");
    TORCH_CHECK(0 <= form && form <= 3, "unknown matrix form ", form);
    layers_.back().matrices.push_back(Matrix{static_cast<Form>(form), weight, outputs, defined_or_empty(scales),
                                             defined_or_empty(bias), defined_or_empty(prompt_weight),
                                             defined_or_empty(prompt_bias)});
  }

  // x [N, d]: the stacked rows of S sequences, counts[s] rows each, at cache positions starts[s]..; keys and values
  // [S * layers] (sequence s's layer i at s * layers + i, [KV, capacity, hd]); groups: three values per row group
  // (first row, row count, 1 for a prompt block), as weights.Linear.batched takes them; cos, sin [N, 1, hd] per rope
  // slot. Every row attends alone over its own sequence's keys: sequence, end [N] and begins[w] [N] (one per
  // window slot) as kernels.attend reads them.
  // Writes every row's keys and values into its cache. Returns [x after the last layer, then x entering each layer
  // of `wanted`, in its order].
  std::vector<at::Tensor> run(at::Tensor x, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                              std::vector<int64_t> starts, std::vector<int64_t> counts, std::vector<int64_t> groups,
                              std::vector<at::Tensor> cos, std::vector<at::Tensor> sin, at::Tensor sequence,
                              at::Tensor end, std::vector<at::Tensor> begins, std::vector<int64_t> wanted) {
    const int64_t num_layers = static_cast<int64_t>(layers_.size());
    Forward forward{starts, {}, row_groups(groups), cos, sin, sequence, end, begins};
    const size_t sequences = starts.size();
    TORCH_CHECK(counts.size() == sequences && keys.size() == sequences * num_layers && values.size() == keys.size(),
                "give starts, counts, and every sequence's keys and values of every layer");
    TORCH_CHECK(sequence.size(0) == x.size(0) && end.size(0) == x.size(0), "give every row a sequence and an end");
    for (const at::Tensor& begin : begins) TORCH_CHECK(begin.size(0) == x.size(0), "give every row its first key");
    int64_t first = 0;
    for (size_t s = 0; s < sequences; ++s) {
      forward.rows.emplace_back(first, counts[s]);
      first += counts[s];
    }
    TORCH_CHECK(first == x.size(0), "counts must add up to x's rows");
    std::vector<at::Tensor> entering(wanted.size());
    for (int64_t i = 0; i < num_layers; ++i) {
      for (size_t w = 0; w < wanted.size(); ++w) {
        if (wanted[w] == i) entering[w] = x;
      }
      x = layer(i, x, keys, values, forward);
    }
    std::vector<at::Tensor> out{x};
    out.insert(out.end(), entering.begin(), entering.end());
    return out;
  }

 private:
  // What every layer of one run() reads besides its weights and the caches.
  struct Forward {
    std::vector<int64_t> starts;                      // each sequence's first new position
    std::vector<std::pair<int64_t, int64_t>> rows;    // each sequence's first row and row count
    std::vector<RowGroup> groups;                     // the matrix products' row groups
    std::vector<at::Tensor> cos, sin;                 // per rope slot [N, 1, hd]
    at::Tensor sequence, end;                         // [N] each
    std::vector<at::Tensor> begins;                   // per window slot [N]
  };

  at::Tensor layer(int64_t i, const at::Tensor& x, const std::vector<at::Tensor>& keys,
                   const std::vector<at::Tensor>& values, const Forward& forward) const {
    const Layer& layer = layers_.at(i);
    TORCH_CHECK(layer.matrices.size() == 4, "layer ", i, " lacks some of its four matrices");
    const int64_t n = x.size(0), qk_width = (heads_ + kv_heads_) * head_dim_;
    const std::vector<RowGroup>& groups = forward.groups;
    // runner._attention_inputs
    const at::Tensor qkv = layer.matrices[0].batched(rms_norm(x, layer.input_norm, eps_), groups);  // [N, (H+2KV) hd]
    at::Tensor qk = qkv.narrow(1, 0, qk_width).view({n, heads_ + kv_heads_, head_dim_});
    const at::Tensor new_values = qkv.narrow(1, qk_width, kv_heads_ * head_dim_).view({n, kv_heads_, head_dim_});
    if (layer.qk_norm.defined()) qk = at::mul(rms_norm(qk.contiguous(), std::nullopt, eps_), layer.qk_norm);
    qk = rope(qk, forward.cos.at(layer.rope_slot), forward.sin.at(layer.rope_slot));  // [N, H + KV, hd]
    // runner._layer: write the new keys and values, then every row attends alone over its own keys
    const at::Tensor queries = qk.narrow(1, 0, heads_), new_keys = qk.narrow(1, heads_, kv_heads_);
    const int64_t num_layers = static_cast<int64_t>(layers_.size());
    std::vector<at::Tensor> layer_keys, layer_values;
    for (size_t s = 0; s < forward.starts.size(); ++s) {
      const auto& [row, count] = forward.rows[s];
      layer_keys.push_back(keys[s * num_layers + i]);
      layer_values.push_back(values[s * num_layers + i]);
      write_positions(layer_keys.back(), forward.starts[s], new_keys, row, count);
      write_positions(layer_values.back(), forward.starts[s], new_values, row, count);
    }
    const at::Tensor attended = attend(queries.contiguous(), layer_keys, layer_values, forward.sequence,
                                       forward.begins.at(layer.window_slot), forward.end, attention_scale_);  // [N, H hd]
    // runner._attention_output_and_mlp
    at::Tensor out = layer.matrices[1].batched(attended, groups);
    if (layer.post_attention_norm.defined()) out = rms_norm(out, layer.post_attention_norm, eps_);
    const at::Tensor mid = at::add(x, out);
    const at::Tensor gate_up = layer.matrices[2].batched(rms_norm(mid, layer.pre_mlp_norm, eps_), groups);
    at::Tensor activated;
    if (gelu_) {  // layers.gated_mlp
      const std::vector<at::Tensor> halves = at::chunk(gate_up, 2, -1);
      activated = at::mul(at::gelu(halves[0], "tanh"), halves[1]);
    } else {
      activated = silu_mul(gate_up.contiguous());
    }
    out = layer.matrices[3].batched(activated, groups);
    if (layer.post_mlp_norm.defined()) out = rms_norm(out, layer.post_mlp_norm, eps_);
    return at::add(mid, out);
  }

  int64_t heads_, kv_heads_, head_dim_;
  double eps_, attention_scale_;
  bool gelu_;
  std::vector<Layer> layers_;
};

// A draft head's decoder layer and output (EAGLE-3: drafters/head/model.py says what it computes) as the head
// drafter runs it on a CPU (drafters/head/inference.py): a drafting step in two calls instead of some sixty small
// torch operators, whose dispatch cost more than the head's matrix products.
class HeadLayer : public torch::CustomClassHolder {
 public:
  HeadLayer(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, bool norm_before_residual,
            at::Tensor input_norm, at::Tensor hidden_norm, at::Tensor post_attention_norm, at::Tensor final_norm)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps),
        norm_before_residual_(norm_before_residual), input_norm_(input_norm), hidden_norm_(hidden_norm),
        post_attention_norm_(post_attention_norm), final_norm_(final_norm) {}

  // The next matrix, in the order qkv (over the 2d-wide pair), o, gate_up, down, lm_head (the reduced vocabulary).
  void add_matrix(int64_t form, at::Tensor weight, int64_t outputs, std::optional<at::Tensor> scales) {
    TORCH_CHECK(matrices_.size() < 5, "a head layer has five matrices");
    TORCH_CHECK(0 <= form && form <= 3, "unknown matrix form ", form);
    matrices_.push_back(Matrix{static_cast<Form>(form), weight, outputs, defined_or_empty(scales), at::Tensor(),
                               at::Tensor(), at::Tensor()});
  }

  // stream, embedded [n, d] float32: the pairs (stream g_t, embedding of x_{t+1}) at head positions start..;
  // keys, values [KV, capacity, hd] float32: the head's cache, rows start..start+n-1 written here; cos, sin_signed
  // [n, 1, hd] (`kernels.rope`). Each pair attends over the cache up to its own position. Returns [n, d].
  at::Tensor step(at::Tensor stream, at::Tensor embedded, at::Tensor keys, at::Tensor values, int64_t start,
                  at::Tensor cos, at::Tensor sin_signed) const {
    TORCH_CHECK(matrices_.size() == 5, "the head layer lacks some of its five matrices");
    const int64_t n = stream.size(0), qk_width = (heads_ + kv_heads_) * head_dim_;
    const at::Tensor normed = rms_norm(stream, hidden_norm_, eps_);
    const at::Tensor& residual = norm_before_residual_ ? normed : stream;
    const at::Tensor pair = at::cat({rms_norm(embedded, input_norm_, eps_), normed}, 1);  // [n, 2d]
    const at::Tensor qkv = matrices_[0].product(pair);  // [n, (H + 2 KV) hd]
    const at::Tensor qk = rope(qkv.narrow(1, 0, qk_width).view({n, heads_ + kv_heads_, head_dim_}), cos, sin_signed);
    write_positions(keys, start, qk.narrow(1, heads_, kv_heads_), 0, n);
    const at::Tensor new_values = qkv.narrow(1, qk_width, kv_heads_ * head_dim_).view({n, kv_heads_, head_dim_});
    write_positions(values, start, new_values, 0, n);
    const auto options = at::TensorOptions().dtype(at::kLong);
    const at::Tensor zero = at::zeros({n}, options), end = at::arange(start + 1, start + n + 1, options);
    const at::Tensor attended = attend(qk.narrow(1, 0, heads_).contiguous(), {keys}, {values}, zero, zero, end,
                                       1.0 / std::sqrt(static_cast<double>(head_dim_)));  // [n, H hd]
    const at::Tensor mid = at::add(residual, matrices_[1].product(attended));
    const at::Tensor gate_up = matrices_[2].product(rms_norm(mid, post_attention_norm_, eps_));
    return at::add(mid, matrices_[3].product(silu_mul(gate_up.contiguous())));
  }

  // The layer's outputs [n, d] -> draft logits [n, draft_vocab]: the final norm, then the output rows.
  at::Tensor logits(at::Tensor out) const {
    TORCH_CHECK(matrices_.size() == 5, "the head layer lacks some of its five matrices");
    return matrices_[4].product(rms_norm(out, final_norm_, eps_));
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  bool norm_before_residual_;
  at::Tensor input_norm_, hidden_norm_, post_attention_norm_, final_norm_;  // [d] each
  std::vector<Matrix> matrices_;
};

}  // namespace
}  // namespace quickdraft

TORCH_LIBRARY_FRAGMENT(quickdraft, m) {
  m.class_<quickdraft::Decoder>("Decoder")
      .def(torch::init<int64_t, int64_t, int64_t, double, double, bool>())
      .def("add_layer", &quickdraft::Decoder::add_layer)
      .def("add_matrix", &quickdraft::Decoder::add_matrix)
      .def("run", &quickdraft::Decoder::run);
  m.class_<quickdraft::HeadLayer>("HeadLayer")
      .def(torch::init<int64_t, int64_t, int64_t, double, bool, at::Tensor, at::Tensor, at::Tensor, at::Tensor>())
      .def("add_matrix", &quickdraft::HeadLayer::add_matrix)
      .def("step", &quickdraft::HeadLayer::step)
      .def("logits", &quickdraft::HeadLayer::logits);
}
