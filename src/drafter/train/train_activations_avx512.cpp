// AVX-512 variants of the training pass's element-wise kernels (train_activations.h).
// GCC 12's headers build some intrinsics (max, min, roundscale, scalef, reductions) on an
// "undefined" register that its own uninitialized-use warnings then flag; silenced as in
// backend/cpu/ops_avx512.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "drafter/train/train_activations.h"

namespace specdec {
namespace detail {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// e^x: x = k ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by a degree-6 polynomial,
// 2^k applied by scalef (which gives 0 far below and inf far above). About 2 ulp.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

inline __m512 sigmoid_ps(__m512 y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), y))));
}

}  // namespace

void silu_residual_avx512(const float* y, const float* base, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 yv = _mm512_maskz_loadu_ps(m, y + i);
    __m512 s = _mm512_mul_ps(yv, sigmoid_ps(yv));
    if (base) s = _mm512_add_ps(_mm512_maskz_loadu_ps(m, base + i), s);
    _mm512_mask_storeu_ps(out + i, m, s);
  }
}

void silu_backward_avx512(const float* dx, float* y, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 yv = _mm512_maskz_loadu_ps(m, y + i);
    const __m512 s = sigmoid_ps(yv);
    const __m512 d = _mm512_mul_ps(s, _mm512_fmadd_ps(yv, _mm512_sub_ps(one, s), one));
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dx + i), d));
  }
}

CrossEntropyRow cross_entropy_row_avx512(float* z, int64_t n, int32_t target, float grad_scale) {
  // max and its first index: per lane the first largest value, then the smallest index among
  // the lanes holding the overall maximum
  const float lowest = -std::numeric_limits<float>::infinity();
  __m512 best = _mm512_set1_ps(lowest);
  __m512i best_i = _mm512_set1_epi32(0);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(lowest), tail_mask(n - i), z + i);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, gt, v);
    best_i = _mm512_mask_mov_epi32(best_i, gt, idx);
    idx = _mm512_add_epi32(idx, step);
  }
  const float zmax = _mm512_reduce_max_ps(best);
  const __mmask16 at_max = _mm512_cmp_ps_mask(best, _mm512_set1_ps(zmax), _CMP_EQ_OQ);
  const int32_t am = _mm512_mask_reduce_min_epi32(at_max, best_i);
  CrossEntropyRow r;
  r.argmax = am;
  const float zt = z[target];
  const __m512 mx = _mm512_set1_ps(zmax);
  __m512 acc = _mm512_setzero_ps();
  const bool backward = grad_scale != 0.0f;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, z + i), mx));
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    if (backward) _mm512_mask_storeu_ps(z + i, m, e);
  }
  const float sum = _mm512_reduce_add_ps(acc);
  r.loss = static_cast<double>(zmax) - zt + std::log(static_cast<double>(sum));
  if (backward) {
    const __m512 k = _mm512_set1_ps(grad_scale / sum);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail_mask(n - i);
      _mm512_mask_storeu_ps(z + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, z + i), k));
    }
    z[target] -= grad_scale;
  }
  return r;
}

}  // namespace detail
}  // namespace specdec
