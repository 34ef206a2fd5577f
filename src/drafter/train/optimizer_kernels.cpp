#include "drafter/train/optimizer_kernels.h"

#include <cmath>

namespace specdec {
namespace {

// No contraction into fused multiply-adds (a -march=native build could otherwise form them):
// the AVX-512 variant rounds every product and sum as written here.
#define SPECDEC_NO_CONTRACT __attribute__((optimize("fp-contract=off")))

SPECDEC_NO_CONTRACT void adamw_kernel_ref(const AdamWStep& s, int64_t n, const float* grad, float* w, float* m,
                      float* v) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * s.inv_sqrt_c2 + s.eps;
    w[i] = w[i] - ((s.step * mi) / denom + s.decay * w[i]);
  }
}

SPECDEC_NO_CONTRACT double sum_squares_ref(const float* x, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i];
    lane[i % 8] = lane[i % 8] + d * d;
  }
  double sum = 0;
  for (double l : lane) sum += l;
  return sum;
}

}  // namespace

void adamw_kernel(Isa isa, const AdamWStep& s, int64_t n, const float* grad, float* w, float* m,
                  float* v) {
  if (isa == Isa::kAvx512) {
    detail::adamw_kernel_avx512(s, n, grad, w, m, v);
  } else {
    adamw_kernel_ref(s, n, grad, w, m, v);
  }
}

double sum_squares_kernel(Isa isa, const float* x, int64_t n) {
  return isa == Isa::kAvx512 ? detail::sum_squares_avx512(x, n) : sum_squares_ref(x, n);
}

}  // namespace specdec
