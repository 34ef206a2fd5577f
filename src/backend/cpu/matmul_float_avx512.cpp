// AVX-512 matmul for float weights (F32, F16, BF16).
//
// Each output is one fma chain over k = 0 .. cols-1 (see quant_kernels.h), so the result equals
// the scalar reference bit for bit whatever n is. To make that fast, weights are converted in
// panels of 48 rows into a transposed fp32 buffer panel[k][48] (L2-resident), and a register
// tile of up to 8 activation rows x 48 outputs (24 zmm accumulators) walks k, broadcasting one
// activation per row and k.
#include <algorithm>
#include <cstdint>

#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_weights_avx512.h"
#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace detail {
namespace {

using avx512::transpose16;

constexpr int kPanelRows = 48;  // NR: weight rows per panel (3 zmm of outputs)
constexpr int kTileRows = 8;    // MR: activation rows per register tile

template <GgmlType T>
inline __m512 load16(const uint8_t* row, int64_t k0, __mmask16 mask) {
  if constexpr (T == GgmlType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + k0);
  } else if constexpr (T == GgmlType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row + 2 * k0));
  } else {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row + 2 * k0));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}

// panel[k][48] = W[row0 + j][k] as float (zero for j >= valid).
template <GgmlType T>
void build_panel(const WeightMatrix& w, int64_t row0, int64_t valid, float* panel) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int h = 0; h < kPanelRows / 16; ++h) {
    for (int64_t k0 = 0; k0 < w.cols; k0 += 16) {
      const int64_t kn = std::min<int64_t>(16, w.cols - k0);
      const auto mask = static_cast<__mmask16>((1u << kn) - 1);
      __m512 a[16];
      for (int r = 0; r < 16; ++r) {
        const int64_t j = 16 * h + r;
        a[r] =
            j < valid ? load16<T>(base + (row0 + j) * w.row_bytes, k0, mask) : _mm512_setzero_ps();
      }
      transpose16(a);
      for (int64_t c = 0; c < kn; ++c)
        _mm512_store_ps(panel + (k0 + c) * kPanelRows + 16 * h, a[c]);
    }
  }
}

// y[i][row0 + j] for i < MR, j < valid: fma chains over k with x rows x0 + i * ldx.
template <int MR>
void micro_kernel(const float* panel, const float* x0, int64_t ldx, int64_t cols, float* y,
                  int64_t ldy, int64_t row0, int64_t valid) {
  __m512 acc[MR][3];
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = _mm512_setzero_ps();
    acc[i][1] = _mm512_setzero_ps();
    acc[i][2] = _mm512_setzero_ps();
  }
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) xr[i] = x0 + i * ldx;
  for (int64_t k = 0; k < cols; ++k) {
    const float* p = panel + k * kPanelRows;
    const __m512 w0 = _mm512_load_ps(p);
    const __m512 w1 = _mm512_load_ps(p + 16);
    const __m512 w2 = _mm512_load_ps(p + 32);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_set1_ps(xr[i][k]);
      acc[i][0] = _mm512_fmadd_ps(w0, xv, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(w1, xv, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(w2, xv, acc[i][2]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* yi = y + i * ldy + row0;
    for (int c = 0; c < 3; ++c) {
      const int64_t left = std::clamp<int64_t>(valid - 16 * c, 0, 16);
      _mm512_mask_storeu_ps(yi + 16 * c, static_cast<__mmask16>((1u << left) - 1), acc[i][c]);
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
        case 8:
          micro_kernel<8>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
        case 7:
          micro_kernel<7>(panel, xi, w.cols, w.cols, yi, w.rows, p0, valid);
          break;
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

void matmul_float_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y,
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
