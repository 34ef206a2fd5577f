// AVX-512 variants of the optimizer kernels: the scalar reference's operations, 16 lanes at a
// time (separate multiplies and adds, IEEE sqrt and division), so the bits are the same.
#include <immintrin.h>

#include "drafter/train/optimizer_kernels.h"

namespace specdec {
namespace detail {

// GCC would otherwise fuse the intrinsics' multiplies and adds (-ffp-contract=fast), which the
// scalar reference does not.
#define SPECDEC_NO_CONTRACT __attribute__((optimize("fp-contract=off")))

SPECDEC_NO_CONTRACT void adamw_kernel_avx512(const AdamWStep& s, int64_t n, const float* grad, float* w, float* m,
                         float* v) {
  const __m512 scale = _mm512_set1_ps(s.grad_scale), b1 = _mm512_set1_ps(s.beta1),
               c1 = _mm512_set1_ps(s.one_minus_beta1), b2 = _mm512_set1_ps(s.beta2),
               c2 = _mm512_set1_ps(s.one_minus_beta2), step = _mm512_set1_ps(s.step),
               isc2 = _mm512_set1_ps(s.inv_sqrt_c2), eps = _mm512_set1_ps(s.eps),
               decay = _mm512_set1_ps(s.decay);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k =
        n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, grad + i), scale);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_maskz_loadu_ps(k, m + i)),
                                    _mm512_mul_ps(c1, g));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_maskz_loadu_ps(k, v + i)),
                                    _mm512_mul_ps(c2, _mm512_mul_ps(g, g)));
    _mm512_mask_storeu_ps(m + i, k, mi);
    _mm512_mask_storeu_ps(v + i, k, vi);
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), isc2), eps);
    const __m512 wi = _mm512_maskz_loadu_ps(k, w + i);
    const __m512 upd =
        _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(step, mi), denom), _mm512_mul_ps(decay, wi));
    _mm512_mask_storeu_ps(w + i, k, _mm512_sub_ps(wi, upd));
  }
}

SPECDEC_NO_CONTRACT double sum_squares_avx512(const float* x, int64_t n) {
  __m512d acc = _mm512_setzero_pd();  // lane j: elements i ≡ j (mod 8)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    acc = _mm512_add_pd(acc, _mm512_mul_pd(d, d));
  }
  alignas(64) double lane[8];
  _mm512_store_pd(lane, acc);
  for (; i < n; ++i) {
    const double d = x[i];
    lane[i % 8] = lane[i % 8] + d * d;
  }
  double sum = 0;
  for (double l : lane) sum += l;
  return sum;
}

}  // namespace detail
}  // namespace specdec
