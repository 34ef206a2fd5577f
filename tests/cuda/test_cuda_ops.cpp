// The CUDA backend's ops (backend/cuda/cuda_ops.h) against the CPU reference, and their batch
// invariance. Every test skips itself where no CUDA device answers.
//
//  * get_rows: every weight type, bitwise the CPU's dequantize_row (the same float arithmetic).
//  * matmul: every weight type, shapes with rows not a multiple of the 8-row tiling (37, 70 rows),
//    partial 1024-column chunks, partial 32-element units (float types, cols 172 / 100), n = 1,
//    3, 8, 16, 33: within a bound relative to sum |w x| of a double reference over the
//    CPU-dequantized weights; for the types that quantize x (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) tightly
//    against a double reference over x quantized by the CPU's quantize_activations_ref, and
//    loosely (within the quantization error) against float x; and BATCH INVARIANCE: each token row of the n = 3, 8, 16, 33 calls is bitwise the
//    n = 1 call on that token.
//  * rmsnorm (also in place), add, swiglu, swiglu_rows, rope (both styles, partial rope_dim,
//    several bases / scales) against the CPU ops.
//  * kv_write (f16 rounding bitwise as the CPU's fp32_to_fp16, untouched slots stay untouched),
//    kv_copy_slot over several layers.
//  * paged_attention against the CPU attention() over a contiguous float cache holding the same
//    values: causal, tree mask, a row that sees nothing, GQA 9 / 3 heads head_dim 64 and 4 / 1
//    heads head_dim 128, n_past 0 / 37 / 700, f16 and f32, 16-slot blocks in a scattered table,
//    every other block of the pool NaN. Batch invariance: every sequence alone gives the bits
//    of the batched call; causal row i gives the bits of a decode (n_new = 1) at n_past + i; a
//    tree row gives the bits of a decode over its visible slots compacted into fresh blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/ggml_type.h"
#include "common/random_blocks.h"
#include "util/check.h"

namespace specdec {
namespace {

using test::put_f16;
using test::random_block;

const GgmlType kAllTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                              GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

const char* type_name(GgmlType t) {
  return ggml_type_traits(t).name;
}

// ---- device helpers ---------------------------------------------------------------------------

template <class T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  cuda::upload(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> from_device(const void* p, size_t count) {
  std::vector<T> v(count);
  cuda::download(v.data(), p, count * sizeof(T));
  return v;
}

int64_t first_bit_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, 4) != 0) return i;
  }
  return -1;
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// ---- weights ----------------------------------------------------------------------------------

struct HostWeights {
  GgmlType type;
  int64_t rows, cols, row_bytes;
  std::vector<uint8_t> data;
  WeightMatrix cpu() const {
    WeightMatrix w;
    w.type = type;
    w.data = data.data();
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = row_bytes;
    return w;
  }
  // All rows dequantized by the CPU: [rows, cols].
  std::vector<float> dequantized() const {
    std::vector<float> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(cpu(), r, out.data() + r * cols);
    return out;
  }
};

HostWeights make_weights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  HostWeights w{type, rows, cols, ggml_row_bytes(type, cols), {}};
  w.data.resize(static_cast<size_t>(rows * w.row_bytes));
  const GgmlTypeTraits& t = ggml_type_traits(type);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data.data() + r * w.row_bytes;
    if (t.block_size == 1) {
      for (int64_t k = 0; k < cols; ++k) {
        const float v = normal(rng);
        if (type == GgmlType::kF32) {
          std::memcpy(row + 4 * k, &v, 4);
        } else {
          const uint16_t h = type == GgmlType::kF16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
          std::memcpy(row + 2 * k, &h, 2);
        }
      }
      continue;
    }
    for (int64_t b = 0; b < cols / t.block_size; ++b) random_block(type, rng, row + b * t.block_bytes);
  }
  return w;
}

struct DeviceWeights {
  cuda::DeviceBuffer buf;
  cuda::DeviceMatrix m;
};

DeviceWeights upload_weights(const HostWeights& w) {
  DeviceWeights d;
  d.buf = to_device(w.data);
  d.m.type = w.type;
  d.m.data = d.buf.data();
  d.m.rows = w.rows;
  d.m.cols = w.cols;
  d.m.row_bytes = w.row_bytes;
  return d;
}

// Column counts for a type: a full chunk multiple, partial chunks, a short row.
std::vector<int64_t> cols_for(GgmlType type) {
  const int64_t bs = ggml_type_traits(type).block_size;
  if (bs == 256) return {4096, 768, 2304};
  if (bs == 32) return {4096, 576, 1056};
  return {4096, 576, 172, 100};  // float types: 172 / 100 are not multiples of 32
}

// ---- get_rows ---------------------------------------------------------------------------------

TEST(CudaOps, GetRowsBitwiseEveryType) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (GgmlType type : kAllTypes) {
    for (int64_t cols : cols_for(type)) {
      SCOPED_TRACE(std::string(type_name(type)) + " cols " + std::to_string(cols));
      const int64_t rows = 37;
      const HostWeights w = make_weights(type, rows, cols, 1000 + static_cast<uint32_t>(cols));
      const std::vector<float> ref = w.dequantized();
      DeviceWeights dw = upload_weights(w);
      const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 35, 20};
      cuda::DeviceBuffer d_ids = to_device(ids);
      const int64_t n = static_cast<int64_t>(ids.size());
      cuda::DeviceBuffer d_out(static_cast<size_t>(n * cols) * 4);
      cuda::get_rows(dw.m, d_ids.as<int32_t>(), n, d_out.as<float>());
      const std::vector<float> out = from_device<float>(d_out.data(), static_cast<size_t>(n * cols));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t diff =
            first_bit_difference(out.data() + i * cols, ref.data() + ids[i] * cols, cols);
        ASSERT_EQ(diff, -1) << "row " << ids[i] << " col " << diff << ": gpu "
                            << out[i * cols + diff] << " cpu " << ref[ids[i] * cols + diff];
      }
    }
  }
}

// ---- matmul -----------------------------------------------------------------------------------

// The types whose matmul quantizes x (int8 blocks of 32, as the CPU's quantized path).
bool quantizes_activations(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 ||
         type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
}

// Reference of one (token, row) over the activations quantized by the CPU's
// quantize_activations_ref (qx, dx of that token): sum over blocks of
//   dw * dx * sum_j (q_w[j] - offset) * q_x[j]  +  mw * dx * S32   in double; *mag: the sum of the
// magnitudes of the terms; *qerr: a bound of |that - the float-x product|, from |x - dx q_x| <=
// dx / 2.
double quantized_reference(const HostWeights& w, int64_t r, const int8_t* qx, const float* dx,
                           double* mag, double* qerr) {
  const QuantLayout layout = quant_layout(w.type);
  const uint8_t* row = w.data.data() + r * w.row_bytes;
  uint8_t q[32];
  double sum = 0.0;
  *mag = 0.0;
  *qerr = 0.0;
  for (int64_t b = 0; b < w.cols / 32; ++b) {
    float dw = 0.0f, mw = 0.0f;
    decode_sub_block(w.type, row, b, q, &dw, &mw);
    int64_t isum = 0, s32 = 0, wsum = 0;
    for (int j = 0; j < 32; ++j) {
      isum += (static_cast<int64_t>(q[j]) - layout.offset) * qx[b * 32 + j];
      s32 += qx[b * 32 + j];
      wsum += std::abs(static_cast<int64_t>(q[j]) - layout.offset);
    }
    const double t = static_cast<double>(dw) * dx[b] * static_cast<double>(isum);
    const double m = static_cast<double>(mw) * dx[b] * static_cast<double>(s32);
    sum += t + m;
    *mag += std::fabs(t) + std::fabs(m);
    // |w_j| <= |dw| |q_j - offset| + |mw|
    *qerr += (std::fabs(static_cast<double>(dw)) * static_cast<double>(wsum) +
              32.0 * std::fabs(static_cast<double>(mw))) * 0.5 * dx[b];
  }
  return sum;
}

TEST(CudaOps, MatmulEveryTypeAgainstReference) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const int64_t kNs[] = {1, 3, 8, 16, 33};
  for (GgmlType type : kAllTypes) {
    const bool quantized_x = quantizes_activations(type);
    for (int64_t cols : cols_for(type)) {
      for (int64_t rows : {int64_t{37}, int64_t{8}, int64_t{70}}) {
        SCOPED_TRACE(std::string(type_name(type)) + " rows " + std::to_string(rows) + " cols " +
                     std::to_string(cols));
        const HostWeights w = make_weights(type, rows, cols, 77 + static_cast<uint32_t>(cols + rows));
        const std::vector<float> wf = w.dequantized();
        DeviceWeights dw = upload_weights(w);
        std::mt19937 rng(static_cast<uint32_t>(cols * 3 + rows));
        const int64_t n_max = 33;
        std::vector<float> x = random_floats(rng, n_max * cols, -1.0f, 1.0f);
        for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>(2 * cols + k)] *= 1e-3f;  // small row
        for (int64_t k = 0; k < 32; ++k) x[static_cast<size_t>(4 * cols + k)] = 0.0f;  // zero block
        // The CPU's activation quantization of every token.
        std::vector<int8_t> xq(static_cast<size_t>(n_max * cols));
        std::vector<float> xd(static_cast<size_t>(n_max * cols / 32));
        std::vector<int32_t> xs(static_cast<size_t>(n_max * cols / 16));
        if (quantized_x) {
          for (int64_t t = 0; t < n_max; ++t) {
            detail::quantize_activations_ref(x.data() + t * cols, cols, xq.data() + t * cols,
                                             xd.data() + t * (cols / 32), xs.data() + t * (cols / 16));
          }
        }
        cuda::DeviceBuffer d_x = to_device(x);
        cuda::DeviceBuffer d_y(static_cast<size_t>(n_max * rows) * 4);
        for (int64_t n : kNs) {
          cuda::zero(d_y.data(), d_y.bytes());
          cuda::matmul(dw.m, d_x.as<float>(), n, d_y.as<float>());
          const std::vector<float> y = from_device<float>(d_y.data(), static_cast<size_t>(n * rows));
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              double ref = 0.0, mag = 0.0;
              for (int64_t k = 0; k < cols; ++k) {
                const double p = static_cast<double>(wf[r * cols + k]) * x[t * cols + k];
                ref += p;
                mag += std::fabs(p);
              }
              const double got = y[t * rows + r];
              if (!quantized_x) {
                ASSERT_LE(std::fabs(got - ref), 1e-5 * mag + 1e-6)
                    << "n " << n << " token " << t << " row " << r << ": gpu " << got << " ref "
                    << ref;
                continue;
              }
              // Tight: against the product over the CPU-quantized x. Loose: against float x,
              // within the quantization error.
              double qmag = 0.0, qerr = 0.0;
              const double qref = quantized_reference(w, r, xq.data() + t * cols,
                                                      xd.data() + t * (cols / 32), &qmag,
                                                      &qerr);
              ASSERT_LE(std::fabs(got - qref), 2e-6 * qmag + 1e-7)
                  << "n " << n << " token " << t << " row " << r << ": gpu " << got
                  << " quantized-x ref " << qref;
              ASSERT_LE(std::fabs(got - ref), 1.001 * qerr + 1e-5 * mag + 1e-6)
                  << "n " << n << " token " << t << " row " << r << ": gpu " << got
                  << " float-x ref " << ref;
            }
          }
        }
      }
    }
  }
}

TEST(CudaOps, MatmulBatchInvariantEveryType) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (GgmlType type : kAllTypes) {
    for (int64_t cols : cols_for(type)) {
      SCOPED_TRACE(std::string(type_name(type)) + " cols " + std::to_string(cols));
      const int64_t rows = 45;
      const HostWeights w = make_weights(type, rows, cols, 5 + static_cast<uint32_t>(cols));
      DeviceWeights dw = upload_weights(w);
      std::mt19937 rng(static_cast<uint32_t>(cols));
      const int64_t n_max = 33;
      const std::vector<float> x = random_floats(rng, n_max * cols, -2.0f, 2.0f);
      cuda::DeviceBuffer d_x = to_device(x);
      // Each token alone.
      cuda::DeviceBuffer d_one(static_cast<size_t>(n_max * rows) * 4);
      for (int64_t t = 0; t < n_max; ++t) {
        cuda::matmul(dw.m, d_x.as<float>() + t * cols, 1, d_one.as<float>() + t * rows);
      }
      const std::vector<float> one = from_device<float>(d_one.data(), static_cast<size_t>(n_max * rows));
      cuda::DeviceBuffer d_y(static_cast<size_t>(n_max * rows) * 4);
      for (int64_t n : {int64_t{2}, int64_t{3}, int64_t{5}, int64_t{8}, int64_t{16}, int64_t{33}}) {
        cuda::zero(d_y.data(), d_y.bytes());
        cuda::matmul(dw.m, d_x.as<float>(), n, d_y.as<float>());
        const std::vector<float> y = from_device<float>(d_y.data(), static_cast<size_t>(n * rows));
        const int64_t diff = first_bit_difference(y.data(), one.data(), n * rows);
        ASSERT_EQ(diff, -1) << "n " << n << ": token " << diff / rows << " row " << diff % rows
                            << " batched " << y[diff] << " alone " << one[diff];
      }
      // A batch that starts at another token (the tile positions shift).
      cuda::zero(d_y.data(), d_y.bytes());
      cuda::matmul(dw.m, d_x.as<float>() + 5 * cols, 20, d_y.as<float>());
      const std::vector<float> y = from_device<float>(d_y.data(), static_cast<size_t>(20 * rows));
      const int64_t diff = first_bit_difference(y.data(), one.data() + 5 * rows, 20 * rows);
      ASSERT_EQ(diff, -1) << "offset batch: token " << 5 + diff / rows << " row " << diff % rows;
    }
  }
}

}  // namespace
namespace cuda::detail {
// cuda_matmul_q32.cu: the largest n that takes the GEMV kernel (0: every n takes the mma kernel);
// returns the previous value.
int64_t q32_set_gemv_max_n(int64_t n);
// The kernel variants (kind 0: GEMV, 1: mma; 0 = the default) and the early PDL triggers; the
// setters return the previous value.
int q32_variant_count(int kind);
const char* q32_variant_name(int kind, int i);
int q32_set_variant(int kind, int i);
bool q32_set_pdl_early(bool on);
}  // namespace cuda::detail
namespace {

// The two kernels of the types that quantize x - the GEMV (small n) and the int8 mma kernel -
// give every token bitwise the same result: each token alone (n = 1, GEMV) against batches
// through either kernel, at every GEMV tile width (1, 2, 4, 8, 16 tokens), rows that leave
// partial row groups, cols with a partial last step of 16 blocks (576 = 18 blocks, 1056) and
// long rows (14336).
TEST(CudaOps, MatmulGemvAndMmaBitwiseEqual) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const GgmlType kFast[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                            GgmlType::kQ5_1};
  const int64_t kRows[] = {37, 70, 4096};
  const int64_t kCols[] = {576, 1056, 1536, 4096, 14336};
  struct Restore {  // the default dispatch again, also when an assertion returns early
    int64_t saved = cuda::detail::q32_set_gemv_max_n(8);
    ~Restore() { cuda::detail::q32_set_gemv_max_n(saved); }
  } restore;
  for (GgmlType type : kFast) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        SCOPED_TRACE(std::string(type_name(type)) + " rows " + std::to_string(rows) + " cols " +
                     std::to_string(cols));
        const HostWeights w =
            make_weights(type, rows, cols, 11 + static_cast<uint32_t>(rows * 7 + cols));
        DeviceWeights dw = upload_weights(w);
        std::mt19937 rng(static_cast<uint32_t>(rows + cols));
        const int64_t n_max = 33;
        std::vector<float> x = random_floats(rng, n_max * cols, -2.0f, 2.0f);
        for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>(3 * cols + k)] *= 1e-4f;
        for (int64_t k = 0; k < 64; ++k) x[static_cast<size_t>(6 * cols + k)] = 0.0f;  // zero blocks
        cuda::DeviceBuffer d_x = to_device(x);
        cuda::DeviceBuffer d_one(static_cast<size_t>(n_max * rows) * 4);
        cuda::detail::q32_set_gemv_max_n(8);
        for (int64_t t = 0; t < n_max; ++t) {  // GEMV, one token
          cuda::matmul(dw.m, d_x.as<float>() + t * cols, 1, d_one.as<float>() + t * rows);
        }
        const std::vector<float> one =
            from_device<float>(d_one.data(), static_cast<size_t>(n_max * rows));
        cuda::DeviceBuffer d_y(static_cast<size_t>(n_max * rows) * 4);
        // max_n 0: every n on the mma kernel (n = 1 included); 8: the default; 16: the GEMV's
        // 16-token tiles.
        for (int64_t max_n : {int64_t{0}, int64_t{8}, int64_t{16}}) {
          cuda::detail::q32_set_gemv_max_n(max_n);
          for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{8},
                            int64_t{12}, int64_t{16}, int64_t{33}}) {
            if (n == 1 && max_n != 0) continue;
            cuda::zero(d_y.data(), d_y.bytes());
            cuda::matmul(dw.m, d_x.as<float>(), n, d_y.as<float>());
            const std::vector<float> y =
                from_device<float>(d_y.data(), static_cast<size_t>(n * rows));
            const int64_t diff = first_bit_difference(y.data(), one.data(), n * rows);
            ASSERT_EQ(diff, -1) << "gemv max n " << max_n << ", n " << n << ": token "
                                << diff / rows << " row " << diff % rows << " batched "
                                << y[diff] << " alone " << one[diff];
          }
        }
        // A batch that starts at another token.
        cuda::detail::q32_set_gemv_max_n(16);
        cuda::zero(d_y.data(), d_y.bytes());
        cuda::matmul(dw.m, d_x.as<float>() + 5 * cols, 11, d_y.as<float>());
        const std::vector<float> y = from_device<float>(d_y.data(), static_cast<size_t>(11 * rows));
        const int64_t diff = first_bit_difference(y.data(), one.data() + 5 * rows, 11 * rows);
        ASSERT_EQ(diff, -1) << "offset batch: token " << 5 + diff / rows << " row " << diff % rows;
      }
    }
  }
}

// Every kernel variant of the int8 matmul (bench_cuda_shapes --sweep picks among them) gives
// bitwise the default's results: each token alone through the default GEMV against batches of
// 1 .. 33 tokens through every GEMV variant (all n on the GEMV) and every mma variant (all n on the
// mma kernel), with and without the early PDL triggers; rows that leave partial row groups,
// partial last steps, long rows. Q8_0 and Q4_1 have the variants; Q4_0 checks that the other types
// ignore the selection.
TEST(CudaOps, MatmulEveryVariantBitwiseEqual) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  namespace d = cuda::detail;
  struct Restore {
    int64_t max_n = d::q32_set_gemv_max_n(2);
    int gemv = d::q32_set_variant(0, 0);
    int mma = d::q32_set_variant(1, 0);
    bool early = d::q32_set_pdl_early(false);
    ~Restore() {
      d::q32_set_gemv_max_n(max_n);
      d::q32_set_variant(0, gemv);
      d::q32_set_variant(1, mma);
      d::q32_set_pdl_early(early);
    }
  } restore;
  ASSERT_STREQ(d::q32_variant_name(0, 0), "default");
  ASSERT_STREQ(d::q32_variant_name(1, 0), "default");
  const GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_1, GgmlType::kQ4_0};
  struct Shape {
    int64_t rows, cols;
  };
  const Shape kShapes[] = {{37, 576}, {70, 1056}, {1030, 4096}, {4096, 14336}};
  const int64_t kNs[] = {1, 2, 3, 5, 8, 9, 12, 16, 17, 33};
  for (GgmlType type : kTypes) {
    for (const Shape& sh : kShapes) {
      const int64_t rows = sh.rows, cols = sh.cols;
      SCOPED_TRACE(std::string(type_name(type)) + " rows " + std::to_string(rows) + " cols " +
                   std::to_string(cols));
      const HostWeights w =
          make_weights(type, rows, cols, 23 + static_cast<uint32_t>(rows * 5 + cols));
      DeviceWeights dw = upload_weights(w);
      std::mt19937 rng(static_cast<uint32_t>(rows * 3 + cols));
      const int64_t n_max = 33;
      std::vector<float> x = random_floats(rng, n_max * cols, -2.0f, 2.0f);
      for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>(3 * cols + k)] *= 1e-4f;
      for (int64_t k = 0; k < 64; ++k) x[static_cast<size_t>(6 * cols + k)] = 0.0f;
      cuda::DeviceBuffer d_x = to_device(x);
      // The reference: the default GEMV, one token at a time.
      d::q32_set_gemv_max_n(2);
      d::q32_set_variant(0, 0);
      d::q32_set_variant(1, 0);
      d::q32_set_pdl_early(false);
      cuda::DeviceBuffer d_one(static_cast<size_t>(n_max * rows) * 4);
      for (int64_t t = 0; t < n_max; ++t) {
        cuda::matmul(dw.m, d_x.as<float>() + t * cols, 1, d_one.as<float>() + t * rows);
      }
      const std::vector<float> one =
          from_device<float>(d_one.data(), static_cast<size_t>(n_max * rows));
      cuda::DeviceBuffer d_y(static_cast<size_t>(n_max * rows) * 4);
      for (int kind = 0; kind < 2; ++kind) {
        for (int v = 0; v < d::q32_variant_count(kind); ++v) {
          for (bool early : {false, true}) {
            d::q32_set_gemv_max_n(kind == 0 ? 16 : 0);
            d::q32_set_variant(0, kind == 0 ? v : 0);
            d::q32_set_variant(1, kind == 1 ? v : 0);
            d::q32_set_pdl_early(early);
            for (int64_t n : kNs) {
              cuda::zero(d_y.data(), d_y.bytes());
              cuda::matmul(dw.m, d_x.as<float>(), n, d_y.as<float>());
              const std::vector<float> y =
                  from_device<float>(d_y.data(), static_cast<size_t>(n * rows));
              const int64_t diff = first_bit_difference(y.data(), one.data(), n * rows);
              ASSERT_EQ(diff, -1) << (kind == 0 ? "gemv" : "mma") << " variant "
                                  << d::q32_variant_name(kind, v) << " early " << early << ", n "
                                  << n << ": token " << diff / rows << " row " << diff % rows
                                  << " got " << y[diff] << " alone " << one[diff];
            }
          }
        }
      }
    }
    // Chains of dependent matmuls queued back to back (the early triggers and the programmatic
    // launches overlap consecutive kernels): y1 = W x, y2 = W y1, y3 = W y2 (W square), against
    // the default.
    SCOPED_TRACE(std::string(type_name(type)) + " chain");
    const int64_t dim = 1024;
    const HostWeights w = make_weights(type, dim, dim, 99);
    DeviceWeights dw = upload_weights(w);
    std::mt19937 rng(4321);
    const std::vector<float> x = random_floats(rng, 16 * dim, -2.0f, 2.0f);
    cuda::DeviceBuffer d_x = to_device(x);
    cuda::DeviceBuffer d_a(static_cast<size_t>(16 * dim) * 4), d_b(static_cast<size_t>(16 * dim) * 4);
    auto chain = [&](int64_t n) {
      cuda::matmul(dw.m, d_x.as<float>(), n, d_a.as<float>());
      cuda::matmul(dw.m, d_a.as<float>(), n, d_b.as<float>());
      cuda::matmul(dw.m, d_b.as<float>(), n, d_a.as<float>());
      return from_device<float>(d_a.data(), static_cast<size_t>(n * dim));
    };
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{16}}) {
      d::q32_set_gemv_max_n(2);
      d::q32_set_variant(0, 0);
      d::q32_set_variant(1, 0);
      d::q32_set_pdl_early(false);
      const std::vector<float> ref = chain(n);
      for (int kind = 0; kind < 2; ++kind) {
        for (int v = 0; v < d::q32_variant_count(kind); ++v) {
          d::q32_set_gemv_max_n(kind == 0 ? 16 : 0);
          d::q32_set_variant(0, kind == 0 ? v : 0);
          d::q32_set_variant(1, kind == 1 ? v : 0);
          d::q32_set_pdl_early(true);
          const std::vector<float> y = chain(n);
          const int64_t diff = first_bit_difference(y.data(), ref.data(), n * dim);
          ASSERT_EQ(diff, -1) << (kind == 0 ? "gemv" : "mma") << " variant "
                              << d::q32_variant_name(kind, v) << ", n " << n << ": token "
                              << diff / dim << " row " << diff % dim;
        }
      }
    }
  }
}

TEST(CudaOps, MatmulZeroTokensAndSupportedTypes) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (GgmlType type : kAllTypes) EXPECT_TRUE(cuda::matmul_supported(type)) << type_name(type);
  EXPECT_FALSE(cuda::matmul_supported(GgmlType::kQ2_K));
  const HostWeights w = make_weights(GgmlType::kQ8_0, 8, 64, 3);
  DeviceWeights dw = upload_weights(w);
  cuda::matmul(dw.m, nullptr, 0, nullptr);  // a no-op
  cuda::synchronize();
}

// ---- element-wise -----------------------------------------------------------------------------

TEST(CudaOps, RmsnormMatchesCpu) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t dim : {int64_t{4096}, int64_t{576}, int64_t{64}, int64_t{1000}}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    std::mt19937 rng(static_cast<uint32_t>(dim));
    const int64_t n_rows = 5;
    std::vector<float> x = random_floats(rng, n_rows * dim, -3.0f, 3.0f);
    for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(dim + i)] *= 1e-4f;
    const std::vector<float> wt = random_floats(rng, dim, 0.5f, 1.5f);
    std::vector<float> ref(x.size());
    rmsnorm_isa(Isa::kScalar, x.data(), wt.data(), 1e-5f, n_rows, dim, ref.data());
    cuda::DeviceBuffer d_x = to_device(x), d_w = to_device(wt);
    cuda::DeviceBuffer d_y(x.size() * 4);
    cuda::rmsnorm(d_x.as<float>(), d_w.as<float>(), 1e-5f, n_rows, dim, d_y.as<float>());
    const std::vector<float> y = from_device<float>(d_y.data(), x.size());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_LE(std::fabs(y[i] - ref[i]), 5e-7f * std::fabs(ref[i]) + 1e-30f) << "element " << i;
    }
    // In place.
    cuda::rmsnorm(d_x.as<float>(), d_w.as<float>(), 1e-5f, n_rows, dim, d_x.as<float>());
    const std::vector<float> y2 = from_device<float>(d_x.data(), x.size());
    ASSERT_EQ(first_bit_difference(y.data(), y2.data(), static_cast<int64_t>(y.size())), -1);
  }
}

TEST(CudaOps, AddSwigluMatchCpu) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  const int64_t n = 14336 * 3 + 7;
  const std::vector<float> a = random_floats(rng, n, -8.0f, 8.0f);
  const std::vector<float> b = random_floats(rng, n, -8.0f, 8.0f);
  cuda::DeviceBuffer d_a = to_device(a), d_b = to_device(b), d_o(static_cast<size_t>(n) * 4);
  // add
  cuda::copy_device(d_o.data(), d_a.data(), static_cast<size_t>(n) * 4);
  cuda::add(d_o.as<float>(), d_b.as<float>(), n);
  std::vector<float> got = from_device<float>(d_o.data(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + b[i]) << i;
  // swiglu
  std::vector<float> ref(static_cast<size_t>(n));
  swiglu_isa(Isa::kScalar, a.data(), b.data(), n, ref.data());
  cuda::swiglu(d_a.as<float>(), d_b.as<float>(), n, d_o.as<float>());
  got = from_device<float>(d_o.data(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(got[i] - ref[i]), 1e-6f * std::fabs(ref[i]) + 1e-30f) << i;
  }
  // swiglu_rows: gate | up side by side.
  const int64_t rows = 3, ffn = 1000;
  const std::vector<float> gu = random_floats(rng, rows * 2 * ffn, -6.0f, 6.0f);
  std::vector<float> ref_rows(static_cast<size_t>(rows * ffn));
  for (int64_t r = 0; r < rows; ++r) {
    swiglu_isa(Isa::kScalar, gu.data() + r * 2 * ffn, gu.data() + r * 2 * ffn + ffn, ffn,
               ref_rows.data() + r * ffn);
  }
  cuda::DeviceBuffer d_gu = to_device(gu);
  cuda::swiglu_rows(d_gu.as<float>(), rows, ffn, d_o.as<float>());
  got = from_device<float>(d_o.data(), static_cast<size_t>(rows * ffn));
  for (int64_t i = 0; i < rows * ffn; ++i) {
    ASSERT_LE(std::fabs(got[i] - ref_rows[i]), 1e-6f * std::fabs(ref_rows[i]) + 1e-30f) << i;
  }
  // In place (out aliases gate).
  cuda::swiglu(d_a.as<float>(), d_b.as<float>(), n, d_a.as<float>());
  got = from_device<float>(d_a.data(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(got[i] - ref[i]), 1e-6f * std::fabs(ref[i]) + 1e-30f) << i;
  }
}

TEST(CudaOps, RopeMatchesCpuBothStyles) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int n_heads, head_dim, rope_dim;
    float base, scale;
  };
  const Case cases[] = {{4, 64, 64, 10000.0f, 1.0f},
                        {3, 128, 128, 500000.0f, 1.0f},
                        {2, 64, 32, 10000.0f, 0.25f},
                        {8, 8, 8, 10000.0f, 1.0f}};
  for (const Case& c : cases) {
    for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
      SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " rope_dim " +
                   std::to_string(c.rope_dim) + (style == RopeStyle::kNorm ? " norm" : " neox"));
      std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 7 + c.rope_dim));
      const int64_t n_tokens = 9;
      std::vector<int32_t> pos = {0, 1, 2, 17, 100, 511, 1000, 4095, 30000};
      std::vector<float> x = random_floats(rng, n_tokens * c.n_heads * c.head_dim, -2.0f, 2.0f);
      std::vector<float> ref = x;
      rope(ref.data(), pos.data(), n_tokens, c.n_heads, c.head_dim, c.rope_dim, c.base, c.scale,
           style);
      cuda::DeviceBuffer d_x = to_device(x), d_pos = to_device(pos);
      cuda::rope(d_x.as<float>(), d_pos.as<int32_t>(), n_tokens, c.n_heads, c.head_dim,
                 c.rope_dim, c.base, c.scale, style);
      const std::vector<float> got = from_device<float>(d_x.data(), x.size());
      for (size_t i = 0; i < got.size(); ++i) {
        // Pass-through dims are untouched; rotated ones within a few ulps of |x|.
        ASSERT_LE(std::fabs(got[i] - ref[i]), 2e-6f) << "element " << i << " gpu " << got[i]
                                                     << " cpu " << ref[i];
      }
    }
  }
}

// ---- KV cache ---------------------------------------------------------------------------------

TEST(CudaOps, KvWriteAndCopySlot) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (KvType type : {KvType::kF16, KvType::kF32}) {
    SCOPED_TRACE(kv_type_name(type));
    const int n_layers = 3, n_kv = 3, hd = 64;
    const int64_t bs = 16, n_blocks = 6, slots = bs * n_blocks;
    const int64_t row_elems = n_kv * hd, layer_elems = slots * row_elems;
    const size_t eb = kv_type_bytes(type);
    const size_t pool_bytes = static_cast<size_t>(n_layers * layer_elems) * eb;
    cuda::DeviceBuffer k(pool_bytes), v(pool_bytes);
    std::vector<uint8_t> init(pool_bytes);
    for (size_t i = 0; i < pool_bytes; ++i) init[i] = static_cast<uint8_t>(i * 131 + 7);
    cuda::upload(k.data(), init.data(), pool_bytes);
    cuda::upload(v.data(), init.data(), pool_bytes);
    std::vector<uint8_t> hk = init, hv = init;  // the expected pools

    std::mt19937 rng(5);
    const std::vector<int64_t> phys = {3, 50, 17, 95, 0};
    const int64_t n = static_cast<int64_t>(phys.size());
    const std::vector<float> kf = random_floats(rng, n * row_elems, -70000.0f, 70000.0f);
    std::vector<float> vf = random_floats(rng, n * row_elems, -1.0f, 1.0f);
    vf[3] = 1e-6f;   // f16 subnormal
    vf[4] = 2.5e-8f;  // rounds to zero or the smallest subnormal
    cuda::DeviceBuffer d_phys = to_device(phys), d_k = to_device(kf), d_v = to_device(vf);
    const int layer = 1;
    cuda::DeviceKvLayer L;
    L.k = static_cast<uint8_t*>(k.data()) + layer * layer_elems * eb;
    L.v = static_cast<uint8_t*>(v.data()) + layer * layer_elems * eb;
    L.type = type;
    L.n_kv_heads = n_kv;
    L.head_dim = hd;
    L.block_slots = bs;
    cuda::kv_write(L, d_phys.as<int64_t>(), n, d_k.as<float>(), d_v.as<float>());
    auto put = [&](std::vector<uint8_t>& pool, int64_t elem_index, float value) {
      uint8_t* p = pool.data() + static_cast<size_t>(elem_index) * eb;
      if (type == KvType::kF16) {
        const uint16_t h = fp32_to_fp16(value);
        std::memcpy(p, &h, 2);
      } else {
        std::memcpy(p, &value, 4);
      }
    };
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t e = 0; e < row_elems; ++e) {
        const int64_t at = layer * layer_elems + phys[i] * row_elems + e;
        put(hk, at, kf[i * row_elems + e]);
        put(hv, at, vf[i * row_elems + e]);
      }
    }
    ASSERT_TRUE(from_device<uint8_t>(k.data(), pool_bytes) == hk);
    ASSERT_TRUE(from_device<uint8_t>(v.data(), pool_bytes) == hv);

    // Copy slot 50 to slot 4 in every layer.
    cuda::kv_copy_slot(k.data(), v.data(), type, n_layers, layer_elems, row_elems, 50, 4);
    for (int l = 0; l < n_layers; ++l) {
      const size_t from = static_cast<size_t>(l * layer_elems + 50 * row_elems) * eb;
      const size_t to = static_cast<size_t>(l * layer_elems + 4 * row_elems) * eb;
      std::memcpy(hk.data() + to, hk.data() + from, static_cast<size_t>(row_elems) * eb);
      std::memcpy(hv.data() + to, hv.data() + from, static_cast<size_t>(row_elems) * eb);
    }
    ASSERT_TRUE(from_device<uint8_t>(k.data(), pool_bytes) == hk);
    ASSERT_TRUE(from_device<uint8_t>(v.data(), pool_bytes) == hv);
  }
}

// ---- paged attention ---------------------------------------------------------------------------

// A pool of blocks for one layer, filled with NaN; sequences get scattered blocks.
struct Pool {
  KvType type;
  int n_kv, hd;
  int64_t bs, n_blocks;
  cuda::DeviceBuffer k, v;
  std::vector<int32_t> free_blocks;
  cuda::DeviceKvLayer layer() const {
    cuda::DeviceKvLayer L;
    L.k = k.data();
    L.v = v.data();
    L.type = type;
    L.n_kv_heads = n_kv;
    L.head_dim = hd;
    L.block_slots = bs;
    return L;
  }
};

Pool make_pool(KvType type, int n_kv, int hd, int64_t bs, int64_t n_blocks, std::mt19937& rng) {
  Pool p{type, n_kv, hd, bs, n_blocks, {}, {}, {}};
  const size_t bytes = static_cast<size_t>(n_blocks * bs * n_kv * hd) * kv_type_bytes(type);
  p.k = cuda::DeviceBuffer(bytes);
  p.v = cuda::DeviceBuffer(bytes);
  std::vector<uint8_t> nan(bytes, 0xff);  // all-ones: NaN in f16 and f32
  cuda::upload(p.k.data(), nan.data(), bytes);
  cuda::upload(p.v.data(), nan.data(), bytes);
  p.free_blocks.resize(static_cast<size_t>(n_blocks));
  std::iota(p.free_blocks.begin(), p.free_blocks.end(), 0);
  std::shuffle(p.free_blocks.begin(), p.free_blocks.end(), rng);
  return p;
}

// One sequence: its stored K/V (as floats, after the cache's rounding), block table, mask.
struct Seq {
  int64_t n_past = 0, n_new = 0;
  std::vector<int32_t> table;
  std::vector<uint8_t> mask;  // [n_new, n_new] or empty (causal)
  std::vector<float> k, v;    // [n_past + n_new, n_kv, hd] as stored
};

float stored(KvType type, float x) {
  return type == KvType::kF16 ? fp16_to_fp32(fp32_to_fp16(x)) : x;
}

// Writes k, v ([slots, n_kv, hd] floats) into fresh blocks of the pool; returns the table.
std::vector<int32_t> write_slots(Pool& pool, const std::vector<float>& k, const std::vector<float>& v,
                                 int64_t slots) {
  std::vector<int32_t> table;
  const int64_t n_tbl = (slots + pool.bs - 1) / pool.bs;
  for (int64_t b = 0; b < std::max<int64_t>(n_tbl, 1); ++b) {
    EXPECT_FALSE(pool.free_blocks.empty());
    table.push_back(pool.free_blocks.back());
    pool.free_blocks.pop_back();
  }
  if (slots == 0) return table;
  std::vector<int64_t> phys(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) phys[s] = table[s / pool.bs] * pool.bs + s % pool.bs;
  cuda::DeviceBuffer d_phys = to_device(phys), d_k = to_device(k), d_v = to_device(v);
  cuda::kv_write(pool.layer(), d_phys.as<int64_t>(), slots, d_k.as<float>(), d_v.as<float>());
  cuda::synchronize();
  return table;
}

Seq make_seq(Pool& pool, std::mt19937& rng, int64_t n_past, int64_t n_new, bool tree,
             bool blind_first_row) {
  Seq s;
  s.n_past = n_past;
  s.n_new = n_new;
  const int64_t slots = n_past + n_new;
  const int64_t row = static_cast<int64_t>(pool.n_kv) * pool.hd;
  std::vector<float> k = random_floats(rng, slots * row, -1.0f, 1.0f);
  std::vector<float> v = random_floats(rng, slots * row, -1.0f, 1.0f);
  s.table = write_slots(pool, k, v, slots);
  for (float& x : k) x = stored(pool.type, x);
  for (float& x : v) x = stored(pool.type, x);
  s.k = std::move(k);
  s.v = std::move(v);
  if (tree) {  // a random tree (parent before child): i sees itself and its ancestors
    s.mask.assign(static_cast<size_t>(n_new * n_new), 0);
    std::vector<int64_t> parent(static_cast<size_t>(n_new), -1);
    for (int64_t i = 0; i < n_new; ++i) {
      if (i > 0) parent[i] = std::uniform_int_distribution<int64_t>(-1, i - 1)(rng);
      for (int64_t a = i; a >= 0; a = parent[a]) s.mask[i * n_new + a] = 1;
    }
    if (blind_first_row) s.mask[0] = 0;  // row 0 sees only the past (nothing if n_past = 0)
  }
  return s;
}

// The CPU's attention over the sequence's float cache: [n_new, n_heads, hd].
std::vector<float> cpu_attention(const Seq& s, int n_heads, int n_kv, int hd, float scale,
                                 const std::vector<float>& q) {
  AttentionShape shape;
  shape.n_past = s.n_past;
  shape.n_new = s.n_new;
  shape.n_heads = n_heads;
  shape.n_kv_heads = n_kv;
  shape.head_dim = hd;
  shape.scale = scale;
  std::vector<float> out(static_cast<size_t>(s.n_new * n_heads * hd));
  attention(shape, q.data(), s.k.data(), s.v.data(), s.mask.empty() ? nullptr : s.mask.data(),
            out.data(), nullptr);
  return out;
}

// Runs paged_attention over sequences (rows in order), q: [rows, n_heads, hd].
std::vector<float> gpu_attention(const Pool& pool, const std::vector<const Seq*>& seqs, int n_heads,
                                 float scale, const std::vector<float>& q) {
  std::vector<cuda::DeviceAttnSeq> ds;
  std::vector<int32_t> tables;
  std::vector<uint8_t> masks;
  int64_t rows = 0, max_visible = 0;
  for (const Seq* s : seqs) {
    cuda::DeviceAttnSeq d;
    d.row0 = rows;
    d.n_new = s->n_new;
    d.n_past = s->n_past;
    d.table = static_cast<int64_t>(tables.size());
    tables.insert(tables.end(), s->table.begin(), s->table.end());
    if (!s->mask.empty()) {
      d.mask = static_cast<int64_t>(masks.size());
      masks.insert(masks.end(), s->mask.begin(), s->mask.end());
    }
    ds.push_back(d);
    rows += s->n_new;
    max_visible = std::max(max_visible, s->n_past + s->n_new);
  }
  masks.push_back(0);  // never empty
  const int64_t row_floats = static_cast<int64_t>(n_heads) * pool.hd;
  EXPECT_EQ(static_cast<int64_t>(q.size()), rows * row_floats);
  cuda::DeviceBuffer d_seqs = to_device(ds), d_tables = to_device(tables),
                     d_masks = to_device(masks), d_q = to_device(q);
  cuda::DeviceBuffer d_out(static_cast<size_t>(rows * row_floats) * 4);
  cuda::paged_attention(pool.layer(), d_q.as<float>(), rows, n_heads, scale,
                        d_seqs.as<cuda::DeviceAttnSeq>(), static_cast<int64_t>(ds.size()),
                        d_tables.as<int32_t>(), d_masks.as<uint8_t>(), max_visible,
                        d_out.as<float>());
  return from_device<float>(d_out.data(), static_cast<size_t>(rows * row_floats));
}

struct AttnCase {
  int n_heads, n_kv, hd;
};

std::string attn_case_name(const AttnCase& c, KvType type) {
  return std::string(kv_type_name(type)) + " heads " + std::to_string(c.n_heads) + "/" +
         std::to_string(c.n_kv) + " head_dim " + std::to_string(c.hd);
}

// Random queries for each sequence's new rows, drawn in sequence order: per sequence
// ([n_new, n_heads, hd] each) and joined in row order, with the sequences for gpu_attention.
struct Queries {
  std::vector<std::vector<float>> per_seq;
  std::vector<float> all;
  std::vector<const Seq*> seqs;
};
Queries random_queries(const std::vector<Seq>& seqs, int64_t row_floats, std::mt19937& rng,
                       float lo, float hi) {
  Queries q;
  for (const Seq& s : seqs) {
    q.per_seq.push_back(random_floats(rng, s.n_new * row_floats, lo, hi));
    q.all.insert(q.all.end(), q.per_seq.back().begin(), q.per_seq.back().end());
    q.seqs.push_back(&s);
  }
  return q;
}

// Puts paged_attention's kernel switches back as they were when the test began.
struct AttentionModeRestore {
  bool legacy = cuda::attention_legacy();
  bool split = cuda::attention_split();
  ~AttentionModeRestore() {
    cuda::set_attention_legacy(legacy);
    cuda::set_attention_split(split);
  }
};

TEST(CudaOps, PagedAttentionMatchesCpuAndIsBatchInvariant) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (const AttnCase c : {AttnCase{9, 3, 64}, AttnCase{4, 1, 128}, AttnCase{8, 4, 8}}) {
    for (KvType type : {KvType::kF16, KvType::kF32}) {
      SCOPED_TRACE(attn_case_name(c, type));
      std::mt19937 rng(static_cast<uint32_t>(c.hd * 31 + c.n_heads));
      Pool pool = make_pool(type, c.n_kv, c.hd, 16, 160, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      // Sequences: causal decode and verification, tree verification, prefill from nothing, a
      // tree whose first row sees nothing.
      std::vector<Seq> seqs;
      seqs.push_back(make_seq(pool, rng, 37, 5, false, false));
      seqs.push_back(make_seq(pool, rng, 700, 7, true, false));
      seqs.push_back(make_seq(pool, rng, 0, 1, false, false));
      seqs.push_back(make_seq(pool, rng, 0, 33, false, false));
      seqs.push_back(make_seq(pool, rng, 0, 4, true, true));
      seqs.push_back(make_seq(pool, rng, 700, 1, false, false));
      const int64_t row_floats = static_cast<int64_t>(c.n_heads) * c.hd;
      const Queries q = random_queries(seqs, row_floats, rng, -1.0f, 1.0f);
      const std::vector<std::vector<float>>& qs = q.per_seq;
      const std::vector<float> batched = gpu_attention(pool, q.seqs, c.n_heads, scale, q.all);
      int64_t row0 = 0;
      for (size_t si = 0; si < seqs.size(); ++si) {
        const Seq& s = seqs[si];
        SCOPED_TRACE("sequence " + std::to_string(si) + " n_past " + std::to_string(s.n_past) +
                     " n_new " + std::to_string(s.n_new));
        const std::vector<float> ref = cpu_attention(s, c.n_heads, c.n_kv, c.hd, scale, qs[si]);
        const float* got = batched.data() + row0 * row_floats;
        for (int64_t e = 0; e < s.n_new * row_floats; ++e) {
          ASSERT_LE(std::fabs(got[e] - ref[e]), 1e-4f)
              << "row " << e / row_floats << " elem " << e % row_floats << " gpu " << got[e]
              << " cpu " << ref[e];
        }
        if (!s.mask.empty() && s.mask[0] == 0 && s.n_past == 0) {
          for (int64_t e = 0; e < row_floats; ++e) ASSERT_EQ(got[e], 0.0f) << "blind row";
        }
        // The sequence alone: the same bits.
        const std::vector<float> alone = gpu_attention(pool, {&s}, c.n_heads, scale, qs[si]);
        ASSERT_EQ(first_bit_difference(alone.data(), got, s.n_new * row_floats), -1)
            << "alone vs batched";
        // Each row as a decode over exactly its visible slots (compacted for a tree mask).
        for (int64_t i = 0; i < s.n_new; ++i) {
          Seq d;
          const int64_t row = static_cast<int64_t>(c.n_kv) * c.hd;
          std::vector<int64_t> visible;
          for (int64_t slot = 0; slot < s.n_past + s.n_new; ++slot) {
            const int64_t j = slot - s.n_past;
            if (slot < s.n_past || (s.mask.empty() ? j <= i : s.mask[i * s.n_new + j] != 0)) {
              visible.push_back(slot);
            }
          }
          if (visible.empty()) continue;  // the blind row: zeros, checked above
          if (s.mask.empty()) {  // the same blocks, n_past + i cached slots
            d.n_past = s.n_past + i;
            d.n_new = 1;
            d.table = s.table;
          } else {  // the visible slots' values, contiguous in fresh blocks
            std::vector<float> k, v;
            for (int64_t slot : visible) {
              k.insert(k.end(), s.k.begin() + slot * row, s.k.begin() + (slot + 1) * row);
              v.insert(v.end(), s.v.begin() + slot * row, s.v.begin() + (slot + 1) * row);
            }
            const int64_t nv = static_cast<int64_t>(visible.size());
            d.table = write_slots(pool, k, v, nv);  // values already rounded: stored exactly
            d.n_past = nv - 1;
            d.n_new = 1;
          }
          const std::vector<float> qi(qs[si].begin() + i * row_floats,
                                      qs[si].begin() + (i + 1) * row_floats);
          const std::vector<float> dec = gpu_attention(pool, {&d}, c.n_heads, scale, qi);
          ASSERT_EQ(first_bit_difference(dec.data(), got + i * row_floats, row_floats), -1)
              << "row " << i << ": decode over its visible slots differs";
          if (!s.mask.empty()) {  // give the blocks back
            pool.free_blocks.insert(pool.free_blocks.begin(), d.table.begin(), d.table.end());
          }
        }
        row0 += s.n_new;
      }
    }
  }
}

// The fast kernel against the legacy one: bitwise the same results for decode, verification,
// trees and prefill rows, up to a few thousand cached slots, both cache types.
TEST(CudaOps, PagedAttentionFastBitwiseEqualsLegacy) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const AttentionModeRestore restore;
  cuda::set_attention_split(false);
  for (const AttnCase c : {AttnCase{9, 3, 64}, AttnCase{4, 1, 128}, AttnCase{8, 4, 8},
                           AttnCase{2, 2, 256}}) {
    for (KvType type : {KvType::kF16, KvType::kF32}) {
      SCOPED_TRACE(attn_case_name(c, type));
      std::mt19937 rng(static_cast<uint32_t>(c.hd * 17 + c.n_heads));
      Pool pool = make_pool(type, c.n_kv, c.hd, 16, 420, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      std::vector<Seq> seqs;
      seqs.push_back(make_seq(pool, rng, 3000, 1, false, false));   // a long decode
      seqs.push_back(make_seq(pool, rng, 2100, 11, true, false));   // a long tree
      seqs.push_back(make_seq(pool, rng, 300, 8, false, false));    // verification
      seqs.push_back(make_seq(pool, rng, 0, 70, false, false));     // prefill
      seqs.push_back(make_seq(pool, rng, 0, 5, true, true));        // a blind first row
      seqs.push_back(make_seq(pool, rng, 33, 1, false, false));
      const int64_t row_floats = static_cast<int64_t>(c.n_heads) * c.hd;
      const Queries q = random_queries(seqs, row_floats, rng, -2.0f, 2.0f);
      cuda::set_attention_legacy(true);
      const std::vector<float> legacy = gpu_attention(pool, q.seqs, c.n_heads, scale, q.all);
      cuda::set_attention_legacy(false);
      const std::vector<float> fast = gpu_attention(pool, q.seqs, c.n_heads, scale, q.all);
      ASSERT_EQ(legacy.size(), fast.size());
      const int64_t e =
          first_bit_difference(fast.data(), legacy.data(), static_cast<int64_t>(fast.size()));
      ASSERT_EQ(e, -1) << "first difference at row " << e / row_floats << " elem "
                       << e % row_floats << ": fast " << fast[e] << " legacy " << legacy[e];
      for (float x : fast) ASSERT_FALSE(std::isnan(x));
    }
  }
}

// The split kernel (the default) against the fast one on the same long sequences: a row of at
// most one tile of visible slots (64 by default) bitwise, a longer one (its tiles merged) within
// float rounding; every row within 1e-4 of the CPU; each sequence alone bitwise as in the batch.
TEST(CudaOps, PagedAttentionSplitMatchesFastAndCpu) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const AttentionModeRestore restore;
  cuda::set_attention_legacy(false);
  for (const AttnCase c : {AttnCase{9, 3, 64}, AttnCase{4, 1, 128}, AttnCase{8, 4, 8}}) {
    for (KvType type : {KvType::kF16, KvType::kF32}) {
      SCOPED_TRACE(attn_case_name(c, type));
      std::mt19937 rng(static_cast<uint32_t>(c.hd * 13 + c.n_heads));
      Pool pool = make_pool(type, c.n_kv, c.hd, 16, 460, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      std::vector<Seq> seqs;
      // (tiles of 64 visible slots by default)
      seqs.push_back(make_seq(pool, rng, 3000, 1, false, false));  // a long decode: 47 tiles
      seqs.push_back(make_seq(pool, rng, 2100, 11, true, false));  // a long tree
      seqs.push_back(make_seq(pool, rng, 120, 20, true, false));   // a tree across tiles
      seqs.push_back(make_seq(pool, rng, 250, 8, false, false));   // verification at 256
      seqs.push_back(make_seq(pool, rng, 0, 300, false, false));   // prefill: 1 to 5 tiles
      seqs.push_back(make_seq(pool, rng, 0, 5, true, true));       // a blind first row
      const int64_t row_floats = static_cast<int64_t>(c.n_heads) * c.hd;
      const Queries q = random_queries(seqs, row_floats, rng, -2.0f, 2.0f);
      const std::vector<std::vector<float>>& qs = q.per_seq;
      cuda::set_attention_split(false);
      const std::vector<float> fast = gpu_attention(pool, q.seqs, c.n_heads, scale, q.all);
      cuda::set_attention_split(true);
      const std::vector<float> split = gpu_attention(pool, q.seqs, c.n_heads, scale, q.all);
      ASSERT_EQ(fast.size(), split.size());
      int64_t row0 = 0, one_tile_rows = 0, merged_rows = 0;
      float worst_merged = 0.0f;
      for (size_t si = 0; si < seqs.size(); ++si) {
        const Seq& s = seqs[si];
        SCOPED_TRACE("sequence " + std::to_string(si));
        const std::vector<float> ref = cpu_attention(s, c.n_heads, c.n_kv, c.hd, scale, qs[si]);
        for (int64_t i = 0; i < s.n_new; ++i) {
          int64_t visible = s.n_past;
          for (int64_t j = 0; j < s.n_new; ++j) {
            visible += (s.mask.empty() ? j <= i : s.mask[i * s.n_new + j] != 0) ? 1 : 0;
          }
          const float* a = split.data() + (row0 + i) * row_floats;
          const float* b = fast.data() + (row0 + i) * row_floats;
          if (visible <= cuda::attention_tile()) {
            ASSERT_EQ(first_bit_difference(a, b, row_floats), -1) << "row " << i << " (one tile)";
            ++one_tile_rows;
          } else {
            for (int64_t e = 0; e < row_floats; ++e) {
              worst_merged = std::max(worst_merged, std::fabs(a[e] - b[e]));
            }
            ++merged_rows;
          }
          for (int64_t e = 0; e < row_floats; ++e) {
            ASSERT_FALSE(std::isnan(a[e]));
            ASSERT_LE(std::fabs(a[e] - ref[i * row_floats + e]), 1e-4f)
                << "row " << i << " elem " << e;
          }
        }
        const std::vector<float> alone = gpu_attention(pool, {&s}, c.n_heads, scale, qs[si]);
        ASSERT_EQ(first_bit_difference(alone.data(), split.data() + row0 * row_floats,
                                       s.n_new * row_floats),
                  -1)
            << "alone vs batched";
        row0 += s.n_new;
      }
      EXPECT_GT(one_tile_rows, 0);
      EXPECT_GT(merged_rows, 0);
      EXPECT_LT(worst_merged, 1e-5f) << "merged tiles vs one pass";
      std::printf("split vs fast (%s, %d/%d heads, head_dim %d): %lld one-tile rows bitwise, "
                  "%lld merged rows within %.3g\n",
                  kv_type_name(type), c.n_heads, c.n_kv, c.hd,
                  static_cast<long long>(one_tile_rows), static_cast<long long>(merged_rows),
                  static_cast<double>(worst_merged));
    }
  }
}

// ---- device ----------------------------------------------------------------------------------

TEST(CudaOps, DeviceInfoAndBandwidth) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const cuda::DeviceInfo info = cuda::device_info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.total_bytes, 0);
  const double gbs = cuda::measure_bandwidth_gbs(int64_t{256} << 20);
  EXPECT_GT(gbs, 10.0);
  std::printf("%s cc %d.%d, %d SMs, %.1f GiB, copy bandwidth %.0f GB/s\n", info.name.c_str(),
              info.cc_major, info.cc_minor, info.sm_count,
              static_cast<double>(info.total_bytes) / (1 << 30), gbs);
  // A failed allocation throws (naming the size).
  try {
    cuda::DeviceBuffer huge(size_t{1} << 50);
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1125899906842624"), std::string::npos) << e.what();
  }
  // The stream still works after it.
  cuda::DeviceBuffer b(64);
  cuda::zero(b.data(), 64);
  const std::vector<uint8_t> z = from_device<uint8_t>(b.data(), 64);
  for (uint8_t x : z) EXPECT_EQ(x, 0);
}

// ---- fused ops (the forward pass's fewer launches): bitwise the separate ops -----------------------

// A matmul on matrices stacked by rows (the model's q|k|v and gate|up) gives every output row the
// bits of the matmul on its own matrix: every weight type, the fast and the legacy kernels, the
// GEMV and the tensor-core sizes of n, and part boundaries that leave the second matrix's rows at
// an offset that is not 16-byte aligned.
TEST(CudaFused, StackedMatmulBitwiseEqualsSeparate) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                            GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                            GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
  const bool was_legacy = cuda::matmul_legacy();
  for (GgmlType type : types) {
    const int64_t cols = cols_for(type)[1];  // 576 / 768
    // {q, k, v}-like parts; 37 rows: the next part starts at an unaligned byte offset.
    for (const std::vector<int64_t>& parts :
         {std::vector<int64_t>{37, 24, 24}, std::vector<int64_t>{64, 64}}) {
      std::vector<HostWeights> ws;
      std::vector<uint8_t> stacked_bytes;
      int64_t total_rows = 0;
      for (size_t j = 0; j < parts.size(); ++j) {
        ws.push_back(make_weights(type, parts[j], cols, static_cast<uint32_t>(100 + j)));
        stacked_bytes.insert(stacked_bytes.end(), ws.back().data.begin(), ws.back().data.end());
        total_rows += parts[j];
      }
      HostWeights st{type, total_rows, cols, ggml_row_bytes(type, cols), stacked_bytes};
      DeviceWeights d_st = upload_weights(st);
      std::vector<DeviceWeights> d_ws;
      for (const HostWeights& w : ws) d_ws.push_back(upload_weights(w));
      std::mt19937 rng(static_cast<uint32_t>(cols + parts.size()));
      for (bool legacy : {false, true}) {
        cuda::set_matmul_legacy(legacy);
        for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, int64_t{17}, int64_t{33}}) {
          SCOPED_TRACE(std::string(type_name(type)) + " parts " + std::to_string(parts.size()) +
                       (legacy ? " legacy" : "") + " n " + std::to_string(n));
          const std::vector<float> x = random_floats(rng, n * cols, -2.0f, 2.0f);
          cuda::DeviceBuffer d_x = to_device(x);
          cuda::DeviceBuffer d_y(static_cast<size_t>(n * total_rows) * 4);
          cuda::matmul(d_st.m, d_x.as<float>(), n, d_y.as<float>());
          const std::vector<float> y = from_device<float>(d_y.data(), static_cast<size_t>(n * total_rows));
          int64_t col0 = 0;
          for (size_t j = 0; j < parts.size(); ++j) {
            cuda::DeviceBuffer d_yj(static_cast<size_t>(n * parts[j]) * 4);
            cuda::matmul(d_ws[j].m, d_x.as<float>(), n, d_yj.as<float>());
            const std::vector<float> yj =
                from_device<float>(d_yj.data(), static_cast<size_t>(n * parts[j]));
            for (int64_t t = 0; t < n; ++t) {
              ASSERT_EQ(first_bit_difference(y.data() + t * total_rows + col0,
                                             yj.data() + t * parts[j], parts[j]),
                        -1)
                  << "part " << j << " token " << t;
            }
            col0 += parts[j];
          }
        }
      }
    }
  }
  cuda::set_matmul_legacy(was_legacy);
  // SmolLM2's attention shape in Q8_0: q|k|v = 576 + 192 + 192 rows of 576.
  {
    const int64_t cols = 576;
    const int64_t rows[3] = {576, 192, 192};
    std::vector<HostWeights> ws;
    std::vector<uint8_t> bytes;
    for (int j = 0; j < 3; ++j) {
      ws.push_back(make_weights(GgmlType::kQ8_0, rows[j], cols, static_cast<uint32_t>(7 + j)));
      bytes.insert(bytes.end(), ws.back().data.begin(), ws.back().data.end());
    }
    HostWeights st{GgmlType::kQ8_0, 960, cols, ggml_row_bytes(GgmlType::kQ8_0, cols), bytes};
    DeviceWeights d_st = upload_weights(st);
    std::mt19937 rng(3);
    for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{16}}) {
      const std::vector<float> x = random_floats(rng, n * cols, -2.0f, 2.0f);
      cuda::DeviceBuffer d_x = to_device(x), d_y(static_cast<size_t>(n * 960) * 4);
      cuda::matmul(d_st.m, d_x.as<float>(), n, d_y.as<float>());
      const std::vector<float> y = from_device<float>(d_y.data(), static_cast<size_t>(n * 960));
      int64_t col0 = 0;
      for (int j = 0; j < 3; ++j) {
        DeviceWeights dj = upload_weights(ws[static_cast<size_t>(j)]);
        cuda::DeviceBuffer d_yj(static_cast<size_t>(n * rows[j]) * 4);
        cuda::matmul(dj.m, d_x.as<float>(), n, d_yj.as<float>());
        const std::vector<float> yj = from_device<float>(d_yj.data(), static_cast<size_t>(n * rows[j]));
        for (int64_t t = 0; t < n; ++t) {
          ASSERT_EQ(first_bit_difference(y.data() + t * 960 + col0, yj.data() + t * rows[j], rows[j]),
                    -1)
              << "SmolLM2 shape, n " << n << " part " << j << " token " << t;
        }
        col0 += rows[j];
      }
    }
  }
}

// add_rmsnorm == add then rmsnorm, bitwise (x updated and the normed output), with tiny and
// large rows, dims below / above / not a multiple of the 256 threads.
TEST(CudaFused, AddRmsnormBitwiseEqualsAddThenRmsnorm) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t dim : {int64_t{576}, int64_t{64}, int64_t{1000}, int64_t{4096}}) {
    for (int64_t n_rows : {int64_t{1}, int64_t{7}}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(n_rows));
      std::mt19937 rng(static_cast<uint32_t>(dim * 3 + n_rows));
      std::vector<float> x = random_floats(rng, n_rows * dim, -3.0f, 3.0f);
      const std::vector<float> y = random_floats(rng, n_rows * dim, -1.0f, 1.0f);
      if (n_rows > 1) {
        for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(dim + i)] *= 1e-20f;  // tiny row
      }
      const std::vector<float> wt = random_floats(rng, dim, 0.5f, 1.5f);
      cuda::DeviceBuffer d_w = to_device(wt), d_y = to_device(y);
      // Separate.
      cuda::DeviceBuffer d_x1 = to_device(x), d_o1(x.size() * 4);
      cuda::add(d_x1.as<float>(), d_y.as<float>(), n_rows * dim);
      cuda::rmsnorm(d_x1.as<float>(), d_w.as<float>(), 1e-5f, n_rows, dim, d_o1.as<float>());
      // Fused.
      cuda::DeviceBuffer d_x2 = to_device(x), d_o2(x.size() * 4);
      cuda::add_rmsnorm(d_x2.as<float>(), d_y.as<float>(), d_w.as<float>(), 1e-5f, n_rows, dim,
                        d_o2.as<float>());
      const std::vector<float> x1 = from_device<float>(d_x1.data(), x.size());
      const std::vector<float> x2 = from_device<float>(d_x2.data(), x.size());
      const std::vector<float> o1 = from_device<float>(d_o1.data(), x.size());
      const std::vector<float> o2 = from_device<float>(d_o2.data(), x.size());
      ASSERT_EQ(std::memcmp(x1.data(), x2.data(), x.size() * 4), 0) << "x after the add";
      ASSERT_EQ(std::memcmp(o1.data(), o2.data(), x.size() * 4), 0) << "normed output";
    }
  }
  // out aliasing x is refused.
  cuda::DeviceBuffer b(64 * 4);
  EXPECT_THROW(cuda::add_rmsnorm(b.as<float>(), b.as<float>(), b.as<float>(), 1e-5f, 1, 64,
                                 b.as<float>()),
               Error);
}

// rope_qkv == rope(q), rope(k), v copied; rope_qkv_kv_write == rope(q), rope(k), kv_write(k, v):
// bitwise, from a stacked [n, q_dim + 2 kv_dim] source and from three separate buffers, both
// styles, partial rope_dim, f16 and f32 caches (untouched slots stay untouched).
TEST(CudaFused, RopeQkvBitwiseEqualsRopeAndKvWrite) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int n_heads, n_kv, head_dim, rope_dim;
    float base, scale;
  };
  const Case cases[] = {{9, 3, 64, 64, 100000.0f, 1.0f},   // SmolLM2-135M
                        {8, 2, 128, 128, 500000.0f, 1.0f},
                        {4, 4, 64, 32, 10000.0f, 0.25f},   // partial rope, no GQA
                        {6, 1, 8, 8, 10000.0f, 1.0f}};
  for (const Case& c : cases) {
    for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
      for (KvType type : {KvType::kF16, KvType::kF32}) {
        for (bool stacked : {true, false}) {
          SCOPED_TRACE("heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) +
                       " hd " + std::to_string(c.head_dim) + " rope " +
                       std::to_string(c.rope_dim) + (style == RopeStyle::kNorm ? " norm " : " neox ") +
                       kv_type_name(type) + (stacked ? " stacked" : " separate"));
          const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
          const int64_t kv_dim = static_cast<int64_t>(c.n_kv) * c.head_dim;
          const std::vector<int32_t> pos = {0, 1, 2, 17, 100, 511, 1000, 4095, 30000, 5, 6};
          const auto n = static_cast<int64_t>(pos.size());
          const std::vector<int64_t> phys = {3, 50, 17, 95, 0, 1, 2, 60, 61, 40, 33};
          std::mt19937 rng(static_cast<uint32_t>(c.head_dim + c.n_heads));
          const std::vector<float> qh = random_floats(rng, n * q_dim, -2.0f, 2.0f);
          const std::vector<float> kh = random_floats(rng, n * kv_dim, -2.0f, 2.0f);
          const std::vector<float> vh = random_floats(rng, n * kv_dim, -2.0f, 2.0f);
          // The sources.
          cuda::DeviceBuffer d_src;
          cuda::QkvSource src;
          cuda::DeviceBuffer d_qs, d_ks, d_vs;
          if (stacked) {
            const int64_t w = q_dim + 2 * kv_dim;
            std::vector<float> all(static_cast<size_t>(n * w));
            for (int64_t t = 0; t < n; ++t) {
              std::copy_n(qh.begin() + t * q_dim, q_dim, all.begin() + t * w);
              std::copy_n(kh.begin() + t * kv_dim, kv_dim, all.begin() + t * w + q_dim);
              std::copy_n(vh.begin() + t * kv_dim, kv_dim, all.begin() + t * w + q_dim + kv_dim);
            }
            d_src = to_device(all);
            src = {d_src.as<float>(), w, d_src.as<float>() + q_dim, w,
                   d_src.as<float>() + q_dim + kv_dim, w};
          } else {
            d_qs = to_device(qh);
            d_ks = to_device(kh);
            d_vs = to_device(vh);
            src = {d_qs.as<float>(), q_dim, d_ks.as<float>(), kv_dim, d_vs.as<float>(), kv_dim};
          }
          cuda::DeviceBuffer d_pos = to_device(pos), d_phys = to_device(phys);
          // Separate ops.
          cuda::DeviceBuffer r_q = to_device(qh), r_k = to_device(kh), r_v = to_device(vh);
          cuda::rope(r_q.as<float>(), d_pos.as<int32_t>(), n, c.n_heads, c.head_dim, c.rope_dim,
                     c.base, c.scale, style);
          cuda::rope(r_k.as<float>(), d_pos.as<int32_t>(), n, c.n_kv, c.head_dim, c.rope_dim,
                     c.base, c.scale, style);
          const std::vector<float> ref_q = from_device<float>(r_q.data(), qh.size());
          const std::vector<float> ref_k = from_device<float>(r_k.data(), kh.size());
          // rope_qkv.
          cuda::DeviceBuffer o_q(qh.size() * 4), o_k(kh.size() * 4), o_v(vh.size() * 4);
          cuda::rope_qkv(src, d_pos.as<int32_t>(), n, c.n_heads, c.n_kv, c.head_dim, c.rope_dim,
                         c.base, c.scale, style, o_q.as<float>(), o_k.as<float>(),
                         o_v.as<float>());
          const std::vector<float> got_q = from_device<float>(o_q.data(), qh.size());
          const std::vector<float> got_k = from_device<float>(o_k.data(), kh.size());
          const std::vector<float> got_v = from_device<float>(o_v.data(), vh.size());
          ASSERT_EQ(std::memcmp(got_q.data(), ref_q.data(), qh.size() * 4), 0) << "rope_qkv q";
          ASSERT_EQ(std::memcmp(got_k.data(), ref_k.data(), kh.size() * 4), 0) << "rope_qkv k";
          ASSERT_EQ(std::memcmp(got_v.data(), vh.data(), vh.size() * 4), 0) << "rope_qkv v";
          // rope_qkv_kv_write against kv_write of the rotated k and v, in two pools with the
          // same initial bytes.
          const int64_t bs = 16, slots = 96;
          const size_t pool_bytes = static_cast<size_t>(slots * kv_dim) * kv_type_bytes(type);
          std::vector<uint8_t> init(pool_bytes);
          for (size_t i = 0; i < pool_bytes; ++i) init[i] = static_cast<uint8_t>(i * 37 + 11);
          cuda::DeviceBuffer k1(pool_bytes), v1(pool_bytes), k2(pool_bytes), v2(pool_bytes);
          for (cuda::DeviceBuffer* b : {&k1, &v1, &k2, &v2}) {
            cuda::upload(b->data(), init.data(), pool_bytes);
          }
          auto layer_of = [&](cuda::DeviceBuffer& k, cuda::DeviceBuffer& v) {
            cuda::DeviceKvLayer L;
            L.k = k.data();
            L.v = v.data();
            L.type = type;
            L.n_kv_heads = c.n_kv;
            L.head_dim = c.head_dim;
            L.block_slots = bs;
            return L;
          };
          cuda::kv_write(layer_of(k1, v1), d_phys.as<int64_t>(), n, r_k.as<float>(),
                         r_v.as<float>());
          cuda::DeviceBuffer o_q2(qh.size() * 4);
          cuda::rope_qkv_kv_write(src, d_pos.as<int32_t>(), d_phys.as<int64_t>(), n, c.n_heads,
                                  c.rope_dim, c.base, c.scale, style, layer_of(k2, v2),
                                  o_q2.as<float>());
          const std::vector<float> got_q2 = from_device<float>(o_q2.data(), qh.size());
          ASSERT_EQ(std::memcmp(got_q2.data(), ref_q.data(), qh.size() * 4), 0)
              << "rope_qkv_kv_write q";
          ASSERT_TRUE(from_device<uint8_t>(k1.data(), pool_bytes) ==
                      from_device<uint8_t>(k2.data(), pool_bytes))
              << "K cache";
          ASSERT_TRUE(from_device<uint8_t>(v1.data(), pool_bytes) ==
                      from_device<uint8_t>(v2.data(), pool_bytes))
              << "V cache";
        }
      }
    }
  }
}

}  // namespace
}  // namespace specdec
