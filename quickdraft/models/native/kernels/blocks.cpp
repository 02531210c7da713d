// quickdraft's CPU kernels. Matrix products over weight blocks (4-bit groups with a scale and an offset, or int8
// groups with a scale), computed as llama.cpp computes them: each activation row is quantized to int8 in groups
// of 32 (one float scale per group), and each output is a sum over groups of integer dot products times the two
// scales (plus, for 4-bit groups, the weights' group offset times the group's activation sum). And attention of
// single query rows over a sequence's cached keys; RMS norm, rotary embeddings and the SiLU-gated product, per
// row.
//
// Every output element (row m, column n) is computed by one thread, over its groups in order, with the same
// operations whatever the row count, the column tiling or the thread count (where 512-bit vectors take two panels
// at once, each lane does what the 256-bit pass's lane does): a row's result never depends on what else is in the
// batch (models/native/kernels/__init__.py states the contract, tests/test_kernels.py checks it).
// Built with -ffp-contract=off so the compiler fuses no scalar multiply-add on its own.

#include "kernels.h"

#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QUICKDRAFT_AVX2 1
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define QUICKDRAFT_VNNI 1  // byte dot products straight into 32-bit lanes (vpdpbusd)
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define QUICKDRAFT_PANEL_PAIRS 1  // two panels' 16 columns in one 512-bit vector: the same lanes' work, half the passes
#endif
#endif

namespace quickdraft {

constexpr int64_t kGroup = 32;  // weights (and activations) per scale
constexpr int64_t kPrefetch = 4096;  // bytes ahead of the group being read that a product asks the cache for (stop 46:
// 2048 left panel pairs waiting on memory in decode steps; docs/native_runtime.md)

// One matrix's activations quantized per group of 32: x ~= q * scale; sum = scale * sum(q).
struct QuantizedRows {
  std::vector<int8_t> q;             // [M, K]
  std::vector<float> scale;          // [M, K / 32]
  std::vector<float> sum;            // [M, K / 32]
  std::vector<int32_t> half_sums;    // [M, K / 32, 2]: sum(q) over a group's values 0-15, and over 16-31
};

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

#ifdef QUICKDRAFT_AVX2

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bfloat16 is the top half of a float32
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(c10::BFloat16* p, __m256 v) {  // rounded half to even, NaN as 0x7FC0: c10's conversion exactly
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
  const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), halves);
}

inline int32_t lanes_sum(__m256i v) {  // exact: integers
  const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i pairs = _mm_add_epi32(half, _mm_shuffle_epi32(half, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(pairs, _mm_shuffle_epi32(pairs, 0xB1)));
}

// The portable version's bits exactly: the same maximum (order-free), the same product per value, rounded half to
// even (nearbyint's default mode), the same integer sum.
template <typename T>
void quantize_group(const T* x, int8_t* q, float* scale, float* sum, int32_t* half_sums) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 values[4], largest = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    values[i] = load8(x + 8 * i);
    largest = _mm256_max_ps(largest, _mm256_and_ps(values[i], magnitude));
  }
  const __m128 half = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  const __m128 pairs = _mm_max_ps(half, _mm_movehl_ps(half, half));
  const float amax = _mm_cvtss_f32(_mm_max_ss(pairs, _mm_movehdup_ps(pairs)));
  const float d = amax / 127.0f;
  const __m256 inverse = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  __m256i ints[4];
  for (int i = 0; i < 4; ++i) {
    ints[i] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(values[i], inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // packs interleave the 128-bit lanes: bytes come out as 32-bit pieces 0 4 1 5 2 6 3 7; put them back in order
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  half_sums[0] = lanes_sum(_mm256_add_epi32(ints[0], ints[1]));
  half_sums[1] = lanes_sum(_mm256_add_epi32(ints[2], ints[3]));
  *scale = d;
  *sum = d * static_cast<float>(half_sums[0] + half_sums[1]);
}

#else

template <typename T>
void quantize_group(const T* x, int8_t* q, float* scale, float* sum, int32_t* half_sums) {
  float values[kGroup];
  float amax = 0.0f;
  for (int64_t i = 0; i < kGroup; ++i) {
    values[i] = to_float(x[i]);
    amax = std::fmax(amax, std::fabs(values[i]));
  }
  const float d = amax / 127.0f;
  const float inverse = d > 0.0f ? 1.0f / d : 0.0f;
  half_sums[0] = half_sums[1] = 0;
  for (int64_t i = 0; i < kGroup; ++i) {
    const int32_t v = static_cast<int32_t>(std::nearbyint(values[i] * inverse));  // ties to even
    q[i] = static_cast<int8_t>(v);
    half_sums[i / 16] += v;
  }
  *scale = d;
  *sum = d * static_cast<float>(half_sums[0] + half_sums[1]);
}

#endif

template <typename T>
void quantize_rows(const T* x, int64_t rows, int64_t width, QuantizedRows& out) {
  const int64_t groups = width / kGroup;
  out.q.resize(rows * width);
  out.scale.resize(rows * groups);
  out.sum.resize(rows * groups);
  out.half_sums.resize(rows * groups * 2);
  at::parallel_for(0, rows * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      quantize_group(x + g * kGroup, out.q.data() + g * kGroup, out.scale.data() + g, out.sum.data() + g,
                     out.half_sums.data() + 2 * g);
    }
  });
}

// The weights of a product, packed so that each thread reads its columns as one sequential stream, group after group
// (`kernels.pack_four_bit`, `pack_eight_bit`). Scales (and offsets) are float16 where every one of the matrix's is
// a float16 exactly (Q4_0, Q4_1, Q8_0, Q5_0 store them so), else float32 (Q4_K's products of factors).
//
// 4-bit groups, in panels of 8 columns (zeros past the last column). A panel group: 4 vectors of 32 bytes, vector v
// holding weights 4v..4v+3 of column 0, then of column 1, ... 7, in its low nibbles and weights 4v+16..4v+19 in its
// high nibbles; then the 8 columns' scales, then their 8 offsets (160 or 192 bytes). Unpacked, a vector's nibbles
// let one unsigned-by-signed multiply-add take 4 consecutive weights of all 8 columns against one row's 4
// activations; a group's 8 such products add up in 16-bit lanes (each at most 8 * 2 * 15 * 127 = 30480), widen once
// to one exact integer per column, and each row's scales apply to the 8 columns in one multiply-add.
//   out[r][c] = sum over groups, in order, of fma(dot, scale * activation scale) then fma(offset, activation sum)
// Every row takes the same instructions whatever the row count: a prompt block, a verification and a decode row
// of the same input are the same bits.
//
// 8-bit groups, in panels of 8 columns (zeros past the last column). A panel group: 8 vectors of 32 bytes, vector v
// holding int8 weights 4v..4v+3 of column 0, then of column 1, ... 7; then the 8 columns' scales (272 or 288
// bytes), or for groups of two halves (Q6_K's 16-weight groups) their 8 float32 scales of weights 0-15, then their
// 8 of weights 16-31 (320 bytes). One multiply-add takes 4 consecutive weights of all 8 columns against one row's 4
// activations, into each column's sum over weights 0-15 or over 16-31 (exact integers):
//   out[r][c] = (sum over groups, in order, of fma(dot over 0-15, scale 0-15 * activation scale))
//             + (the same over weights 16-31)
// Each `tile<R>` computes a panel's columns for R consecutive activation rows, every row with the
// same instructions; `pair<R>` two panels' columns, each lane with the operations of `tile`'s.
template <typename Scale>  // float or c10::Half
struct FourBitPanels {
  static constexpr int64_t kColumns = 8, kRows = 8;  // computed together: columns of a panel, rows of a pass
  static constexpr int64_t kManyRows = kRows;         // rows of a pass where a product has more than kRows
  static constexpr int64_t kScales = kGroup * kColumns / 2, kOffsets = kScales + kColumns * sizeof(Scale);
  static constexpr int64_t kBytes = kOffsets + kColumns * sizeof(Scale);  // a panel group: 160 or 192
  const uint8_t* packed;                                                   // [panels, groups, kBytes]
  int64_t groups;                                                          // K / 32
  template <int R>
  void tile(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[kColumns]) const;
  template <int R>  // panels t and t + 1 in one pass, 16 columns to a 512-bit vector (QUICKDRAFT_PANEL_PAIRS)
  void pair(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[2 * kColumns]) const;
};

template <typename Scale, bool kHalves = false>  // kHalves: a scale per 16 weights (float32 only)
struct EightBitPanels {
  static_assert(!kHalves || sizeof(Scale) == 4, "half-group scales are float32");
  static constexpr int64_t kColumns = 8;
#ifdef __AVX512F__
  // Rows of a pass: with 32 vector registers, up to 8 rows beside a group's 8 weight vectors. One pass of 5-8 rows
  // streams the weights once: the output layer of 5 and 8 rows 1.4x faster than in passes of 4. Past 8 rows the
  // weights come from the cache after the first pass, and passes of 4 keep every value in a register
  // (docs/native_runtime.md, stop 47).
  static constexpr int64_t kRows = 8, kManyRows = 4;
#else
  static constexpr int64_t kRows = 4, kManyRows = 4;
#endif
  static constexpr int64_t kScales = kColumns * kGroup;
  static constexpr int64_t kBytes = kScales + (kHalves ? 2 : 1) * kColumns * sizeof(Scale);  // 272, 288 or 320
  const uint8_t* packed;                                                    // [panels, groups, kBytes]
  int64_t groups;
  template <int R>
  void tile(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[kColumns]) const;
  template <int R>
  void pair(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[2 * kColumns]) const;
};

inline float scale_at(const uint8_t* p, float) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float scale_at(const uint8_t* p, c10::Half) {
  c10::Half v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<float>(v);
}

#ifdef QUICKDRAFT_AVX2

#ifdef QUICKDRAFT_VNNI
// sums + each 32-bit lane's 4 products of unsigned bytes by signed bytes, in int32 (vpdpbusd)
inline __m256i add_byte_dots(__m256i sums, __m256i unsigned_bytes, __m256i signed_bytes) {
#ifdef __AVX512VNNI__
  return _mm256_dpbusd_epi32(sums, unsigned_bytes, signed_bytes);
#else
  return _mm256_dpbusd_avx_epi32(sums, unsigned_bytes, signed_bytes);
#endif
}
#endif

inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Asks the cache for the 64-byte lines of bytes..bytes + size - 1 (rounded up to whole lines).
inline void prefetch_lines(const void* bytes, int64_t size) {
  for (int64_t line = 0; line < size; line += 64) _mm_prefetch(static_cast<const char*>(bytes) + line, _MM_HINT_T0);
}

inline float lanes_sum(__m256 v) {  // fixed order: halves, then pairs, then the last two
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

inline __m256 eight_values(const uint8_t* p, float) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
inline __m256 eight_values(const uint8_t* p, c10::Half) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A panel group's running integer sums for one row: unsigned weights (low, high) times that row's signed activations
// (first, second), 4 consecutive products per 32-bit lane of column c. With VNNI, each lane adds its 4 products
// into one int32; without, the pairs add up in two int16 lanes (each at most 8 * 2 * 15 * 127 = 30480) and
// `column_dots` widens them once. The same exact integers either way.
#ifdef QUICKDRAFT_VNNI
inline __m256i add_byte_products(__m256i sums, __m256i low, __m256i first, __m256i high, __m256i second) {
  return add_byte_dots(add_byte_dots(sums, low, first), high, second);
}
inline __m256 column_dots(__m256i sums) { return _mm256_cvtepi32_ps(sums); }
#else
inline __m256i add_byte_products(__m256i sums, __m256i low, __m256i first, __m256i high, __m256i second) {
  return _mm256_add_epi16(sums, _mm256_add_epi16(_mm256_maddubs_epi16(low, first), _mm256_maddubs_epi16(high, second)));
}
inline __m256 column_dots(__m256i sums) { return _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, _mm256_set1_epi16(1))); }
#endif

template <typename Scale>
template <int R>
void FourBitPanels<Scale>::tile(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[kColumns]) const {
  const uint8_t* p = packed + t * groups * kBytes;
  const int64_t width = groups * kGroup;
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  __m256 acc[R];  // lane c: column c
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, p += kBytes) {
    prefetch_lines(p + kPrefetch, kBytes);
    __m256i sums[R];  // column c: int32 lane c (VNNI), or int16 lanes 2c and 2c + 1
    for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
    for (int64_t v = 0; v < 4; ++v) {
      const __m256i nibbles = load32(p + 32 * v);
      const __m256i low = _mm256_and_si256(nibbles, low_nibbles);                          // weights 4v..4v+3
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(nibbles, 4), low_nibbles);  // weights 4v+16..
      for (int r = 0; r < R; ++r) {  // row r's activations 4v..4v+3 and 4v+16..4v+19, in every 32-bit lane
        const int8_t* q = x.q.data() + (row + r) * width + g * kGroup + 4 * v;
        const __m256i first = _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(q)));
        const __m256i second = _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(q + 16)));
        sums[r] = add_byte_products(sums[r], low, first, high, second);
      }
    }
    const __m256 scales = eight_values(p + kScales, Scale());
    const __m256 offsets = eight_values(p + kOffsets, Scale());
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row + r) * groups + g;
      const __m256 dots = column_dots(sums[r]);  // lane c: column c, exact
      acc[r] = _mm256_fmadd_ps(dots, _mm256_mul_ps(scales, _mm256_set1_ps(x.scale[at])), acc[r]);
      acc[r] = _mm256_fmadd_ps(offsets, _mm256_set1_ps(x.sum[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], acc[r]);
}

// An 8-bit panel's weights, loaded for the products of `add_signed_products`. With VNNI: as unsigned bytes w + 128,
// whose products with a row's activations are the signed ones plus 128 times the activations' sum, which
// `without_weight_bias` takes back (exact integers). Without: as they are, multiplied as |w| by the activations
// with w's sign (pairs at most 2 * 127 * 127, then widened to 32 bits).
#ifdef QUICKDRAFT_VNNI
inline __m256i weight_bytes(const uint8_t* p) { return _mm256_xor_si256(load32(p), _mm256_set1_epi8(-128)); }
inline __m256i add_signed_products(__m256i sums, __m256i weights, __m256i activations) {
  return add_byte_dots(sums, weights, activations);
}
inline __m256i without_weight_bias(__m256i sums, int32_t activation_sum) {
  return _mm256_sub_epi32(sums, _mm256_set1_epi32(128 * activation_sum));
}
#else
inline __m256i weight_bytes(const uint8_t* p) { return load32(p); }
inline __m256i add_signed_products(__m256i sums, __m256i weights, __m256i activations) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(weights, weights), _mm256_sign_epi8(activations, weights));
  return _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline __m256i without_weight_bias(__m256i sums, int32_t) { return sums; }
#endif

template <typename Scale, bool kHalves>
template <int R>
void EightBitPanels<Scale, kHalves>::tile(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[kColumns]) const {
  const uint8_t* p = packed + t * groups * kBytes;
  const int64_t width = groups * kGroup;
  __m256 low[R], high[R];  // lane c: column c, over weights 0-15 | over 16-31 of each group
  for (int r = 0; r < R; ++r) low[r] = high[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, p += kBytes) {
    prefetch_lines(p + kPrefetch, kBytes);
    __m256i weights[8];
    for (int v = 0; v < 8; ++v) weights[v] = weight_bytes(p + 32 * v);
    const __m256 low_scales = eight_values(p + kScales, Scale());
    const __m256 high_scales = kHalves ? eight_values(p + kScales + 32, Scale()) : low_scales;
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row + r) * groups + g;
      const int8_t* q = x.q.data() + (row + r) * width + g * kGroup;
      __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // weights 0-15, 16-31
      for (int v = 0; v < 8; ++v) {  // row r's activations 4v..4v+3, in every 32-bit lane
        const __m256i activations = _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(q + 4 * v)));
        sums[v / 4] = add_signed_products(sums[v / 4], weights[v], activations);
      }
      const __m256 activation_scale = _mm256_set1_ps(x.scale[at]);
      const __m256 low_dots = _mm256_cvtepi32_ps(without_weight_bias(sums[0], x.half_sums[2 * at]));
      const __m256 high_dots = _mm256_cvtepi32_ps(without_weight_bias(sums[1], x.half_sums[2 * at + 1]));
      low[r] = _mm256_fmadd_ps(low_dots, _mm256_mul_ps(low_scales, activation_scale), low[r]);
      high[r] = _mm256_fmadd_ps(high_dots, _mm256_mul_ps(high_scales, activation_scale), high[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r], _mm256_add_ps(low[r], high[r]));
}

#ifdef QUICKDRAFT_PANEL_PAIRS
// Two panels at once: lanes 0-7 hold panel t's columns, lanes 8-15 panel t + 1's, and every lane takes exactly the
// instructions of `tile`'s lane (the same exact integer sums, the same float multiply-adds in the same order), so a
// pair's columns are the bits of the two panels computed apart.
inline __m512i load_pair(const uint8_t* first, const uint8_t* second) {  // first's 32 bytes, then second's
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(first)), load32(second), 1);
}
inline __m512 pair_values(const uint8_t* first, const uint8_t* second, float) {
  return _mm512_castsi512_ps(load_pair(first, second));
}
inline __m512 pair_values(const uint8_t* first, const uint8_t* second, c10::Half) {
  const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first));
  const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(second));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1));
}
// A pair reads panels t and t + 1 side by side, group by group, and the thread's next item is panels t + 2 and t + 3:
// `Ahead` walks the group kPrefetch bytes ahead of the one being read in that order of reading, in both streams.
// (Asking for first + kPrefetch and second + kPrefetch instead left each item's second panel unasked for: the first
// stream's look-ahead ran into the second panel, the second's into the next item's first.)
class Ahead {
 public:
  Ahead(const uint8_t* first, int64_t panel_bytes)
      : at_(first + kPrefetch / panel_bytes * 2 * panel_bytes + kPrefetch % panel_bytes),
        within_(kPrefetch % panel_bytes), panel_bytes_(panel_bytes) {}
  void ask_and_step(int64_t group_bytes) {  // the cache lines of this group in both streams; then the next group
    prefetch_lines(at_, group_bytes);
    prefetch_lines(at_ + panel_bytes_, group_bytes);
    at_ += group_bytes;
    within_ += group_bytes;
    if (within_ >= panel_bytes_) {  // into the next item's panels, two panels on
      within_ -= panel_bytes_;
      at_ += panel_bytes_;
    }
  }

 private:
  const uint8_t* at_;  // in the first stream
  int64_t within_;     // at_'s offset inside its panel
  int64_t panel_bytes_;
};

inline __m512i broadcast4(const int8_t* q) {  // a row's 4 activations in every 32-bit lane
  int32_t four;
  std::memcpy(&four, q, sizeof four);
  return _mm512_set1_epi32(four);
}

template <typename Scale>
template <int R>
void FourBitPanels<Scale>::pair(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[2 * kColumns]) const {
  const uint8_t* p = packed + t * groups * kBytes;
  const uint8_t* p2 = p + groups * kBytes;  // panel t + 1
  Ahead ahead(p, groups * kBytes);
  const int64_t width = groups * kGroup;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, p += kBytes, p2 += kBytes) {
    ahead.ask_and_step(kBytes);
    __m512i sums[R];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
    for (int64_t v = 0; v < 4; ++v) {
      const __m512i nibbles = load_pair(p + 32 * v, p2 + 32 * v);
      const __m512i low = _mm512_and_si512(nibbles, low_nibbles);
      const __m512i high = _mm512_and_si512(_mm512_srli_epi32(nibbles, 4), low_nibbles);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = x.q.data() + (row + r) * width + g * kGroup + 4 * v;
        sums[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sums[r], low, broadcast4(q)), high, broadcast4(q + 16));
      }
    }
    const __m512 scales = pair_values(p + kScales, p2 + kScales, Scale());
    const __m512 offsets = pair_values(p + kOffsets, p2 + kOffsets, Scale());
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row + r) * groups + g;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), _mm512_mul_ps(scales, _mm512_set1_ps(x.scale[at])), acc[r]);
      acc[r] = _mm512_fmadd_ps(offsets, _mm512_set1_ps(x.sum[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

template <typename Scale, bool kHalves>
template <int R>
void EightBitPanels<Scale, kHalves>::pair(const QuantizedRows& x, int64_t row, int64_t t,
                                          float (*out)[2 * kColumns]) const {
  const uint8_t* p = packed + t * groups * kBytes;
  const uint8_t* p2 = p + groups * kBytes;  // panel t + 1
  Ahead ahead(p, groups * kBytes);
  const int64_t width = groups * kGroup;
  const __m512i bias = _mm512_set1_epi8(-128);
  __m512 low[R], high[R];
  for (int r = 0; r < R; ++r) low[r] = high[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, p += kBytes, p2 += kBytes) {
    ahead.ask_and_step(kBytes);
    __m512i weights[8];  // as unsigned bytes w + 128, like `weight_bytes`
    for (int v = 0; v < 8; ++v) weights[v] = _mm512_xor_si512(load_pair(p + 32 * v, p2 + 32 * v), bias);
    const __m512 low_scales = pair_values(p + kScales, p2 + kScales, Scale());
    const __m512 high_scales = kHalves ? pair_values(p + kScales + 32, p2 + kScales + 32, Scale()) : low_scales;
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row + r) * groups + g;
      const int8_t* q = x.q.data() + (row + r) * width + g * kGroup;
      __m512i sums[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int v = 0; v < 8; ++v) sums[v / 4] = _mm512_dpbusd_epi32(sums[v / 4], weights[v], broadcast4(q + 4 * v));
      const __m512 activation_scale = _mm512_set1_ps(x.scale[at]);
      const __m512 low_dots = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[0], _mm512_set1_epi32(128 * x.half_sums[2 * at])));
      const __m512 high_dots =
          _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[1], _mm512_set1_epi32(128 * x.half_sums[2 * at + 1])));
      low[r] = _mm512_fmadd_ps(low_dots, _mm512_mul_ps(low_scales, activation_scale), low[r]);
      high[r] = _mm512_fmadd_ps(high_dots, _mm512_mul_ps(high_scales, activation_scale), high[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], _mm512_add_ps(low[r], high[r]));
}
#endif

#else  // portable fallback: the same sums, in one lane, the same bits

// Where a panel group keeps weight i (0-31 for 8-bit groups; 0-15, with 16-31 in the high nibbles, for 4-bit) of
// column c: vector i / 4, column c's 32-bit lane, byte i % 4.
constexpr int64_t panel_byte(int64_t i, int64_t c) { return (i / 4) * 32 + c * 4 + i % 4; }

template <typename Scale>
template <int R>
void FourBitPanels<Scale>::tile(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[kColumns]) const {
  const int64_t width = groups * kGroup;
  for (int r = 0; r < R; ++r) {
    const int8_t* q = x.q.data() + (row + r) * width;
    for (int c = 0; c < kColumns; ++c) {
      float total = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* group = packed + (t * groups + g) * kBytes;
        int32_t dot = 0;
        for (int64_t i = 0; i < 16; ++i) {
          const uint8_t byte = group[panel_byte(i, c)];
          dot += static_cast<int32_t>(byte & 0x0F) * q[g * kGroup + i] + static_cast<int32_t>(byte >> 4) * q[g * kGroup + i + 16];
        }
        const float scale = scale_at(group + kScales + sizeof(Scale) * c, Scale());
        const float offset = scale_at(group + kOffsets + sizeof(Scale) * c, Scale());
        const int64_t at = (row + r) * groups + g;
        total = std::fma(static_cast<float>(dot), scale * x.scale[at], total);
        total = std::fma(offset, x.sum[at], total);
      }
      out[r][c] = total;
    }
  }
}

template <typename Scale, bool kHalves>
template <int R>
void EightBitPanels<Scale, kHalves>::tile(const QuantizedRows& x, int64_t row, int64_t t, float (*out)[kColumns]) const {
  for (int r = 0; r < R; ++r) {
    const int8_t* q = x.q.data() + (row + r) * groups * kGroup;
    for (int c = 0; c < kColumns; ++c) {
      float total[2] = {0.0f, 0.0f};  // weights 0-15 and 16-31 of each group
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* p = packed + (t * groups + g) * kBytes;
        for (int half = 0; half < 2; ++half) {
          const int64_t slot = kHalves ? half * kColumns + c : c;
          const float scale = scale_at(p + kScales + sizeof(Scale) * slot, Scale());
          int32_t dot = 0;
          for (int64_t j = 16 * half; j < 16 * half + 16; ++j) {
            dot += static_cast<int32_t>(static_cast<int8_t>(p[panel_byte(j, c)])) * q[g * kGroup + j];
          }
          total[half] = std::fma(static_cast<float>(dot), scale * x.scale[(row + r) * groups + g], total[half]);
        }
      }
      out[r][c] = total[0] + total[1];
    }
  }
}

#endif

// Rows row..row+count-1 (count <= R) of panel t (P = 1), or of panels t and t + 1 (P = 2): the largest pass
// `tile<count>` or `pair<count>`, chosen at compile time.
template <typename Panels, int P, int R = Panels::kRows>
void rows_pass(const Panels& panels, const QuantizedRows& x, int64_t row, int64_t count, int64_t t,
               float (*out)[P * Panels::kColumns]) {
  if constexpr (R > 1) {
    if (count < R) return rows_pass<Panels, P, R - 1>(panels, x, row, count, t, out);
  }
  if constexpr (P == 2) {
    panels.template pair<R>(x, row, t, out);
  } else {
    panels.template tile<R>(x, row, t, out);
  }
}

#ifdef QUICKDRAFT_PANEL_PAIRS
// Products of at least this many rows take panels two at a time: half the instructions per weight byte, which pays
// once the arithmetic, not the weights' streaming, decides. The build passes it per CPU (kernels/__init__.py,
// `pair_rows`), measured in whole forwards (docs/native_runtime.md, stops 46, 50, 57 and 61): from 1 row on an
// Intel Xeon (a decode row too), from 4 on a Zen 5 EPYC (a 4-token forward 6-10% faster, a 16-sequence decode step
// about 2 ms of 14; at 2 and 3 rows slower), from 6 on Zen 4, which runs 512-bit instructions as two 256-bit
// halves. Either way the same bits.
constexpr int64_t kPairRows = QUICKDRAFT_PAIR_ROWS;
#else
constexpr int64_t kPairRows = INT64_MAX;  // no 512-bit vectors: one panel at a time
#endif

// values[0..count-1] into out as static_cast<T> writes them: 8 at a time through `store8` (c10's rounding exactly),
// the rest one by one. A 128-row prompt block spent 7% of its time converting outputs one by one.
template <typename T>
inline void store_row(const float* values, int64_t count, T* out) {
  int64_t c = 0;
#ifdef QUICKDRAFT_AVX2
  for (; c + 8 <= count; c += 8) store8(out + c, load8(values + c));
#endif
  for (; c < count; ++c) out[c] = static_cast<T>(values[c]);
}

// Panel t's columns (P = 1) or panels t and t + 1's (P = 2), every row, Panels::kRows rows a pass, into out.
template <int P, typename T, typename Panels>
void panel_rows(const Panels& panels, const QuantizedRows& x, int64_t rows, int64_t outputs, int64_t t, T* out) {
  constexpr int64_t kColumns = P * Panels::kColumns, kRows = Panels::kRows;
  const int64_t first = t * Panels::kColumns, count = std::min(kColumns, outputs - first);
  const int64_t step = rows <= kRows ? kRows : Panels::kManyRows;  // rows of a pass: the same bits either way
  float values[kRows][kColumns];
  for (int64_t row = 0; row < rows; row += step) {
    const int64_t pass = std::min(step, rows - row);
    rows_pass<Panels, P>(panels, x, row, pass, t, values);
    for (int64_t r = 0; r < pass; ++r) store_row(values[r], count, out + (row + r) * outputs + first);
  }
}

// x [M, K] @ weights.T -> [M, N] in x's dtype: panels (of Panels::kColumns columns, two at a time from kPairRows
// rows) split among threads, every row of a panel computed with the panel's weights hot in cache, Panels::kRows rows
// at a time.
template <typename T, typename Panels>
at::Tensor block_product(const at::Tensor& x, const Panels& panels, int64_t outputs) {
  const int64_t rows = x.size(0), width = x.size(1);
  const int64_t panel_count = (outputs + Panels::kColumns - 1) / Panels::kColumns;
  QuantizedRows quantized;
  quantize_rows(x.data_ptr<T>(), rows, width, quantized);
  auto result = at::empty({rows, outputs}, x.options());
  T* out = result.data_ptr<T>();
  const int64_t per_item = rows >= kPairRows ? 2 : 1;
  at::parallel_for(0, (panel_count + per_item - 1) / per_item, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item * per_item;
#ifdef QUICKDRAFT_PANEL_PAIRS
      if (per_item == 2 && t + 1 < panel_count) {
        panel_rows<2>(panels, quantized, rows, outputs, t, out);
        continue;
      }
#endif
      panel_rows<1>(panels, quantized, rows, outputs, t, out);
    }
  });
  return result;
}

void check_activations(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x must be a contiguous CPU matrix");
  TORCH_CHECK(x.size(1) % kGroup == 0, "x's width must be a multiple of 32");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
}

// Checks `packed` against x and N (in panels of `columns`) and returns its bytes per group, one of `sizes`
// (which say the scales' form).
int64_t check_packed(const at::Tensor& packed, const at::Tensor& x, int64_t outputs, int64_t columns,
                     std::initializer_list<int64_t> sizes) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3,
              "packed weights must be a contiguous uint8 [panels, groups, bytes] tensor (kernels.pack_*)");
  std::string names;
  bool known = false;
  for (const int64_t size : sizes) {
    known = known || packed.size(2) == size;
    names += (names.empty() ? "" : size == *(sizes.end() - 1) ? " or " : ", ") + std::to_string(size);
  }
  TORCH_CHECK(packed.size(0) == (outputs + columns - 1) / columns && packed.size(1) * kGroup == x.size(1) && known,
              "packed weights must be [ceil(N / ", columns, "), K / 32, ", names, "]");
  return packed.size(2);
}

template <typename Panels>
at::Tensor product(const at::Tensor& x, const Panels& panels, int64_t outputs) {
  if (x.scalar_type() == at::kBFloat16) return block_product<c10::BFloat16>(x, panels, outputs);
  return block_product<float>(x, panels, outputs);
}

// x [M, K] float32 or bfloat16; packed [ceil(N / 8), K / 32, 160 or 192] (`kernels.pack_four_bit`):
// weight = nibble * scale + offset. Returns x @ weight.T [M, N] in x's dtype.
at::Tensor four_bit_matmul(at::Tensor x, at::Tensor packed, int64_t outputs) {
  check_activations(x);
  const int64_t groups = x.size(1) / kGroup;
  using Half = FourBitPanels<c10::Half>;
  using Float = FourBitPanels<float>;
  if (check_packed(packed, x, outputs, Half::kColumns, {Half::kBytes, Float::kBytes}) == Half::kBytes) {
    return product(x, Half{packed.data_ptr<uint8_t>(), groups}, outputs);
  }
  return product(x, Float{packed.data_ptr<uint8_t>(), groups}, outputs);
}

// x [M, K] float32 or bfloat16; packed [ceil(N / 8), K / 32, 272, 288 or 320] (`kernels.pack_eight_bit`):
// weight = value * scale, values in -127..127, a scale per 32 weights (float16 or float32) or per 16 (float32).
// Returns x @ weight.T [M, N] in x's dtype.
at::Tensor eight_bit_matmul(at::Tensor x, at::Tensor packed, int64_t outputs) {
  check_activations(x);
  const int64_t groups = x.size(1) / kGroup;
  using Half = EightBitPanels<c10::Half>;
  using Halves = EightBitPanels<float, true>;
  const int64_t bytes =
      check_packed(packed, x, outputs, Half::kColumns, {Half::kBytes, EightBitPanels<float>::kBytes, Halves::kBytes});
  if (bytes == Half::kBytes) return product(x, Half{packed.data_ptr<uint8_t>(), groups}, outputs);
  if (bytes == Halves::kBytes) return product(x, Halves{packed.data_ptr<uint8_t>(), groups}, outputs);
  return product(x, EightBitPanels<float>{packed.data_ptr<uint8_t>(), groups}, outputs);
}

// ---- attention of query rows over a cache ----
//
// A work item is one key head of a block of consecutive rows of one sequence (a prompt block's or a verification's
// rows, or a decode row), or a part of the query heads that share it (`head_parts`): its queries (the block's rows
// times those query heads) read the cache 8 positions at a time (16, from key blocks turned on their side, where an
// AVX-512 build's item has many queries: `score_many`). Each cached key and value is widened to float32 once for all
// of them (in registers where the head size allows, else into a block buffer), and each query computes from them
// exactly what it would alone: its score per position (products over head_dim in 16 lanes, in order, then a fixed
// reduction of the lanes), its softmax over its own positions, and its weighted sum of the values in position
// order. A row's result depends only on its own query and positions: not on the rows or heads sharing its work
// item, the block size, the thread count or the vector width.

constexpr int64_t kKeyBlock = 8;   // cache positions widened and scored together
#ifdef __AVX512F__
// Rows of one sequence in a work item, at most: a prompt block's items are large, so that each key block turned on
// its side (`score_many`) serves many queries.
constexpr int64_t kQueryRows = 16;
#else
constexpr int64_t kQueryRows = 4;
#endif
constexpr int64_t kAheadBlocks = 4;  // key blocks between the one read and the one asked of the cache

#ifdef QUICKDRAFT_AVX2

// The float operations of `exp_nonpositive` on 8 lanes and, in AVX-512 builds, on 16: each lane takes the same
// instruction whatever the width, so the same bits.
template <typename V>
V vsplat(float v);
template <>
inline __m256 vsplat<__m256>(float v) { return _mm256_set1_ps(v); }
inline __m256 vmax(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
inline __m256 vmul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
inline __m256 vadd(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 vfmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
inline __m256 vfnmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fnmadd_ps(a, b, c); }
inline __m256 vround(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m256 vpow2(__m256 n) {  // 2^n for integers n in -126..127, held as floats
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#ifdef __AVX512F__
template <>
inline __m512 vsplat<__m512>(float v) { return _mm512_set1_ps(v); }
inline __m512 vmax(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
inline __m512 vmul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512 vadd(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __m512 vfmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
inline __m512 vfnmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }
inline __m512 vround(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m512 vpow2(__m512 n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#endif

// e^x for x <= 0 (scores minus their maximum): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p of degree 6.
template <typename V>
V exp_nonpositive(V x) {
  x = vmax(x, vsplat<V>(-87.0f));
  const V n = vround(vmul(x, vsplat<V>(1.44269504088896341f)));
  V r = vfnmadd(n, vsplat<V>(0.693359375f), x);
  r = vfnmadd(n, vsplat<V>(-2.12194440e-4f), r);
  V p = vsplat<V>(1.9875691500e-4f);
  p = vfmadd(p, r, vsplat<V>(1.3981999507e-3f));
  p = vfmadd(p, r, vsplat<V>(8.3334519073e-3f));
  p = vfmadd(p, r, vsplat<V>(4.1665795894e-2f));
  p = vfmadd(p, r, vsplat<V>(1.6666665459e-1f));
  p = vfmadd(p, r, vsplat<V>(5.0000001201e-1f));
  p = vfmadd(p, vmul(r, r), vadd(r, vsplat<V>(1.0f)));
  return vmul(p, vpow2(n));
}

// One cached row of head_dim values (a multiple of 8) -> to [head_dim] float32.
template <typename T>
void widen_row(const T* from, int64_t head_dim, float* to) {
  for (int64_t i = 0; i < head_dim; i += 8) _mm256_storeu_ps(to + i, load8(from + i));
}

// rows 0..count-1 of `from` (`stride` apart) -> to [kKeyBlock, head_dim] float32, zero rows past count; asks the
// cache for the rows kAheadBlocks blocks further on, of the `later` rows from `from` on that the work item reads (a
// work item reads the cache once, from memory at long contexts).
template <typename T>
void widen_block(const T* from, int64_t stride, int64_t count, int64_t later, int64_t head_dim, float* to) {
  for (int64_t j = kAheadBlocks * kKeyBlock; j < std::min((kAheadBlocks + 1) * kKeyBlock, later); ++j) {
    prefetch_lines(from + j * stride, head_dim * static_cast<int64_t>(sizeof(T)));
  }
  for (int64_t j = 0; j < kKeyBlock; ++j) {
    if (j < count) {
      widen_row(from + j * stride, head_dim, to + j * head_dim);
    } else {
      std::fill(to + j * head_dim, to + (j + 1) * head_dim, 0.0f);
    }
  }
}

// The scores of one query (float32 [head_dim], scaled) against a widened block of 8 positions -> out[8]. Per
// position, 16 lanes of products: lane l sums the products of dims l, l + 16, l + 32, ... in order (a head size
// that is an odd multiple of 8 gives lanes 0-7 one more); then lanes l and l + 8 are added, and those 8 sums
// reduced as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)). 512-bit vectors hold the 16 lanes in one
// register, 256-bit ones in two: the same operations in the same order, so the same bits.

// The fixed reduction of 4 positions' 8 lanes each -> their 4 scores.
inline __m128 reduce_four(__m256 x0, __m256 x1, __m256 x2, __m256 x3) {
  const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(x0, x1), _mm256_hadd_ps(x2, x3));
  return _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
}

#ifdef __AVX512F__

inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

inline void score_block(const float* q, const float* keys, int64_t head_dim, float* out) {
  __m512 acc[kKeyBlock];
  for (int j = 0; j < kKeyBlock; ++j) acc[j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= head_dim; i += 16) {
    const __m512 part = _mm512_loadu_ps(q + i);
    for (int j = 0; j < kKeyBlock; ++j) acc[j] = _mm512_fmadd_ps(part, _mm512_loadu_ps(keys + j * head_dim + i), acc[j]);
  }
  __m256 lanes[kKeyBlock];  // lanes l + (l + 8), after lanes 0-7 took the last 8 dims where head_dim is 8 past 16s
  for (int j = 0; j < kKeyBlock; ++j) {
    __m256 low = _mm512_castps512_ps256(acc[j]);
    if (i < head_dim) low = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(keys + j * head_dim + i), low);
    lanes[j] = _mm256_add_ps(low, high_half(acc[j]));
  }
  _mm_storeu_ps(out, reduce_four(lanes[0], lanes[1], lanes[2], lanes[3]));
  _mm_storeu_ps(out + 4, reduce_four(lanes[4], lanes[5], lanes[6], lanes[7]));
}

#else

// Lanes 0-7 in `low`, 8-15 in `high`, 4 positions at a time (16 accumulators would not fit the 16 registers).
inline void score_block(const float* q, const float* keys, int64_t head_dim, float* out) {
  for (int half = 0; half < kKeyBlock; half += 4) {
    const float* k = keys + half * head_dim;
    __m256 low[4], high[4];
    for (int j = 0; j < 4; ++j) low[j] = high[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= head_dim; i += 16) {
      const __m256 first = _mm256_loadu_ps(q + i), second = _mm256_loadu_ps(q + i + 8);
      for (int j = 0; j < 4; ++j) {
        low[j] = _mm256_fmadd_ps(first, _mm256_loadu_ps(k + j * head_dim + i), low[j]);
        high[j] = _mm256_fmadd_ps(second, _mm256_loadu_ps(k + j * head_dim + i + 8), high[j]);
      }
    }
    if (i < head_dim) {
      const __m256 last = _mm256_loadu_ps(q + i);
      for (int j = 0; j < 4; ++j) low[j] = _mm256_fmadd_ps(last, _mm256_loadu_ps(k + j * head_dim + i), low[j]);
    }
    for (int j = 0; j < 4; ++j) low[j] = _mm256_add_ps(low[j], high[j]);
    _mm_storeu_ps(out + half, reduce_four(low[0], low[1], low[2], low[3]));
  }
}

#endif

// scores [L] -> their softmax numerators e^(score - max), in place; returns their sum (8 lanes in position order,
// then the lanes, then the last few positions one by one).
inline float softmax_numerators(float* scores, int64_t length) {
  __m256 top8 = _mm256_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 8 <= length; t += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(scores + t));
  const __m128 half = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
  const __m128 pairs = _mm_max_ps(half, _mm_movehl_ps(half, half));
  float top = _mm_cvtss_f32(_mm_max_ss(pairs, _mm_movehdup_ps(pairs)));
  for (; t < length; ++t) top = std::max(top, scores[t]);
  __m256 total8 = _mm256_setzero_ps();
  t = 0;
#ifdef __AVX512F__
  for (; t + 16 <= length; t += 16) {  // 16 at a time, added into the 8 lanes in position order as below
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + t), _mm512_set1_ps(top)));
    _mm512_storeu_ps(scores + t, e);
    total8 = _mm256_add_ps(total8, _mm512_castps512_ps256(e));
    total8 = _mm256_add_ps(total8, high_half(e));
  }
#endif
  for (; t + 8 <= length; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + t), _mm256_set1_ps(top)));
    _mm256_storeu_ps(scores + t, e);
    total8 = _mm256_add_ps(total8, e);
  }
  float total = lanes_sum(total8);
  if (t < length) {  // the last few scores, padded (their lanes are then dropped)
    float tail[8];
    for (int64_t i = 0; i < 8; ++i) tail[i] = t + i < length ? scores[t + i] - top : -87.0f;
    float tail_exp[8];
    _mm256_storeu_ps(tail_exp, exp_nonpositive(_mm256_loadu_ps(tail)));
    for (int64_t i = t; i < length; ++i) {
      scores[i] = tail_exp[i - t];
      total += tail_exp[i - t];
    }
  }
  return total;
}

// Positions t..t+n-1 (n <= kKeyBlock) widened once, then scored by each query: scores[j * span + u] for query j
// and position t + u. `high`: the end of the positions the work item reads (what may be prefetched).
template <typename T>
void score_widened(const float* queries, int64_t count, const T* keys, int64_t t, int64_t n, int64_t high,
                   int64_t stride, int64_t head_dim, float* block, float* scores, int64_t span) {
  widen_block(keys + t * stride, stride, n, high - t, head_dim, block);
  for (int64_t j = 0; j < count; ++j) score_block(queries + j * head_dim, block, head_dim, scores + j * span);
}

#ifdef __AVX512F__

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // bfloat16 is the top half of a float32
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}

// A cached key of 16 C dims (and 8 more where Tail) widened into registers; `lanes(q)`: a query's 16 lanes of
// products with it, lanes l and l + 8 added.
template <int C, bool Tail>
struct WideKey {
  __m512 k[C];
  __m256 tail;
  template <typename T>
  explicit WideKey(const T* key) {
    for (int c = 0; c < C; ++c) k[c] = load16(key + 16 * c);
    tail = Tail ? load8(key + 16 * C) : _mm256_setzero_ps();
  }
  __m256 lanes(const float* q) const {
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), k[c], acc);
    __m256 low = _mm512_castps512_ps256(acc);
    if (Tail) low = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * C), tail, low);
    return _mm256_add_ps(low, high_half(acc));
  }
};

#else

// The same with lanes 0-7 and 8-15 in two registers.
template <int C, bool Tail>
struct WideKey {
  __m256 low[C], high[C];
  __m256 tail;
  template <typename T>
  explicit WideKey(const T* key) {
    for (int c = 0; c < C; ++c) {
      low[c] = load8(key + 16 * c);
      high[c] = load8(key + 16 * c + 8);
    }
    tail = Tail ? load8(key + 16 * C) : _mm256_setzero_ps();
  }
  __m256 lanes(const float* q) const {
    __m256 first = _mm256_setzero_ps(), second = _mm256_setzero_ps();
    for (int c = 0; c < C; ++c) {
      first = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * c), low[c], first);
      second = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * c + 8), high[c], second);
    }
    if (Tail) first = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * C), tail, first);
    return _mm256_add_ps(first, second);
  }
};

#endif

// score_widened's scores, read from the cache as they are: each key is widened into registers once for every
// query of the work item, each query's 16 lanes folded to 8 at once, and every 4 positions' 8 lanes reduced
// together (`lanes`: [count, kKeyBlock, 8] scratch).
template <int C, bool Tail, typename T>
void score_direct(const float* queries, int64_t count, const T* keys, int64_t t, int64_t n, int64_t high,
                  int64_t stride, float* lanes, float* scores, int64_t span) {
  constexpr int64_t head_dim = 16 * C + (Tail ? 8 : 0);
  for (int64_t u = 0; u < n; ++u) {
    const T* key = keys + (t + u) * stride;
    if (t + u + kAheadBlocks * kKeyBlock < high) {
      prefetch_lines(key + kAheadBlocks * kKeyBlock * stride, head_dim * static_cast<int64_t>(sizeof(T)));
    }
    const WideKey<C, Tail> wide(key);
    for (int64_t j = 0; j < count; ++j) {
      _mm256_storeu_ps(lanes + (j * kKeyBlock + u) * 8, wide.lanes(queries + j * head_dim));
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    const float* x = lanes + j * kKeyBlock * 8;
    for (int64_t u = 0; u < n; u += 4) {  // past n: this query's stale lanes, reduced and dropped
      float four[4];
      _mm_storeu_ps(four, reduce_four(_mm256_loadu_ps(x + u * 8), _mm256_loadu_ps(x + u * 8 + 8),
                                      _mm256_loadu_ps(x + u * 8 + 16), _mm256_loadu_ps(x + u * 8 + 24)));
      std::copy(four, four + std::min<int64_t>(4, n - u), scores + j * span + u);
    }
  }
}

// The head sizes scored straight from the cache (those whose key fits the registers); others are widened first.
// The same bits either way.
template <typename T>
void score_keys(const float* queries, int64_t count, const T* keys, int64_t t, int64_t n, int64_t high,
                int64_t stride, int64_t head_dim, float* block, float* scores, int64_t span) {
  switch (head_dim) {
    case 64: return score_direct<4, false>(queries, count, keys, t, n, high, stride, block, scores, span);
    case 72: return score_direct<4, true>(queries, count, keys, t, n, high, stride, block, scores, span);
#ifdef __AVX512F__
    case 128: return score_direct<8, false>(queries, count, keys, t, n, high, stride, block, scores, span);
    case 256: return score_direct<16, false>(queries, count, keys, t, n, high, stride, block, scores, span);
#endif
    default: return score_widened(queries, count, keys, t, n, high, stride, head_dim, block, scores, span);
  }
}

#ifdef __AVX512F__

// sums[q] [16 Z (+ 8 where Tail)] += weights[q][u] * values[u] for u = 0..n-1 in order, for NQ queries at once
// (values rows `stride` apart, widened into registers once for all of them).
template <int NQ, int Z, bool Tail, typename T>
void weigh_direct(const float* const* weights, const T* values, int64_t stride, int64_t n, float* const* sums) {
  __m512 acc[NQ][Z > 0 ? Z : 1];
  __m256 acc_tail[NQ];
  for (int q = 0; q < NQ; ++q) {
    for (int z = 0; z < Z; ++z) acc[q][z] = _mm512_loadu_ps(sums[q] + 16 * z);
    if (Tail) acc_tail[q] = _mm256_loadu_ps(sums[q] + 16 * Z);
  }
  for (int64_t u = 0; u < n; ++u) {
    const T* row = values + u * stride;
    __m512 v[Z > 0 ? Z : 1];
    for (int z = 0; z < Z; ++z) v[z] = load16(row + 16 * z);
    const __m256 v_tail = Tail ? load8(row + 16 * Z) : _mm256_setzero_ps();
    for (int q = 0; q < NQ; ++q) {
      const __m512 w = _mm512_set1_ps(weights[q][u]);
      for (int z = 0; z < Z; ++z) acc[q][z] = _mm512_fmadd_ps(w, v[z], acc[q][z]);
      if (Tail) acc_tail[q] = _mm256_fmadd_ps(_mm512_castps512_ps256(w), v_tail, acc_tail[q]);
    }
  }
  for (int q = 0; q < NQ; ++q) {
    for (int z = 0; z < Z; ++z) _mm512_storeu_ps(sums[q] + 16 * z, acc[q][z]);
    if (Tail) _mm256_storeu_ps(sums[q] + 16 * Z, acc_tail[q]);
  }
}

constexpr int kWeighQueries = 4;  // queries sharing a pass over the values, at most: 4 x 4 accumulators
constexpr int64_t kWeighDims = 64;  // dims in one pass

template <int NQ, typename T>
void weigh_piece(int64_t width, const float* const* weights, const T* values, int64_t stride, int64_t n,
                 float* const* sums) {
  switch (width) {  // 8..kWeighDims, a multiple of 8
    case 64: return weigh_direct<NQ, 4, false>(weights, values, stride, n, sums);
    case 56: return weigh_direct<NQ, 3, true>(weights, values, stride, n, sums);
    case 48: return weigh_direct<NQ, 3, false>(weights, values, stride, n, sums);
    case 40: return weigh_direct<NQ, 2, true>(weights, values, stride, n, sums);
    case 32: return weigh_direct<NQ, 2, false>(weights, values, stride, n, sums);
    case 24: return weigh_direct<NQ, 1, true>(weights, values, stride, n, sums);
    case 16: return weigh_direct<NQ, 1, false>(weights, values, stride, n, sums);
    default: return weigh_direct<NQ, 0, true>(weights, values, stride, n, sums);
  }
}

#else

// sums[q] [8 V] += weights[q][u] * values[u] for u = 0..n-1 in order, for NQ queries at once (values rows
// `stride` apart, widened into registers once for all of them).
template <int NQ, int V, typename T>
void weigh_direct(const float* const* weights, const T* values, int64_t stride, int64_t n, float* const* sums) {
  __m256 acc[NQ][V];
  for (int q = 0; q < NQ; ++q) {
    for (int i = 0; i < V; ++i) acc[q][i] = _mm256_loadu_ps(sums[q] + 8 * i);
  }
  for (int64_t u = 0; u < n; ++u) {
    __m256 v[V];
    for (int i = 0; i < V; ++i) v[i] = load8(values + u * stride + 8 * i);
    for (int q = 0; q < NQ; ++q) {
      const __m256 w = _mm256_set1_ps(weights[q][u]);
      for (int i = 0; i < V; ++i) acc[q][i] = _mm256_fmadd_ps(w, v[i], acc[q][i]);
    }
  }
  for (int q = 0; q < NQ; ++q) {
    for (int i = 0; i < V; ++i) _mm256_storeu_ps(sums[q] + 8 * i, acc[q][i]);
  }
}

constexpr int kWeighQueries = 2;  // queries sharing a pass over the values, at most: 2 x 4 accumulators
constexpr int64_t kWeighDims = 32;  // dims in one pass

template <int NQ, typename T>
void weigh_piece(int64_t width, const float* const* weights, const T* values, int64_t stride, int64_t n,
                 float* const* sums) {
  switch (width) {  // 8..kWeighDims, a multiple of 8
    case 32: return weigh_direct<NQ, 4>(weights, values, stride, n, sums);
    case 24: return weigh_direct<NQ, 3>(weights, values, stride, n, sums);
    case 16: return weigh_direct<NQ, 2>(weights, values, stride, n, sums);
    default: return weigh_direct<NQ, 1>(weights, values, stride, n, sums);
  }
}

#endif

// weigh_piece for `together` (1..kWeighQueries) queries.
template <int NQ = 1, typename T>
void weigh_together(int64_t together, int64_t width, const float* const* weights, const T* values, int64_t stride,
                    int64_t n, float* const* sums) {
  if constexpr (NQ < kWeighQueries) {
    if (together > NQ) return weigh_together<NQ + 1>(together, width, weights, values, stride, n, sums);
  }
  weigh_piece<NQ>(width, weights, values, stride, n, sums);
}

// The weighted values of positions t..t+n-1 (rows `stride` apart from `at_t`, position t's) added to each query's
// sums (out [count, head_dim]), per lane in position order: the queries that read the same positions of the block
// (a row's heads, or rows' that all read past it) take each value in one pass, kWeighDims dims at a time.
template <typename T>
void weigh_positions(const float* scores, int64_t span, int64_t low, const int64_t* begin, const int64_t* end,
                     int64_t count, const T* at_t, int64_t t, int64_t n, int64_t stride, int64_t head_dim, float* out) {
  for (int64_t j = 0; j < count;) {
    const int64_t first = std::max(t, begin[j]), last = std::min(t + n, end[j]);
    int64_t together = 1;
    while (j + together < count && together < kWeighQueries && std::max(t, begin[j + together]) == first &&
           std::min(t + n, end[j + together]) == last) {
      ++together;
    }
    for (int64_t d = 0; first < last && d < head_dim; d += kWeighDims) {
      const float* weights[kWeighQueries];
      float* sums[kWeighQueries];
      for (int64_t q = 0; q < together; ++q) {
        weights[q] = scores + (j + q) * span + first - low;
        sums[q] = out + (j + q) * head_dim + d;
      }
      const int64_t width = std::min(kWeighDims, head_dim - d);
      weigh_together(together, width, weights, at_t + (first - t) * stride + d, stride, last - first, sums);
    }
    j += together;
  }
}

// weigh_positions over a block read from the cache, asking it for the values kAheadBlocks blocks on, up to `high`.
template <typename T>
void weigh_block(const float* scores, int64_t span, int64_t low, const int64_t* begin, const int64_t* end,
                 int64_t count, const T* values, int64_t t, int64_t n, int64_t stride, int64_t head_dim,
                 int64_t high, float* out) {
  for (int64_t u = kAheadBlocks * kKeyBlock; u < std::min((kAheadBlocks + 1) * kKeyBlock, high - t); ++u) {
    prefetch_lines(values + (t + u) * stride, head_dim * static_cast<int64_t>(sizeof(T)));
  }
  weigh_positions(scores, span, low, begin, end, count, values + t * stride, t, n, stride, head_dim, out);
}

#ifdef __AVX512F__

// ---- work items of many queries (a prompt block's rows) ----
//
// Their key blocks are turned on their side once, so that a vector holds one dim of 16 positions: a query's 16 lanes
// of products become 16 vectors of 16 positions, the same multiply-adds in the same order per (query, position,
// lane), and the lanes' fixed reduction becomes vector additions, with no horizontal folds. Their values are widened
// once per chunk for every query. Both give `score_block`'s and `weigh_block`'s bits. scripts/attend_cost.py: a
// 128-row prompt block 1.35x faster on smollm2's heads, 1.25x on gemma-3's (docs/native_runtime.md, stop 47).

constexpr int64_t kManyQueries = 12;  // queries from which a work item takes this path (4 rows of 3 heads)
constexpr int64_t kWideKeys = 16;     // positions of a key block on its side
constexpr int kSideQueries = 4;       // queries scored together from one pass over such a block
constexpr int64_t kValueChunk = 64;   // positions whose values are widened together

// 16 vectors transposed in place: element c of vector r becomes element r of vector c.
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit pieces: even and odd ones of vectors i and i + 4, then i + 8 and i + 12
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Positions t..t+n-1 (n <= 16) of `keys` (rows `stride` apart) -> to [head_dim, 16] float32: dim i of position
// t + u at to[i * 16 + u], zeros past n. Asks the cache for the next block's rows, up to `high`.
template <typename T>
void keys_on_side(const T* keys, int64_t t, int64_t n, int64_t high, int64_t stride, int64_t head_dim, float* to) {
  for (int64_t u = kWideKeys; u < std::min(2 * kWideKeys, high - t); ++u) {
    prefetch_lines(keys + (t + u) * stride, head_dim * static_cast<int64_t>(sizeof(T)));
  }
  for (int64_t d = 0; d < head_dim; d += 16) {
    const int64_t width = std::min<int64_t>(16, head_dim - d);  // 16, or 8 at the tail of a head size 8 past 16s
    __m512 r[16];
    for (int64_t u = 0; u < 16; ++u) {
      const T* key = keys + (t + u) * stride + d;
      r[u] = u >= n ? _mm512_setzero_ps() : width == 16 ? load16(key) : _mm512_zextps256_ps512(load8(key));
    }
    transpose16(r);
    for (int64_t i = 0; i < width; ++i) _mm512_storeu_ps(to + (d + i) * 16, r[i]);
  }
}

// NQ queries' scores of a block on its side (`keys_on_side`) -> out[j][u] for position u. Lanes l and l + 8 of a
// query's products run as two vectors of 16 positions and are added as `WideKey::lanes` adds them (lanes 0-7 take the
// tail's 8 dims first); the 8 sums reduce as ((y0 + y1) + (y2 + y3)) + ((y4 + y5) + (y6 + y7)), as `reduce_four`.
template <int NQ>
void score_side(const float* const* q, const float* side, int64_t head_dim, float* const* out) {
  const int64_t whole = head_dim / 16 * 16;  // dims in 16-lane passes
  __m512 pairs[NQ][4];                        // y0 + y1, y2 + y3, y4 + y5, y6 + y7
  for (int l = 0; l < 8; ++l) {
    __m512 low[NQ], high[NQ];  // lanes l and l + 8
    for (int j = 0; j < NQ; ++j) low[j] = high[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < whole; c += 16) {
      const __m512 first = _mm512_loadu_ps(side + (c + l) * 16), second = _mm512_loadu_ps(side + (c + l + 8) * 16);
      for (int j = 0; j < NQ; ++j) {
        low[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][c + l]), first, low[j]);
        high[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][c + l + 8]), second, high[j]);
      }
    }
    if (whole < head_dim) {
      const __m512 tail = _mm512_loadu_ps(side + (whole + l) * 16);
      for (int j = 0; j < NQ; ++j) low[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][whole + l]), tail, low[j]);
    }
    for (int j = 0; j < NQ; ++j) {
      const __m512 y = _mm512_add_ps(low[j], high[j]);
      pairs[j][l / 2] = l % 2 == 0 ? y : _mm512_add_ps(pairs[j][l / 2], y);
    }
  }
  for (int j = 0; j < NQ; ++j) {
    const __m512 left = _mm512_add_ps(pairs[j][0], pairs[j][1]), right = _mm512_add_ps(pairs[j][2], pairs[j][3]);
    _mm512_storeu_ps(out[j], _mm512_add_ps(left, right));
  }
}

// score_side for `together` (1..kSideQueries) queries.
template <int NQ = 1>
void score_side_together(int64_t together, const float* const* q, const float* side, int64_t head_dim,
                         float* const* out) {
  if constexpr (NQ < kSideQueries) {
    if (together > NQ) return score_side_together<NQ + 1>(together, q, side, head_dim, out);
  }
  score_side<NQ>(q, side, head_dim, out);
}

// Every query's scores of positions low..high-1, 16 at a time (scores [count, span], span a multiple of 16; side:
// [head_dim, 16] scratch).
template <typename T>
void score_many(const float* queries, int64_t count, const T* keys, int64_t low, int64_t high, int64_t stride,
                int64_t head_dim, float* side, float* scores, int64_t span) {
  for (int64_t t = low; t < high; t += kWideKeys) {
    keys_on_side(keys, t, std::min(kWideKeys, high - t), high, stride, head_dim, side);
    for (int64_t j = 0; j < count; j += kSideQueries) {
      const int64_t together = std::min<int64_t>(kSideQueries, count - j);
      const float* q[kSideQueries];
      float* to[kSideQueries];
      for (int64_t i = 0; i < together; ++i) {
        q[i] = queries + (j + i) * head_dim;
        to[i] = scores + (j + i) * span + t - low;
      }
      score_side_together(together, q, side, head_dim, to);
    }
  }
}

// weigh_positions over positions low..high-1, kValueChunk at a time, each chunk's values widened once into `wide`
// [kValueChunk, head_dim] for every query: the same operations per lane.
template <typename T>
void weigh_many(const float* scores, int64_t span, int64_t low, int64_t high, const int64_t* begin, const int64_t* end,
                int64_t count, const T* values, int64_t stride, int64_t head_dim, float* wide, float* out) {
  for (int64_t t = low; t < high; t += kValueChunk) {
    const int64_t n = std::min(kValueChunk, high - t);
    for (int64_t u = 0; u < n; ++u) {
      const T* row = values + (t + u) * stride;
      if (t + u + n < high) prefetch_lines(row + n * stride, head_dim * static_cast<int64_t>(sizeof(T)));
      widen_row(row, head_dim, wide + u * head_dim);
    }
    weigh_positions<float>(scores, span, low, begin, end, count, wide, t, n, head_dim, head_dim, out);
  }
}

#endif

// One work item: queries [Q, head_dim] (float32, scaled), query j reading positions begin[j]..end[j]-1 of keys
// and values ([capacity, head_dim] rows `stride` apart) -> out [Q, head_dim] float32. scratch: reused buffers.
template <typename T>
void attend_item(const float* queries, int64_t count, const int64_t* begin, const int64_t* end, const T* keys,
                 const T* values, int64_t stride, int64_t head_dim, std::vector<float>& scratch, float* out) {
  int64_t low = begin[0], high = end[0];
  for (int64_t j = 1; j < count; ++j) {
    low = std::min(low, begin[j]);
    high = std::max(high, end[j]);
  }
#ifdef __AVX512F__
  const bool many = count >= kManyQueries;
  const int64_t unit = many ? kWideKeys : kKeyBlock;  // positions scored at a time
  const int64_t block_size = std::max({kKeyBlock * head_dim, count * kKeyBlock * 8, kValueChunk * head_dim});
#else
  constexpr bool many = false;
  constexpr int64_t unit = kKeyBlock;
  const int64_t block_size = std::max(kKeyBlock * head_dim, count * kKeyBlock * 8);
#endif
  const int64_t span = (high - low + unit - 1) / unit * unit;
  scratch.resize(count * span + block_size + count);
  float* scores = scratch.data();  // [Q, span]: query j's score of position low + t at j * span + t
  float* block = scores + count * span;  // widened positions, lanes, a key block on its side or widened values
  float* totals = block + block_size;  // [Q]: each query's sum of softmax numerators
  if (many) {
#ifdef __AVX512F__
    score_many(queries, count, keys, low, high, stride, head_dim, block, scores, span);
#endif
  } else {
    for (int64_t t = low; t < high; t += kKeyBlock) {
      score_keys(queries, count, keys, t, std::min(kKeyBlock, high - t), high, stride, head_dim, block,
                 scores + t - low, span);
    }
  }
  for (int64_t j = 0; j < count; ++j) totals[j] = softmax_numerators(scores + j * span + begin[j] - low, end[j] - begin[j]);
  std::fill(out, out + count * head_dim, 0.0f);
  if (many) {
#ifdef __AVX512F__
    weigh_many(scores, span, low, high, begin, end, count, values, stride, head_dim, block, out);
#endif
  } else {
    for (int64_t t = low; t < high; t += kKeyBlock) {
      weigh_block(scores, span, low, begin, end, count, values, t, std::min(kKeyBlock, high - t), stride, head_dim,
                  high, out);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    const __m256 inverse = _mm256_set1_ps(1.0f / totals[j]);
    for (int64_t i = 0; i < head_dim; i += 8) {
      _mm256_storeu_ps(out + j * head_dim + i, _mm256_mul_ps(_mm256_loadu_ps(out + j * head_dim + i), inverse));
    }
  }
}

#else  // portable fallback: each query on its own, in one lane

template <typename T>
void attend_item(const float* queries, int64_t count, const int64_t* begin, const int64_t* end, const T* keys,
                 const T* values, int64_t stride, int64_t head_dim, std::vector<float>& scratch, float* out) {
  for (int64_t j = 0; j < count; ++j) {
    const float* q = queries + j * head_dim;
    const int64_t length = end[j] - begin[j];
    scratch.resize(length);
    float top = -INFINITY;
    for (int64_t t = 0; t < length; ++t) {
      float dot = 0.0f;
      for (int64_t i = 0; i < head_dim; ++i) dot += q[i] * to_float(keys[(begin[j] + t) * stride + i]);
      scratch[t] = dot;
      top = std::fmax(top, dot);
    }
    float total = 0.0f;
    for (int64_t t = 0; t < length; ++t) {
      scratch[t] = std::exp(scratch[t] - top);
      total += scratch[t];
    }
    for (int64_t i = 0; i < head_dim; ++i) {
      float acc = 0.0f;
      for (int64_t u = 0; u < length; ++u) acc += scratch[u] * to_float(values[(begin[j] + u) * stride + i]);
      out[j * head_dim + i] = acc / total;
    }
  }
}

#endif

// to[i] = float(from[i]) * scale for i < n, 8 at a time where the CPU has vectors (the same products).
template <typename T>
inline void scaled_row(const T* from, int64_t n, float scale, float* to) {
  int64_t i = 0;
#ifdef QUICKDRAFT_AVX2
  for (const __m256 factor = _mm256_set1_ps(scale); i + 8 <= n; i += 8) {
    _mm256_storeu_ps(to + i, _mm256_mul_ps(load8(from + i), factor));
  }
#endif
  for (; i < n; ++i) to[i] = to_float(from[i]) * scale;
}

// Blocks of consecutive rows of one sequence, at most `kQueryRows` rows each, smaller where that would leave
// fewer than two work items per thread: (first row, row count).
std::vector<std::pair<int64_t, int64_t>> query_blocks(const int64_t* sequence, int64_t rows, int64_t kv_heads) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t most = kQueryRows;; most /= 2) {
    blocks.clear();
    for (int64_t r = 0; r < rows;) {  // a sequence's run of rows in the fewest blocks of at most `most`, as even
      int64_t run = 1;
      while (r + run < rows && sequence[r + run] == sequence[r]) ++run;
      const int64_t pieces = (run + most - 1) / most;
      for (int64_t piece = 0; piece < pieces; ++piece) {
        const int64_t n = run / pieces + (piece < run % pieces ? 1 : 0);
        blocks.emplace_back(r, n);
        r += n;
      }
    }
    if (most == 1 || static_cast<int64_t>(blocks.size()) * kv_heads >= 2 * at::get_num_threads()) return blocks;
  }
}

// Into how many parts the query heads sharing a key head are split: 1, unless single rows still leave fewer work
// items than threads (one decode row over fewer key heads than threads: gemma-3's one key head would leave one
// thread all the attention). Each part widens the cache again, so parts stop at one item per thread.
int64_t head_parts(int64_t blocks, int64_t kv_heads, int64_t group) {
  const int64_t threads = at::get_num_threads();
  return std::min(group, std::max<int64_t>(1, (threads + blocks * kv_heads - 1) / (blocks * kv_heads)));
}

template <typename T>
at::Tensor attend_rows(const at::Tensor& queries, const std::vector<at::Tensor>& keys,
                       const std::vector<at::Tensor>& values, const int64_t* sequence, const int64_t* begin,
                       const int64_t* end, double scale) {
  const int64_t rows = queries.size(0), heads = queries.size(1), head_dim = queries.size(2);
  const int64_t kv_heads = keys[0].size(0), group = heads / kv_heads;
  auto result = at::empty({rows, heads * head_dim}, queries.options());
  const T* q_all = queries.data_ptr<T>();
  T* out_all = result.data_ptr<T>();
  if (rows == 0) return result;
  const auto blocks = query_blocks(sequence, rows, kv_heads);
  const int64_t parts = head_parts(static_cast<int64_t>(blocks.size()), kv_heads, group);
  const int64_t items = static_cast<int64_t>(blocks.size()) * kv_heads * parts;
  std::atomic<int64_t> next_item{0};  // items go to whichever thread is free: their costs differ with their spans
  at::parallel_for(0, std::min<int64_t>(items, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    std::vector<float> q, out, scratch;
    std::vector<int64_t> q_begin, q_end;
    for (int64_t item = next_item++; item < items; item = next_item++) {  // (key head, block, part of its heads)
      const auto [row0, count] = blocks[item / parts % static_cast<int64_t>(blocks.size())];
      const int64_t kv = item / (parts * static_cast<int64_t>(blocks.size())), part = item % parts;
      const int64_t g0 = group * part / parts, width = group * (part + 1) / parts - g0;  // query heads g0.. of kv
      const int64_t s = sequence[row0], n = count * width;
      q.resize(n * head_dim);
      out.resize(n * head_dim);
      q_begin.resize(n);
      q_end.resize(n);
      for (int64_t r = 0; r < count; ++r) {  // query r * width + g: row row0 + r, head kv * group + g0 + g
        for (int64_t g = 0; g < width; ++g) {
          const T* q_row = q_all + ((row0 + r) * heads + kv * group + g0 + g) * head_dim;
          float* to = q.data() + (r * width + g) * head_dim;
          scaled_row(q_row, head_dim, static_cast<float>(scale), to);
          q_begin[r * width + g] = begin[row0 + r];
          q_end[r * width + g] = end[row0 + r];
        }
      }
      const int64_t stride = keys[s].stride(1);
      attend_item(q.data(), n, q_begin.data(), q_end.data(), keys[s].data_ptr<T>() + kv * keys[s].stride(0),
                  values[s].data_ptr<T>() + kv * values[s].stride(0), stride, head_dim, scratch, out.data());
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t g = 0; g < width; ++g) {
          T* out_row = out_all + (row0 + r) * heads * head_dim + (kv * group + g0 + g) * head_dim;
          const float* from = out.data() + (r * width + g) * head_dim;
          store_row(from, head_dim, out_row);
        }
      }
    }
  });
  return result;
}

// queries [R, H, hd]; keys[s], values[s] [KV, capacity, hd] (one layer of sequence s's cache, rows of hd
// contiguous); row r attends sequence[r]'s positions begin[r]..end[r]-1. Returns [R, H * hd] in the queries' dtype.
at::Tensor attend(at::Tensor queries, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                  at::Tensor sequence, at::Tensor begin, at::Tensor end, double scale) {
  TORCH_CHECK(queries.dim() == 3 && queries.is_contiguous(), "queries must be a contiguous [R, H, hd] tensor");
  TORCH_CHECK(!keys.empty() && keys.size() == values.size(), "give one key and one value tensor per sequence");
  const int64_t rows = queries.size(0), head_dim = queries.size(2);
  for (const auto* index : {&sequence, &begin, &end}) {
    TORCH_CHECK(index->scalar_type() == at::kLong && index->dim() == 1 && index->size(0) == rows &&
                index->is_contiguous(), "sequence, begin and end must be int64 [R]");
  }
  for (size_t s = 0; s < keys.size(); ++s) {
    for (const auto* t : {&keys[s], &values[s]}) {
      TORCH_CHECK(t->dim() == 3 && t->size(2) == head_dim && t->stride(2) == 1 && t->size(0) == keys[0].size(0) &&
                  t->scalar_type() == queries.scalar_type(), "keys and values must be [KV, capacity, hd] like queries");
    }
    TORCH_CHECK(keys[s].strides() == values[s].strides(), "keys and values must be laid out alike");
  }
  TORCH_CHECK(queries.size(1) % keys[0].size(0) == 0, "query heads must be a multiple of key heads");
#ifdef QUICKDRAFT_AVX2
  TORCH_CHECK(head_dim % 8 == 0, "head_dim must be a multiple of 8");
#endif
  const int64_t* s = sequence.data_ptr<int64_t>();
  const int64_t* b = begin.data_ptr<int64_t>();
  const int64_t* e = end.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(s[r] >= 0 && s[r] < static_cast<int64_t>(keys.size()), "row ", r, " names no sequence");
    TORCH_CHECK(0 <= b[r] && b[r] < e[r] && e[r] <= keys[s[r]].size(1), "row ", r, " has an empty or outside span");
  }
  if (queries.scalar_type() == at::kBFloat16) {
    return attend_rows<c10::BFloat16>(queries, keys, values, s, b, e, scale);
  }
  TORCH_CHECK(queries.scalar_type() == at::kFloat, "queries must be float32 or bfloat16");
  return attend_rows<float>(queries, keys, values, s, b, e, scale);
}

// ---- the index of each row's largest value ----

// torch.argmax's answer for one row: the first index of its maximum, where a NaN is larger than any number (the
// first NaN wins). Two passes: the maximum (and whether any NaN), then the first position equal to it.
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  int64_t i = 0;
  float top = -INFINITY;
  bool nan = false;
#ifdef QUICKDRAFT_AVX2
  __m256 tops[4] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY),
                    _mm256_set1_ps(-INFINITY)};
  __m256 unordered = _mm256_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    for (int v = 0; v < 4; ++v) {
      const __m256 values = load8(x + i + 8 * v);
      tops[v] = _mm256_max_ps(tops[v], values);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(values, values, _CMP_UNORD_Q));
    }
  }
  nan = _mm256_movemask_ps(unordered) != 0;
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(tops[0], tops[1]), _mm256_max_ps(tops[2], tops[3])));
  for (float lane : lanes) top = std::max(top, lane);
#endif
  for (; i < n; ++i) {
    const float value = to_float(x[i]);
    nan = nan || std::isnan(value);
    top = std::max(top, value);
  }
  if (nan) {
    for (i = 0; !std::isnan(to_float(x[i])); ++i) {
    }
    return i;
  }
  i = 0;
#ifdef QUICKDRAFT_AVX2
  const __m256 wanted = _mm256_set1_ps(top);
  for (; i + 8 <= n; i += 8) {
    const int equal = _mm256_movemask_ps(_mm256_cmp_ps(load8(x + i), wanted, _CMP_EQ_OQ));
    if (equal != 0) return i + __builtin_ctz(static_cast<unsigned>(equal));
  }
#endif
  for (; to_float(x[i]) != top; ++i) {
  }
  return i;
}

// xs[i] [R_i, V_i] float32 or bfloat16, contiguous, V_i > 0 -> int64 [R_0 + R_1 + ...]: each row's argmax as
// torch.argmax(x, -1) gives it, the rows of xs[0], then of xs[1], ... Rows go to threads (each row's answer is its
// own): the engine asks for every greedy request's verification rows of a step in one call.
at::Tensor argmax(std::vector<at::Tensor> xs) {
  std::vector<std::pair<int64_t, int64_t>> rows;  // (tensor, row)
  for (size_t i = 0; i < xs.size(); ++i) {
    const at::Tensor& x = xs[i];
    TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.is_contiguous(), "each x must be a contiguous [R, V] tensor, V > 0");
    TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
    for (int64_t r = 0; r < x.size(0); ++r) rows.emplace_back(static_cast<int64_t>(i), r);
  }
  auto result = at::empty({static_cast<int64_t>(rows.size())}, at::TensorOptions().dtype(at::kLong));
  int64_t* out = result.data_ptr<int64_t>();
  at::parallel_for(0, static_cast<int64_t>(rows.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const at::Tensor& x = xs[rows[i].first];
      const int64_t n = x.size(1), offset = rows[i].second * n;
      out[i] = x.scalar_type() == at::kBFloat16 ? argmax_row(x.data_ptr<c10::BFloat16>() + offset, n)
                                                : argmax_row(x.data_ptr<float>() + offset, n);
    }
  });
  return result;
}

// ---- a row's softmax at a temperature: the sampler's probabilities ----

// One row x [n] -> out [n] float32 in three passes over it: the largest y = x * (1 / temperature); each numerator
// e^(y - that) (`exp_nonpositive`; exactly 0 where x is -inf: a token top-k or top-p removed) and their sum (8
// lanes in position order, 16 positions at a time where vectors are 512 bits, as `softmax_numerators` adds them,
// the last few positions' lanes padded with zeros; then `lanes_sum`); each numerator times the sum's reciprocal.
// The exponential's clamp gives a value more than 87 below the largest (and a NaN) e^-87 where torch's would give
// 0 (or NaN): a token that unlikely stays that unlikely, and every path of the vector builds treats it alike.
template <typename T>
void softmax_row(const T* x, int64_t n, float temperature, float* out) {
  const float inverse_temperature = 1.0f / temperature;
#ifdef QUICKDRAFT_AVX2
  const __m256 scale = _mm256_set1_ps(inverse_temperature), minus_infinity = _mm256_set1_ps(-INFINITY);
  __m256 top8 = minus_infinity;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) top8 = _mm256_max_ps(top8, load8(x + i));
  float lanes[8];
  _mm256_storeu_ps(lanes, top8);
  float top = -INFINITY;
  for (float lane : lanes) top = std::max(top, lane);
  for (; i < n; ++i) top = std::max(top, to_float(x[i]));
  top *= inverse_temperature;  // the largest y: scaling by a positive factor keeps the order
  const __m256 shift = _mm256_set1_ps(top);
  const auto numerators = [&](__m256 values) {  // x -> e^(y - top), 0 where x is -inf
    const __m256 removed = _mm256_cmp_ps(values, minus_infinity, _CMP_EQ_OQ);
    return _mm256_andnot_ps(removed, exp_nonpositive(_mm256_sub_ps(_mm256_mul_ps(values, scale), shift)));
  };
  __m256 total8 = _mm256_setzero_ps();
  i = 0;
#ifdef __AVX512F__
  const __m512 wide_scale = _mm512_set1_ps(inverse_temperature), wide_shift = _mm512_set1_ps(top);
  for (; i + 16 <= n; i += 16) {  // the same lanes' operations as 8 at a time, twice
    const __m512 values = load16(x + i);
    const __mmask16 kept = _mm512_cmp_ps_mask(values, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);  // NaN kept
    const __m512 e = _mm512_maskz_mov_ps(
        kept, exp_nonpositive(_mm512_sub_ps(_mm512_mul_ps(values, wide_scale), wide_shift)));
    _mm512_storeu_ps(out + i, e);
    total8 = _mm256_add_ps(total8, _mm512_castps512_ps256(e));
    total8 = _mm256_add_ps(total8, high_half(e));
  }
#endif
  for (; i + 8 <= n; i += 8) {
    const __m256 e = numerators(load8(x + i));
    _mm256_storeu_ps(out + i, e);
    total8 = _mm256_add_ps(total8, e);
  }
  if (i < n) {
    float tail[8];
    for (int64_t j = 0; j < 8; ++j) tail[j] = i + j < n ? to_float(x[i + j]) : -INFINITY;
    _mm256_storeu_ps(tail, numerators(_mm256_loadu_ps(tail)));
    std::copy(tail, tail + (n - i), out + i);
    total8 = _mm256_add_ps(total8, _mm256_loadu_ps(tail));
  }
  const float inverse_total = 1.0f / lanes_sum(total8);
  const __m256 factor = _mm256_set1_ps(inverse_total);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), factor));
  for (; i < n; ++i) out[i] *= inverse_total;
#else
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, to_float(x[i]));
  top *= inverse_temperature;
  double total = 0.0;  // one lane: in float64, so that a vocabulary's many additions round no worse than 8 lanes'
  for (int64_t i = 0; i < n; ++i) {
    const float y = to_float(x[i]) * inverse_temperature;
    out[i] = to_float(x[i]) == -INFINITY ? 0.0f : std::exp(std::fmax(y - top, -87.0f));  // the vectors' clamp
    total += out[i];
  }
  const float inverse_total = static_cast<float>(1.0 / total);
  for (int64_t i = 0; i < n; ++i) out[i] *= inverse_total;
#endif
}

// x [R, V] float32 or bfloat16, contiguous, every row with a finite value; temperature > 0 -> float32 [R, V]: each
// row's softmax of x / temperature (`softmax_row`), rows shared out between the threads.
at::Tensor softmax(at::Tensor x, double temperature) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.is_contiguous(), "x must be a contiguous [R, V] tensor, V > 0");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(temperature > 0.0, "temperature must be positive");
  const int64_t rows = x.size(0), n = x.size(1);
  auto result = at::empty({rows, n}, x.options().dtype(at::kFloat));
  float* out = result.data_ptr<float>();
  const float t = static_cast<float>(temperature);
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      if (x.scalar_type() == at::kBFloat16) {
        softmax_row(x.data_ptr<c10::BFloat16>() + r * n, n, t, out + r * n);
      } else {
        softmax_row(x.data_ptr<float>() + r * n, n, t, out + r * n);
      }
    }
  });
  return result;
}

// ---- rotary embeddings and the gated activation, each row on its own ----

// x [N, heads, hd] with rows `row_stride` apart (a row's heads contiguous); cos, sin_signed [N, hd]:
// out = x * cos + x with its halves swapped * sin_signed, in float32, rounded once -> [N, heads, hd] contiguous.
template <typename T>
void rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin_signed, at::Tensor& result) {
  const int64_t rows = x.size(0), heads = x.size(1), head_dim = x.size(2), half = head_dim / 2;
  const int64_t row_stride = x.stride(0);
  const T* in_all = x.data_ptr<T>();
  const T* cos_all = cos.data_ptr<T>();
  const T* sin_all = sin_signed.data_ptr<T>();
  T* out_all = result.data_ptr<T>();
  at::parallel_for(0, rows, 8, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* c = cos_all + r * head_dim;
      const T* s = sin_all + r * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        const T* in = in_all + r * row_stride + h * head_dim;
        T* out = out_all + (r * heads + h) * head_dim;
        int64_t i = 0;
#ifdef QUICKDRAFT_AVX2
        if (half % 8 == 0) {  // the loop below's two products and sum, rounded the same
          for (; i < head_dim; i += 8) {
            const __m256 swapped = load8(in + (i < half ? i + half : i - half));
            store8(out + i, _mm256_add_ps(_mm256_mul_ps(load8(in + i), load8(c + i)), _mm256_mul_ps(swapped, load8(s + i))));
          }
        }
#endif
        for (; i < head_dim; ++i) {
          const float swapped = to_float(in[i < half ? i + half : i - half]);
          out[i] = static_cast<T>(to_float(in[i]) * to_float(c[i]) + swapped * to_float(s[i]));
        }
      }
    }
  });
}

at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin_signed) {
  TORCH_CHECK(x.dim() == 3 && x.device().is_cpu() && x.stride(2) == 1 && x.stride(1) == x.size(2),
              "x must be a CPU [N, heads, hd] tensor whose rows hold their heads contiguously");
  TORCH_CHECK(x.size(2) % 2 == 0, "head_dim must be even");
  for (const auto* t : {&cos, &sin_signed}) {
    TORCH_CHECK(t->is_contiguous() && t->numel() == x.size(0) * x.size(2) && t->scalar_type() == x.scalar_type(),
                "cos and sin_signed must be contiguous [N, 1, hd] in x's dtype");
  }
  auto result = at::empty({x.size(0), x.size(1), x.size(2)}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    rotate_rows<c10::BFloat16>(x, cos, sin_signed, result);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32 or bfloat16");
    rotate_rows<float>(x, cos, sin_signed, result);
  }
  return result;
}

// gate_up [N, 2I] (gate columns, then up) -> silu(gate) * up [N, I], in float32, rounded once.
template <typename T>
void silu_rows(const at::Tensor& gate_up, at::Tensor& result) {
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  const T* in_all = gate_up.data_ptr<T>();
  T* out_all = result.data_ptr<T>();
  at::parallel_for(0, rows, 4, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* gate = in_all + r * 2 * width;
      const T* up = gate + width;
      T* out = out_all + r * width;
      int64_t i = 0;
#ifdef QUICKDRAFT_AVX2
      const __m256 one = _mm256_set1_ps(1.0f);
      // silu(g) = g / (1 + e^-g), through e = e^-|g| so the exp never overflows: sigmoid(g) = 1 / (1 + e) for g >= 0,
      // e / (1 + e) below, the numerator chosen by g's sign bit before the one division; outputs i..i+7
      const auto store_silu = [&](int64_t i, __m256 g, __m256 e) {
        const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, g), _mm256_add_ps(one, e));
        store8(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), load8(up + i)));
      };
#ifdef __AVX512F__
      for (; i + 16 <= width; i += 16) {  // the exponentials 16 at a time: the same bits per lane
        const __m512 g = load16(gate + i);
        const __m512 e = exp_nonpositive(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN))));
        store_silu(i, _mm512_castps512_ps256(g), _mm512_castps512_ps256(e));
        store_silu(i + 8, high_half(g), high_half(e));
      }
#endif
      for (; i + 8 <= width; i += 8) {
        const __m256 g = load8(gate + i);
        store_silu(i, g, exp_nonpositive(_mm256_or_ps(g, _mm256_set1_ps(-0.0f))));
      }
#endif
      for (; i < width; ++i) {
        const float g = to_float(gate[i]);
        const float e = std::exp(-std::fabs(g));
        const float sigmoid = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        out[i] = static_cast<T>(g * sigmoid * to_float(up[i]));
      }
    }
  });
}

at::Tensor silu_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.device().is_cpu() && gate_up.size(1) % 2 == 0,
              "gate_up must be a contiguous CPU [N, 2 I] matrix");
  auto result = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  if (gate_up.scalar_type() == at::kBFloat16) {
    silu_rows<c10::BFloat16>(gate_up, result);
  } else {
    TORCH_CHECK(gate_up.scalar_type() == at::kFloat, "gate_up must be float32 or bfloat16");
    silu_rows<float>(gate_up, result);
  }
  return result;
}

// ---- RMS norm of each row, in float32 ----

template <typename T>
void normalize_row(const T* x, const T* weight, int64_t width, float eps, T* out) {
  float squares = 0.0f;
#ifdef QUICKDRAFT_AVX2
  if (width % 8 == 0) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < width; i += 8) {
      const __m256 v = load8(x + i);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    squares = lanes_sum(acc);
  } else {
    for (int64_t i = 0; i < width; ++i) squares += to_float(x[i]) * to_float(x[i]);
  }
#else
  for (int64_t i = 0; i < width; ++i) squares += to_float(x[i]) * to_float(x[i]);
#endif
  const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
  int64_t i = 0;
#ifdef QUICKDRAFT_AVX2
  const __m256 inverse8 = _mm256_set1_ps(inverse);
  for (; i + 8 <= width; i += 8) {  // the loop below's two products, rounded the same
    const __m256 scaled = _mm256_mul_ps(load8(x + i), inverse8);
    store8(out + i, weight == nullptr ? scaled : _mm256_mul_ps(scaled, load8(weight + i)));
  }
#endif
  for (; i < width; ++i) {
    const float scaled = to_float(x[i]) * inverse;
    out[i] = static_cast<T>(weight == nullptr ? scaled : scaled * to_float(weight[i]));
  }
}

template <typename T>
void normalize_rows(const at::Tensor& x, const c10::optional<at::Tensor>& weight, double eps, int64_t rows,
                    int64_t width, at::Tensor& result) {
  const T* w = weight.has_value() ? weight->data_ptr<T>() : nullptr;
  const T* in = x.data_ptr<T>();
  T* out = result.data_ptr<T>();
  at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      normalize_row(in + r * width, w, width, static_cast<float>(eps), out + r * width);
    }
  });
}

// x [..., d] contiguous float32 or bfloat16; weight [d] of x's dtype or none -> x / rms(x) * weight, per row,
// in float32, rounded once to x's dtype.
at::Tensor rms_norm(at::Tensor x, c10::optional<at::Tensor> weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && x.device().is_cpu() && x.dim() >= 1, "x must be a contiguous CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  const int64_t width = x.size(-1), rows = width == 0 ? 0 : x.numel() / width;
  if (weight.has_value()) {
    TORCH_CHECK(weight->is_contiguous() && weight->dim() == 1 && weight->size(0) == width &&
                weight->scalar_type() == x.scalar_type(), "weight must be [d] in x's dtype");
  }
  auto result = at::empty_like(x);
  if (x.scalar_type() == at::kBFloat16) {
    normalize_rows<c10::BFloat16>(x, weight, eps, rows, width, result);
  } else {
    normalize_rows<float>(x, weight, eps, rows, width, result);
  }
  return result;
}

}  // namespace quickdraft

TORCH_LIBRARY(quickdraft, m) {
  m.def("four_bit_matmul(Tensor x, Tensor packed, int outputs) -> Tensor");
  m.def("eight_bit_matmul(Tensor x, Tensor packed, int outputs) -> Tensor");
  m.def("attend(Tensor queries, Tensor[] keys, Tensor[] values, Tensor sequence, Tensor begin, Tensor end, "
        "float scale) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor");
  m.def("rope(Tensor x, Tensor cos, Tensor sin_signed) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("argmax(Tensor[] xs) -> Tensor");
  m.def("softmax(Tensor x, float temperature) -> Tensor");
}

TORCH_LIBRARY_IMPL(quickdraft, CPU, m) {
  m.impl("four_bit_matmul", &quickdraft::four_bit_matmul);
  m.impl("eight_bit_matmul", &quickdraft::eight_bit_matmul);
  m.impl("attend", &quickdraft::attend);
  m.impl("rms_norm", &quickdraft::rms_norm);
  m.impl("rope", &quickdraft::rope);
  m.impl("silu_mul", &quickdraft::silu_mul);
  m.impl("argmax", &quickdraft::argmax);
  m.impl("softmax", &quickdraft::softmax);
}
