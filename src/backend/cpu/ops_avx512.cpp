// AVX-512 (F/BW/VL/DQ) kernels of the element-wise and attention ops (the OpsKernels table for
// Isa::kAvx512). Tails use lane masks instead of scalar loops. Only called where supported.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/ops.h"

namespace specdec {
namespace {

constexpr int kLanes = 16;

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

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
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-104.0f),
                                  _mm512_min_ps(_mm512_set1_ps(89.0f), x));
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
    const __m512 inv_rms =
        _mm512_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps));
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

// Scores of R (1..4) query rows against n_rows K rows; each K chunk is loaded once for all R.
template <int R>
void scores_block(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int head_dim,
                  float scale, float* s, int64_t ld_s) {
  const int d_vec = head_dim / kLanes * kLanes;
  const __mmask16 m_tail = tail_mask(head_dim - d_vec);
  for (int64_t j = 0; j < n_rows; ++j) {
    const float* kj = k + j * k_stride;  // [head_dim]
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int d = 0; d < d_vec; d += kLanes) {
      const __m512 kv = _mm512_loadu_ps(kj + d);
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * head_dim + d), kv, acc[r]);
      }
    }
    if (d_vec < head_dim) {
      const __m512 kv = _mm512_maskz_loadu_ps(m_tail, kj + d_vec);
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_tail, q + r * head_dim + d_vec), kv,
                                 acc[r]);
      }
    }
    alignas(16) float dots[4];
    _mm_store_ps(dots, hsum4(acc[0], acc[1], acc[2], acc[3]));
    for (int r = 0; r < R; ++r) s[r * ld_s + j] = scale * dots[r];
  }
}

void attn_scores_avx512(const float* q, int n_q, const float* k, int64_t k_stride,
                        int64_t n_rows, int head_dim, float scale, float* s, int64_t ld_s) {
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

// out[r, 0 : C*16] += Σ_j p[r, j] v[j, 0 : C*16] for R (1..4) rows, accumulators in registers;
// the last of the C chunks covers only the lanes in `last`.
template <int R, int C>
void accumulate_block(const float* p, int64_t ld_p, const float* v, int64_t v_stride,
                      int64_t n_rows, int head_dim, __mmask16 last, float* out) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      const __mmask16 m = c == C - 1 ? last : static_cast<__mmask16>(0xFFFF);
      acc[r][c] = _mm512_maskz_loadu_ps(m, out + r * head_dim + c * kLanes);
    }
  }
  for (int64_t j = 0; j < n_rows; ++j) {
    const float* vj = v + j * v_stride;
    __m512 vv[C];
    for (int c = 0; c < C; ++c) {
      const __mmask16 m = c == C - 1 ? last : static_cast<__mmask16>(0xFFFF);
      vv[c] = _mm512_maskz_loadu_ps(m, vj + c * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ld_p + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      const __mmask16 m = c == C - 1 ? last : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(out + r * head_dim + c * kLanes, m, acc[r][c]);
    }
  }
}

template <int R>
void accumulate_rows(const float* p, int64_t ld_p, const float* v, int64_t v_stride,
                     int64_t n_rows, int head_dim, float* out) {
  constexpr __mmask16 kAll = 0xFFFF;
  const int n_chunks = (head_dim + kLanes - 1) / kLanes;
  const int rem = head_dim - (n_chunks - 1) * kLanes;  // lanes of the last chunk, 1..16
  int c = 0;
  for (; c + 4 <= n_chunks; c += 4) {
    const __mmask16 last = c + 4 == n_chunks ? tail_mask(rem) : kAll;
    accumulate_block<R, 4>(p, ld_p, v + c * kLanes, v_stride, n_rows, head_dim, last,
                           out + c * kLanes);
  }
  const float* vc = v + c * kLanes;
  float* oc = out + c * kLanes;
  const __mmask16 last = tail_mask(rem);
  switch (n_chunks - c) {
    case 3: accumulate_block<R, 3>(p, ld_p, vc, v_stride, n_rows, head_dim, last, oc); break;
    case 2: accumulate_block<R, 2>(p, ld_p, vc, v_stride, n_rows, head_dim, last, oc); break;
    case 1: accumulate_block<R, 1>(p, ld_p, vc, v_stride, n_rows, head_dim, last, oc); break;
    default: break;
  }
}

void attn_accumulate_avx512(const float* p, int64_t ld_p, int n_q, const float* v,
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

const OpsKernels& ops_kernels_avx512() {
  static const OpsKernels kernels = {
      rmsnorm_avx512,     swiglu_avx512,          exp_shifted_sum_avx512, scale_avx512,
      attn_scores_avx512, attn_accumulate_avx512,
  };
  return kernels;
}

}  // namespace specdec
