// AVX2 variant of train_gemm: a register tile of 6 rows x 16 columns of C (12 ymm
// accumulators), B packed into panels [KC][16], A into panels [KC][6]. Each element's chain is
// fma(A(i,p), B(p,j), acc) over p in order, so the bits equal the scalar reference's.
#include <immintrin.h>

#include "drafter/train/train_gemm_blocked.h"

namespace specdec {
namespace detail {
namespace {

// 8 x 8 transpose in registers.
inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
    r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
  }
}

inline __m256i lane_mask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int v = static_cast<int>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), idx);
}

struct Avx2Kernel {
  static constexpr int kMR = 6;
  static constexpr int kNR = 16;
  static constexpr int kKC = 256;
  static constexpr int kMC = 192;
  static constexpr int kNC = 16 * 96;

  static bool pack_a(const MatView&, int64_t, int, int64_t, int64_t, float*) { return false; }

  // Transposed B (rs == 1, B = Wᵀ): 8 columns x 8 p at a time through an 8 x 8 transpose.
  static bool pack_b(const MatView& b, int64_t p0, int64_t kc, int64_t j0, int cols, float* bp) {
    if (b.rs != 1) return false;
    for (int h = 0; h < kNR / 8; ++h) {
      for (int64_t p = 0; p < kc; p += 8) {
        const __m256i m = lane_mask(kc - p);
        __m256 v[8];
        for (int j = 0; j < 8; ++j) {
          const int col = 8 * h + j;
          v[j] = col < cols ? _mm256_maskload_ps(b.data + (j0 + col) * b.cs + p0 + p, m)
                            : _mm256_setzero_ps();
        }
        transpose8x8(v);  // v[q] = B(p0 + p + q, j0 + 8 h .. + 8)
        const int64_t n = std::min<int64_t>(8, kc - p);
        for (int64_t q = 0; q < n; ++q) _mm256_store_ps(bp + (p + q) * kNR + 8 * h, v[q]);
      }
    }
    return true;
  }

  static void micro(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc,
                    bool load_c, int rows, int cols, const float* c_next) {
    const __m256i m0 = lane_mask(cols), m1 = lane_mask(cols - 8);
    __m256 acc[kMR][2];
    for (int i = 0; i < kMR; ++i) {
      if (load_c && i < rows) {
        acc[i][0] = _mm256_maskload_ps(c + i * ldc, m0);
        acc[i][1] = _mm256_maskload_ps(c + i * ldc + 8, m1);
      } else {
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      }
    }
    // Bring the next tile of C into L1 while this one computes (its first loads would
    // otherwise wait on L3 or memory).
    for (int i = 0; i < kMR; ++i) {
      const char* cn = reinterpret_cast<const char*>(c_next + i * ldc);
      _mm_prefetch(cn, _MM_HINT_T0);
      _mm_prefetch(cn + 63, _MM_HINT_T0);
    }
    for (int64_t p = 0; p < kc; ++p) {
      const __m256 b0 = _mm256_load_ps(bp + p * kNR);
      const __m256 b1 = _mm256_load_ps(bp + p * kNR + 8);
      const float* aq = ap + p * kMR;
      for (int i = 0; i < kMR; ++i) {
        const __m256 x = _mm256_broadcast_ss(aq + i);
        acc[i][0] = _mm256_fmadd_ps(b0, x, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(b1, x, acc[i][1]);
      }
    }
    for (int i = 0; i < kMR; ++i) {
      if (i >= rows) break;
      _mm256_maskstore_ps(c + i * ldc, m0, acc[i][0]);
      _mm256_maskstore_ps(c + i * ldc + 8, m1, acc[i][1]);
    }
  }
};

}  // namespace

void train_gemm_tile_avx2(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, MatView a,
                          MatView b, float* c, int64_t ldc, bool accumulate) {
  blocked_gemm_tile<Avx2Kernel>(i0, i1, j0, j1, k, a, b, c, ldc, accumulate);
}

}  // namespace detail
}  // namespace specdec
