// AVX2 + FMA kernels of the element-wise and attention ops (the OpsKernels table for
// Isa::kAvx2). Compiled with -mavx2 -mfma; only called where the CPU supports them.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/ops.h"

namespace specdec {
namespace {

constexpr int kLanes = 8;

// Lane mask for the first n (0..8) lanes: loadu(kTailMask + 8 - n).
alignas(32) constexpr int32_t kTailMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                               0,  0,  0,  0,  0,  0,  0,  0};
inline __m256i tail_mask(int64_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailMask + kLanes - n));
}

inline float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// The four horizontal sums {Σa, Σb, Σc, Σd}.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// exp(x), Cephes-style: x = n·ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r, and
// 2^n built in the exponent field. Relative error about 2 ulp; 0 below ln(FLT_MIN), +inf above
// ln(FLT_MAX) (denormal results are flushed to 0).
inline __m256 exp_ps(__m256 x) {
  const __m256 kMin = _mm256_set1_ps(-87.33654475f);  // ln(FLT_MIN)
  const __m256 kMax = _mm256_set1_ps(88.72283905f);   // ln(FLT_MAX)
  // Operand order keeps a NaN: min/max return the second operand when either is NaN.
  const __m256 xc = _mm256_max_ps(kMin, _mm256_min_ps(kMax, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n <= 127 keeps 2^n finite; e^r absorbs the rest for x near ln(FLT_MAX).
  const __m256i ni = _mm256_cvtps_epi32(_mm256_min_ps(n, _mm256_set1_ps(127.0f)));
  const __m256 pow2n =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  __m256 result = _mm256_mul_ps(y, pow2n);
  result = _mm256_andnot_ps(_mm256_cmp_ps(x, kMin, _CMP_LT_OQ), result);
  return _mm256_blendv_ps(result, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, kMax, _CMP_GT_OQ));
}

void rmsnorm_avx2(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                  float* y) {
  const int64_t dim_vec = dim / kLanes * kLanes;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;  // [dim]
    float* yr = y + r * dim;        // [dim]
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 4 * kLanes <= dim; i += 4 * kLanes) {
      for (int u = 0; u < 4; ++u) {
        const __m256 xv = _mm256_loadu_ps(xr + i + u * kLanes);
        acc[u] = _mm256_fmadd_ps(xv, xv, acc[u]);
      }
    }
    for (; i < dim_vec; i += kLanes) {
      const __m256 xv = _mm256_loadu_ps(xr + i);
      acc[0] = _mm256_fmadd_ps(xv, xv, acc[0]);
    }
    float sum_sq = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < dim; ++i) sum_sq += xr[i] * xr[i];
    const __m256 inv_rms =
        _mm256_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps));
    for (i = 0; i < dim_vec; i += kLanes) {
      const __m256 xv = _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv_rms);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(xv, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = xr[i] * _mm256_cvtss_f32(inv_rms) * weight[i];
  }
}

inline __m256 swiglu_ps(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void swiglu_avx2(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(out + i, swiglu_ps(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    const __m256 u = _mm256_maskload_ps(up + i, m);
    _mm256_maskstore_ps(out + i, m, swiglu_ps(g, u));
  }
}

float exp_shifted_sum_avx2(float* x, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 mx = neg_inf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 xv = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + i, m),
                                       _mm256_castsi256_ps(m));
    mx = _mm256_max_ps(mx, xv);
  }
  const __m256 max = _mm256_set1_ps(hmax(mx));
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int u = 0; u < 4; ++u) {
      const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + u * kLanes), max));
      _mm256_storeu_ps(x + i + u * kLanes, e);
      acc[u] = _mm256_add_ps(acc[u], e);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), max));
    _mm256_storeu_ps(x + i, e);
    acc[0] = _mm256_add_ps(acc[0], e);
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), max));
    _mm256_maskstore_ps(x + i, m, e);
    acc[1] = _mm256_add_ps(acc[1], _mm256_and_ps(e, _mm256_castsi256_ps(m)));
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

void scale_avx2(float* x, int64_t n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), av));
  }
}

// Scores of R (1..4) query rows against n_rows K rows; each K chunk is loaded once for all R.
template <int R>
void scores_block(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int head_dim,
                  float scale, float* s, int64_t ld_s) {
  const int d_vec = head_dim / kLanes * kLanes;
  for (int64_t j = 0; j < n_rows; ++j) {
    const float* kj = k + j * k_stride;  // [head_dim]
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int d = 0; d < d_vec; d += kLanes) {
      const __m256 kv = _mm256_loadu_ps(kj + d);
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * head_dim + d), kv, acc[r]);
      }
    }
    alignas(16) float dots[4];
    _mm_store_ps(dots, hsum4(acc[0], acc[1], acc[2], acc[3]));
    for (int d = d_vec; d < head_dim; ++d) {
      for (int r = 0; r < R; ++r) dots[r] += q[r * head_dim + d] * kj[d];
    }
    for (int r = 0; r < R; ++r) s[r * ld_s + j] = scale * dots[r];
  }
}

void attn_scores_avx2(const float* q, int n_q, const float* k, int64_t k_stride, int64_t n_rows,
                      int head_dim, float scale, float* s, int64_t ld_s) {
  int r = 0;
  for (; r + 4 <= n_q; r += 4) {
    scores_block<4>(q + r * head_dim, k, k_stride, n_rows, head_dim, scale, s + r * ld_s, ld_s);
  }
  const float* qr = q + r * head_dim;
  float* sr = s + r * ld_s;
  switch (n_q - r) {
    case 3: scores_block<3>(qr, k, k_stride, n_rows, head_dim, scale, sr, ld_s); break;
    case 2: scores_block<2>(qr, k, k_stride, n_rows, head_dim, scale, sr, ld_s); break;
    case 1: scores_block<1>(qr, k, k_stride, n_rows, head_dim, scale, sr, ld_s); break;
    default: break;
  }
}

// out[r, 0 : C*8] += Σ_j p[r, j] v[j, 0 : C*8] for R (1..4) rows, accumulators in registers.
template <int R, int C>
void accumulate_block(const float* p, int64_t ld_p, const float* v, int64_t v_stride,
                      int64_t n_rows, int head_dim, float* out) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(out + r * head_dim + c * kLanes);
  }
  for (int64_t j = 0; j < n_rows; ++j) {
    const float* vj = v + j * v_stride;
    __m256 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = _mm256_loadu_ps(vj + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * ld_p + j);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(pr, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + r * head_dim + c * kLanes, acc[r][c]);
  }
}

template <int R>
void accumulate_rows(const float* p, int64_t ld_p, const float* v, int64_t v_stride,
                     int64_t n_rows, int head_dim, float* out) {
  const int d_vec = head_dim / kLanes * kLanes;
  int d = 0;
  for (; d + 2 * kLanes <= d_vec; d += 2 * kLanes) {
    accumulate_block<R, 2>(p, ld_p, v + d, v_stride, n_rows, head_dim, out + d);
  }
  if (d < d_vec) {
    accumulate_block<R, 1>(p, ld_p, v + d, v_stride, n_rows, head_dim, out + d);
    d += kLanes;
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t j = 0; j < n_rows; ++j) {
      const float pj = p[r * ld_p + j];
      for (int dd = d; dd < head_dim; ++dd) out[r * head_dim + dd] += pj * v[j * v_stride + dd];
    }
  }
}

void attn_accumulate_avx2(const float* p, int64_t ld_p, int n_q, const float* v,
                          int64_t v_stride, int64_t n_rows, int head_dim, float* out) {
  int r = 0;
  for (; r + 4 <= n_q; r += 4) {
    accumulate_rows<4>(p + r * ld_p, ld_p, v, v_stride, n_rows, head_dim, out + r * head_dim);
  }
  const float* pr = p + r * ld_p;
  float* out_r = out + r * head_dim;
  switch (n_q - r) {
    case 3: accumulate_rows<3>(pr, ld_p, v, v_stride, n_rows, head_dim, out_r); break;
    case 2: accumulate_rows<2>(pr, ld_p, v, v_stride, n_rows, head_dim, out_r); break;
    case 1: accumulate_rows<1>(pr, ld_p, v, v_stride, n_rows, head_dim, out_r); break;
    default: break;
  }
}

}  // namespace

const OpsKernels& ops_kernels_avx2() {
  static const OpsKernels kernels = {
      rmsnorm_avx2,     swiglu_avx2,          exp_shifted_sum_avx2, scale_avx2,
      attn_scores_avx2, attn_accumulate_avx2,
  };
  return kernels;
}

}  // namespace specdec
