// AVX-512 (F/BW/VL/DQ) kernels of the element-wise and attention ops (the OpsKernels table for
// Isa::kAvx512). Tails use lane masks instead of scalar loops. Only called where supported.
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a false positive of the compiler's headers); silence that here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/ops.h"

namespace specdec {
namespace {

constexpr int kLanes = 16;

inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// The four horizontal sums {Σa, Σb, Σc, Σd}.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  auto fold = [](__m512 z) {
    return _mm256_add_ps(_mm512_castps512_ps256(z),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
  };
  const __m256 ab = _mm256_hadd_ps(fold(a), fold(b));
  const __m256 cd = _mm256_hadd_ps(fold(c), fold(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// exp(x): x = n·ln2 + r with |r| <= ln2/2, the same degree-6 polynomial as the AVX2 variant,
// and 2^n applied with vscalefps, which gives +inf on overflow and gradual underflow to 0
// (exp(-inf) = 0) without special cases. Relative error about 2 ulp.
inline __m512 exp_ps(__m512 x) {
  // Operand order keeps a NaN: min/max return the second operand when either is NaN.
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

void rmsnorm_avx512(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                    float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;  // [dim]
    float* yr = y + r * dim;        // [dim]
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 4 * kLanes <= dim; i += 4 * kLanes) {
      for (int u = 0; u < 4; ++u) {
        const __m512 xv = _mm512_loadu_ps(xr + i + u * kLanes);
        acc[u] = _mm512_fmadd_ps(xv, xv, acc[u]);
      }
    }
    for (; i + kLanes <= dim; i += kLanes) {
      const __m512 xv = _mm512_loadu_ps(xr + i);
      acc[0] = _mm512_fmadd_ps(xv, xv, acc[0]);
    }
    if (i < dim) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail_mask(dim - i), xr + i);
      acc[1] = _mm512_fmadd_ps(xv, xv, acc[1]);
    }
    const float sum_sq = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    const __m512 inv_rms = _mm512_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps));
    for (i = 0; i + kLanes <= dim; i += kLanes) {
      const __m512 xv = _mm512_mul_ps(_mm512_loadu_ps(xr + i), inv_rms);
      _mm512_storeu_ps(yr + i, _mm512_mul_ps(xv, _mm512_loadu_ps(weight + i)));
    }
    if (i < dim) {
      const __mmask16 m = tail_mask(dim - i);
      const __m512 xv = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv_rms);
      _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(xv, _mm512_maskz_loadu_ps(m, weight + i)));
    }
  }
}

inline __m512 swiglu_ps(__m512 g, __m512 u) {
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(out + i, swiglu_ps(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    _mm512_mask_storeu_ps(out + i, m, swiglu_ps(g, u));
  }
}

float exp_shifted_sum_avx512(float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 mx = neg_inf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
  if (i < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail_mask(n - i), x + i));
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int u = 0; u < 4; ++u) {
      const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + u * kLanes), max));
      _mm512_storeu_ps(x + i + u * kLanes, e);
      acc[u] = _mm512_add_ps(acc[u], e);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), max));
    _mm512_storeu_ps(x + i, e);
    acc[0] = _mm512_add_ps(acc[0], e);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max));
    _mm512_mask_storeu_ps(x + i, m, e);
    acc[1] = _mm512_mask_add_ps(acc[1], m, acc[1], e);
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

void scale_avx512(float* x, int64_t n, float a) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), av));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), av));
  }
}

// Scores of R (1..4) query rows against one K row at a time (the rows left over by
// scores_rows4). The accumulators are named variables rather than an array, which GCC may keep
// in memory.
template <int R>
void scores_rows1(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int head_dim,
                  float scale, float* s, int64_t ld_s) {
  const float* q0 = q;  // [head_dim] each
  const float* q1 = q + (R > 1 ? head_dim : 0);
  const float* q2 = q + (R > 2 ? 2 * head_dim : 0);
  const float* q3 = q + (R > 3 ? 3 * head_dim : 0);
  for (int64_t j = 0; j < n_rows; ++j) {
    const float* kj = k + j * k_stride;  // [head_dim]
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < head_dim; d += kLanes) {
      const __mmask16 m = tail_mask(head_dim - d < kLanes ? head_dim - d : kLanes);
      const __m512 kv = _mm512_maskz_loadu_ps(m, kj + d);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q0 + d), kv, a0);
      if constexpr (R > 1) a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q1 + d), kv, a1);
      if constexpr (R > 2) a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q2 + d), kv, a2);
      if constexpr (R > 3) a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q3 + d), kv, a3);
    }
    alignas(16) float dots[4];
    _mm_store_ps(dots, hsum4(a0, a1, a2, a3));
    for (int r = 0; r < R; ++r) s[r * ld_s + j] = scale * dots[r];
  }
}

// Scores of R (1..4) query rows against blocks of 4 K rows: 4·R accumulators, so each K and q
// chunk is loaded once per block and one hsum4 gives a query's 4 scores. Masked loads cover a
// head_dim that is not a multiple of 16.
template <int R>
void scores_rows4(const float* q, const float* k, int64_t k_stride, int64_t n_blocks, int head_dim,
                  float scale, float* s, int64_t ld_s) {
  const __m128 scale4 = _mm_set1_ps(scale);
  const float* q0 = q;  // [head_dim] each
  const float* q1 = q + (R > 1 ? head_dim : 0);
  const float* q2 = q + (R > 2 ? 2 * head_dim : 0);
  const float* q3 = q + (R > 3 ? 3 * head_dim : 0);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* k0 = k + 4 * b * k_stride;  // [head_dim] each
    const float* k1 = k0 + k_stride;
    const float* k2 = k1 + k_stride;
    const float* k3 = k2 + k_stride;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
    __m512 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    __m512 c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    for (int d = 0; d < head_dim; d += kLanes) {
      const __mmask16 m = tail_mask(head_dim - d < kLanes ? head_dim - d : kLanes);
      const __m512 x0 = _mm512_maskz_loadu_ps(m, k0 + d);
      const __m512 x1 = _mm512_maskz_loadu_ps(m, k1 + d);
      const __m512 x2 = _mm512_maskz_loadu_ps(m, k2 + d);
      const __m512 x3 = _mm512_maskz_loadu_ps(m, k3 + d);
      __m512 qv = _mm512_maskz_loadu_ps(m, q0 + d);
      c00 = _mm512_fmadd_ps(qv, x0, c00);
      c01 = _mm512_fmadd_ps(qv, x1, c01);
      c02 = _mm512_fmadd_ps(qv, x2, c02);
      c03 = _mm512_fmadd_ps(qv, x3, c03);
      if constexpr (R > 1) {
        qv = _mm512_maskz_loadu_ps(m, q1 + d);
        c10 = _mm512_fmadd_ps(qv, x0, c10);
        c11 = _mm512_fmadd_ps(qv, x1, c11);
        c12 = _mm512_fmadd_ps(qv, x2, c12);
        c13 = _mm512_fmadd_ps(qv, x3, c13);
      }
      if constexpr (R > 2) {
        qv = _mm512_maskz_loadu_ps(m, q2 + d);
        c20 = _mm512_fmadd_ps(qv, x0, c20);
        c21 = _mm512_fmadd_ps(qv, x1, c21);
        c22 = _mm512_fmadd_ps(qv, x2, c22);
        c23 = _mm512_fmadd_ps(qv, x3, c23);
      }
      if constexpr (R > 3) {
        qv = _mm512_maskz_loadu_ps(m, q3 + d);
        c30 = _mm512_fmadd_ps(qv, x0, c30);
        c31 = _mm512_fmadd_ps(qv, x1, c31);
        c32 = _mm512_fmadd_ps(qv, x2, c32);
        c33 = _mm512_fmadd_ps(qv, x3, c33);
      }
    }
    float* sb = s + 4 * b;  // [R, ld_s], columns 4b .. 4b+3
    _mm_storeu_ps(sb, _mm_mul_ps(scale4, hsum4(c00, c01, c02, c03)));
    if constexpr (R > 1) _mm_storeu_ps(sb + ld_s, _mm_mul_ps(scale4, hsum4(c10, c11, c12, c13)));
    if constexpr (R > 2) {
      _mm_storeu_ps(sb + 2 * ld_s, _mm_mul_ps(scale4, hsum4(c20, c21, c22, c23)));
    }
    if constexpr (R > 3) {
      _mm_storeu_ps(sb + 3 * ld_s, _mm_mul_ps(scale4, hsum4(c30, c31, c32, c33)));
    }
  }
}

template <int R>
void scores_block(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int head_dim,
                  float scale, float* s, int64_t ld_s) {
  const int64_t n_blocks = n_rows / 4;
  scores_rows4<R>(q, k, k_stride, n_blocks, head_dim, scale, s, ld_s);
  const int64_t j = 4 * n_blocks;
  if (j < n_rows) {
    scores_rows1<R>(q, k + j * k_stride, k_stride, n_rows - j, head_dim, scale, s + j, ld_s);
  }
}

void attn_scores_avx512(const float* q, int n_q, const float* k, int64_t k_stride, int64_t n_rows,
                        int head_dim, float scale, float* s, int64_t ld_s) {
  int r = 0;
  for (; r + 4 <= n_q; r += 4) {
    scores_block<4>(q + r * head_dim, k, k_stride, n_rows, head_dim, scale, s + r * ld_s, ld_s);
  }
  const float* qr = q + r * head_dim;
  float* sr = s + r * ld_s;
  switch (n_q - r) {
    case 3:
      scores_block<3>(qr, k, k_stride, n_rows, head_dim, scale, sr, ld_s);
      break;
    case 2:
      scores_block<2>(qr, k, k_stride, n_rows, head_dim, scale, sr, ld_s);
      break;
    case 1:
      scores_block<1>(qr, k, k_stride, n_rows, head_dim, scale, sr, ld_s);
      break;
    default:
      break;
  }
}

// out[r, 0:64] += Σ_j p[r, j] · v[j, 0:64] for R (1..4) rows: four 16-lane chunks (lanes
// m[0..3]; a full mask costs nothing extra) per row, so a pass reads each V row's whole 256 bytes
// at once; all 4·R accumulators are named registers (an array may be kept in memory by GCC).
template <int R>
void accumulate_pass(const float* p, int64_t ld_p, const float* v, int64_t v_stride, int64_t n_rows,
                     int head_dim, const __mmask16 m[4], float* out) {
  const __mmask16 m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3];
  const float* p0 = p;  // [n_rows] each
  const float* p1 = p + (R > 1 ? ld_p : 0);
  const float* p2 = p + (R > 2 ? 2 * ld_p : 0);
  const float* p3 = p + (R > 3 ? 3 * ld_p : 0);
  float* o0 = out;  // [64] each
  float* o1 = out + (R > 1 ? head_dim : 0);
  float* o2 = out + (R > 2 ? 2 * head_dim : 0);
  float* o3 = out + (R > 3 ? 3 * head_dim : 0);
  __m512 a00 = _mm512_maskz_loadu_ps(m0, o0), a01 = _mm512_maskz_loadu_ps(m1, o0 + kLanes);
  __m512 a02 = _mm512_maskz_loadu_ps(m2, o0 + 2 * kLanes);
  __m512 a03 = _mm512_maskz_loadu_ps(m3, o0 + 3 * kLanes);
  __m512 a10 = _mm512_setzero_ps(), a11 = a10, a12 = a10, a13 = a10;
  __m512 a20 = a10, a21 = a10, a22 = a10, a23 = a10;
  __m512 a30 = a10, a31 = a10, a32 = a10, a33 = a10;
  if constexpr (R > 1) {
    a10 = _mm512_maskz_loadu_ps(m0, o1);
    a11 = _mm512_maskz_loadu_ps(m1, o1 + kLanes);
    a12 = _mm512_maskz_loadu_ps(m2, o1 + 2 * kLanes);
    a13 = _mm512_maskz_loadu_ps(m3, o1 + 3 * kLanes);
  }
  if constexpr (R > 2) {
    a20 = _mm512_maskz_loadu_ps(m0, o2);
    a21 = _mm512_maskz_loadu_ps(m1, o2 + kLanes);
    a22 = _mm512_maskz_loadu_ps(m2, o2 + 2 * kLanes);
    a23 = _mm512_maskz_loadu_ps(m3, o2 + 3 * kLanes);
  }
  if constexpr (R > 3) {
    a30 = _mm512_maskz_loadu_ps(m0, o3);
    a31 = _mm512_maskz_loadu_ps(m1, o3 + kLanes);
    a32 = _mm512_maskz_loadu_ps(m2, o3 + 2 * kLanes);
    a33 = _mm512_maskz_loadu_ps(m3, o3 + 3 * kLanes);
  }
  for (int64_t j = 0; j < n_rows; ++j) {
    const float* vj = v + j * v_stride;
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, vj);
    const __m512 v1 = _mm512_maskz_loadu_ps(m1, vj + kLanes);
    const __m512 v2 = _mm512_maskz_loadu_ps(m2, vj + 2 * kLanes);
    const __m512 v3 = _mm512_maskz_loadu_ps(m3, vj + 3 * kLanes);
    __m512 pr = _mm512_set1_ps(p0[j]);
    a00 = _mm512_fmadd_ps(pr, v0, a00);
    a01 = _mm512_fmadd_ps(pr, v1, a01);
    a02 = _mm512_fmadd_ps(pr, v2, a02);
    a03 = _mm512_fmadd_ps(pr, v3, a03);
    if constexpr (R > 1) {
      pr = _mm512_set1_ps(p1[j]);
      a10 = _mm512_fmadd_ps(pr, v0, a10);
      a11 = _mm512_fmadd_ps(pr, v1, a11);
      a12 = _mm512_fmadd_ps(pr, v2, a12);
      a13 = _mm512_fmadd_ps(pr, v3, a13);
    }
    if constexpr (R > 2) {
      pr = _mm512_set1_ps(p2[j]);
      a20 = _mm512_fmadd_ps(pr, v0, a20);
      a21 = _mm512_fmadd_ps(pr, v1, a21);
      a22 = _mm512_fmadd_ps(pr, v2, a22);
      a23 = _mm512_fmadd_ps(pr, v3, a23);
    }
    if constexpr (R > 3) {
      pr = _mm512_set1_ps(p3[j]);
      a30 = _mm512_fmadd_ps(pr, v0, a30);
      a31 = _mm512_fmadd_ps(pr, v1, a31);
      a32 = _mm512_fmadd_ps(pr, v2, a32);
      a33 = _mm512_fmadd_ps(pr, v3, a33);
    }
  }
  _mm512_mask_storeu_ps(o0, m0, a00);
  _mm512_mask_storeu_ps(o0 + kLanes, m1, a01);
  _mm512_mask_storeu_ps(o0 + 2 * kLanes, m2, a02);
  _mm512_mask_storeu_ps(o0 + 3 * kLanes, m3, a03);
  if constexpr (R > 1) {
    _mm512_mask_storeu_ps(o1, m0, a10);
    _mm512_mask_storeu_ps(o1 + kLanes, m1, a11);
    _mm512_mask_storeu_ps(o1 + 2 * kLanes, m2, a12);
    _mm512_mask_storeu_ps(o1 + 3 * kLanes, m3, a13);
  }
  if constexpr (R > 2) {
    _mm512_mask_storeu_ps(o2, m0, a20);
    _mm512_mask_storeu_ps(o2 + kLanes, m1, a21);
    _mm512_mask_storeu_ps(o2 + 2 * kLanes, m2, a22);
    _mm512_mask_storeu_ps(o2 + 3 * kLanes, m3, a23);
  }
  if constexpr (R > 3) {
    _mm512_mask_storeu_ps(o3, m0, a30);
    _mm512_mask_storeu_ps(o3 + kLanes, m1, a31);
    _mm512_mask_storeu_ps(o3 + 2 * kLanes, m2, a32);
    _mm512_mask_storeu_ps(o3 + 3 * kLanes, m3, a33);
  }
}

template <int R>
void accumulate_rows(const float* p, int64_t ld_p, const float* v, int64_t v_stride, int64_t n_rows,
                     int head_dim, float* out) {
  for (int d = 0; d < head_dim; d += 4 * kLanes) {
    __mmask16 m[4];
    for (int c = 0; c < 4; ++c) {
      const int rem = head_dim - d - c * kLanes;
      m[c] = tail_mask(rem <= 0 ? 0 : rem < kLanes ? rem : kLanes);
    }
    accumulate_pass<R>(p, ld_p, v + d, v_stride, n_rows, head_dim, m, out + d);
  }
}

void attn_accumulate_avx512(const float* p, int64_t ld_p, int n_q, const float* v, int64_t v_stride,
                            int64_t n_rows, int head_dim, float* out) {
  int r = 0;
  for (; r + 4 <= n_q; r += 4) {
    accumulate_rows<4>(p + r * ld_p, ld_p, v, v_stride, n_rows, head_dim, out + r * head_dim);
  }
  const float* pr = p + r * ld_p;
  float* out_r = out + r * head_dim;
  switch (n_q - r) {
    case 3:
      accumulate_rows<3>(pr, ld_p, v, v_stride, n_rows, head_dim, out_r);
      break;
    case 2:
      accumulate_rows<2>(pr, ld_p, v, v_stride, n_rows, head_dim, out_r);
      break;
    case 1:
      accumulate_rows<1>(pr, ld_p, v, v_stride, n_rows, head_dim, out_r);
      break;
    default:
      break;
  }
}

}  // namespace

const OpsKernels& ops_kernels_avx512() {
  static const OpsKernels kernels = {
      rmsnorm_avx512, swiglu_avx512,      exp_shifted_sum_avx512,
      scale_avx512,   attn_scores_avx512, attn_accumulate_avx512,
  };
  return kernels;
}

}  // namespace specdec
