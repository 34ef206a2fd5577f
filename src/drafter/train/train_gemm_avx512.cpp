// AVX-512 variant of train_gemm: a register tile of 8 rows x 48 columns of C (24 zmm
// accumulators), B packed into panels [KC][48] (three vector loads per p), A into panels
// [KC][8] (one broadcast per row and p). Each element's chain is fma(A(i,p), B(p,j), acc) over
// p in order, so the bits equal the scalar reference's.
#include <immintrin.h>

#include "backend/cpu/quant_weights_avx512.h"
#include "drafter/train/train_gemm_blocked.h"

namespace specdec {
namespace detail {
namespace {

// The 16 x 16 register transpose of the quantized kernels (rows a[0..15] become columns).
using avx512::transpose16;

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff)
                 : n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1);
}

struct Avx512Kernel {
  static constexpr int kMR = 8;
  static constexpr int kNR = 48;
  static constexpr int kKC = 256;
  static constexpr int kMC = 192;
  static constexpr int kNC = 48 * 32;

  // Row-major A (cs == 1): 8 rows x 16 p at a time, transposed through a 16 x 16 block.
  static bool pack_a(const MatView& a, int64_t i0, int rows, int64_t p0, int64_t kc, float* ap) {
    if (a.cs != 1) return false;
    for (int64_t p = 0; p < kc; p += 16) {
      const __mmask16 m = first_lanes(kc - p);
      __m512 v[16];
      for (int i = 0; i < 16; ++i) {
        v[i] = i < rows ? _mm512_maskz_loadu_ps(m, a.data + (i0 + i) * a.rs + p0 + p)
                        : _mm512_setzero_ps();
      }
      transpose16(v);  // v[q] = column p + q: lanes 0..7 are rows 0..7
      const int64_t n = std::min<int64_t>(16, kc - p);
      for (int64_t q = 0; q < n; ++q) {
        _mm256_store_ps(ap + (p + q) * kMR, _mm512_castps512_ps256(v[q]));
      }
    }
    return true;
  }

  // Transposed B (rs == 1, B = Wᵀ): 16 columns x 16 p at a time through a 16 x 16 transpose.
  static bool pack_b(const MatView& b, int64_t p0, int64_t kc, int64_t j0, int cols, float* bp) {
    if (b.rs != 1) return false;
    for (int h = 0; h < kNR / 16; ++h) {
      for (int64_t p = 0; p < kc; p += 16) {
        const __mmask16 m = first_lanes(kc - p);
        __m512 v[16];
        for (int j = 0; j < 16; ++j) {
          const int col = 16 * h + j;
          v[j] = col < cols ? _mm512_maskz_loadu_ps(m, b.data + (j0 + col) * b.cs + p0 + p)
                            : _mm512_setzero_ps();
        }
        transpose16(v);  // v[q] = B(p0 + p + q, j0 + 16 h .. + 16)
        const int64_t n = std::min<int64_t>(16, kc - p);
        for (int64_t q = 0; q < n; ++q) _mm512_store_ps(bp + (p + q) * kNR + 16 * h, v[q]);
      }
    }
    return true;
  }

  static void micro(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc,
                    bool load_c, int rows, int cols, const float* c_next) {
    const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16),
                    m2 = first_lanes(cols - 32);
    __m512 acc[kMR][3];
    for (int i = 0; i < kMR; ++i) {
      if (load_c && i < rows) {
        const float* ci = c + i * ldc;
        acc[i][0] = _mm512_maskz_loadu_ps(m0, ci);
        acc[i][1] = _mm512_maskz_loadu_ps(m1, ci + 16);
        acc[i][2] = _mm512_maskz_loadu_ps(m2, ci + 32);
      } else {
        acc[i][0] = acc[i][1] = acc[i][2] = _mm512_setzero_ps();
      }
    }
    // Bring the next tile of C into L1 while this one computes (its first loads would
    // otherwise wait on L3 or memory).
    for (int i = 0; i < kMR; ++i) {
      const char* cn = reinterpret_cast<const char*>(c_next + i * ldc);
      _mm_prefetch(cn, _MM_HINT_T0);
      _mm_prefetch(cn + 64, _MM_HINT_T0);
      _mm_prefetch(cn + 128, _MM_HINT_T0);
      _mm_prefetch(cn + 191, _MM_HINT_T0);
    }
    for (int64_t p = 0; p < kc; ++p) {
      const float* bq = bp + p * kNR;
      const __m512 b0 = _mm512_load_ps(bq);
      const __m512 b1 = _mm512_load_ps(bq + 16);
      const __m512 b2 = _mm512_load_ps(bq + 32);
      const float* aq = ap + p * kMR;
      for (int i = 0; i < kMR; ++i) {
        const __m512 x = _mm512_set1_ps(aq[i]);
        acc[i][0] = _mm512_fmadd_ps(b0, x, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(b1, x, acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(b2, x, acc[i][2]);
      }
    }
    for (int i = 0; i < kMR; ++i) {
      if (i >= rows) break;
      float* ci = c + i * ldc;
      _mm512_mask_storeu_ps(ci, m0, acc[i][0]);
      _mm512_mask_storeu_ps(ci + 16, m1, acc[i][1]);
      _mm512_mask_storeu_ps(ci + 32, m2, acc[i][2]);
    }
  }
};

}  // namespace

void train_gemm_tile_avx512(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, MatView a,
                            MatView b, float* c, int64_t ldc, bool accumulate) {
  blocked_gemm_tile<Avx512Kernel>(i0, i1, j0, j1, k, a, b, c, ldc, accumulate);
}

}  // namespace detail
}  // namespace specdec
