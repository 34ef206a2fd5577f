// AVX2 matmul for float weights (F32, F16, BF16): the AVX-512 file's design with ymm - panels of
// 16 weight rows transposed to fp32 panel[k][16], a register tile of up to 6 activation rows x 16
// outputs, one fma chain per output over k in order (bit-identical to the reference).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/transpose_avx2.h"

namespace specdec {
namespace detail {
namespace {

using avx2::transpose8;

constexpr int kPanelRows = 16;  // NR
constexpr int kTileRows = 6;    // MR

template <GgmlType T>
inline __m256 load8(const uint8_t* row, int64_t k0) {
  if constexpr (T == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k0);
  } else if constexpr (T == GgmlType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k0)));
  } else {
    const __m256i v =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k0)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}

template <GgmlType T>
inline float load1(const uint8_t* row, int64_t k) {
  uint16_t h;
  if constexpr (T == GgmlType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  } else if constexpr (T == GgmlType::kF16) {
    std::memcpy(&h, row + 2 * k, 2);
    return fp16_to_fp32(h);
  } else {
    std::memcpy(&h, row + 2 * k, 2);
    return bf16_to_fp32(h);
  }
}

// panel[k][16] = W[row0 + j][k] (zero for j >= valid).
template <GgmlType T>
void build_panel(const WeightMatrix& w, int64_t row0, int64_t valid, float* panel) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t full = w.cols / 8 * 8;
  for (int h = 0; h < kPanelRows / 8; ++h) {
    for (int64_t k0 = 0; k0 < full; k0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t j = 8 * h + i;
        r[i] = j < valid ? load8<T>(base + (row0 + j) * w.row_bytes, k0) : _mm256_setzero_ps();
      }
      transpose8(r);
      for (int c = 0; c < 8; ++c) _mm256_store_ps(panel + (k0 + c) * kPanelRows + 8 * h, r[c]);
    }
  }
  for (int64_t k = full; k < w.cols; ++k) {
    for (int j = 0; j < kPanelRows; ++j) {
      panel[k * kPanelRows + j] = j < valid ? load1<T>(base + (row0 + j) * w.row_bytes, k) : 0.0f;
    }
  }
}

template <int MR>
void micro_kernel(const float* panel, const float* x0, int64_t ldx, int64_t cols, float* y,
                  int64_t ldy, int64_t row0, int64_t valid) {
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < cols; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + k * kPanelRows);
    const __m256 w1 = _mm256_load_ps(panel + k * kPanelRows + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_broadcast_ss(x0 + i * ldx + k);
      acc[i][0] = _mm256_fmadd_ps(w0, xv, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(w1, xv, acc[i][1]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* yi = y + i * ldy + row0;
    if (valid == kPanelRows) {
      _mm256_storeu_ps(yi, acc[i][0]);
      _mm256_storeu_ps(yi + 8, acc[i][1]);
    } else {
      alignas(32) float out[16];
      _mm256_store_ps(out, acc[i][0]);
      _mm256_store_ps(out + 8, acc[i][1]);
      for (int64_t j = 0; j < valid; ++j) yi[j] = out[j];
    }
  }
}

template <GgmlType T>
void float_rows(const WeightMatrix& w, const float* x, int64_t n, float* y, int64_t r0,
                int64_t r1) {
  auto* panel =
      static_cast<float*>(thread_scratch(kScratchWeights)
                              .get(static_cast<size_t>(w.cols * kPanelRows) * sizeof(float)));
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
    const int64_t valid = std::min<int64_t>(kPanelRows, r1 - p0);
    build_panel<T>(w, p0, valid, panel);
    for (int64_t i0 = 0; i0 < n; i0 += kTileRows) {
      const float* xi = x + i0 * w.cols;
      float* yi = y + i0 * w.rows;
      switch (std::min<int64_t>(kTileRows, n - i0)) {
        case 6:
          micro_kernel<6>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
        case 5:
          micro_kernel<5>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
        case 4:
          micro_kernel<4>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
        case 3:
          micro_kernel<3>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
        case 2:
          micro_kernel<2>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
        default:
          micro_kernel<1>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
      }
    }
  }
}

}  // namespace

void matmul_float_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y,
                       ThreadPool* pool) {
  auto body = [&](int64_t r0, int64_t r1) {
    switch (w.type) {
      case GgmlType::kF32:
        return float_rows<GgmlType::kF32>(w, x, n, y, r0, r1);
      case GgmlType::kF16:
        return float_rows<GgmlType::kF16>(w, x, n, y, r0, r1);
      default:
        return float_rows<GgmlType::kBF16>(w, x, n, y, r0, r1);
    }
  };
  if (pool) {
    pool->parallel_for(w.rows, kPanelRows, body);
  } else {
    body(0, w.rows);
  }
}

}  // namespace detail
}  // namespace specdec
