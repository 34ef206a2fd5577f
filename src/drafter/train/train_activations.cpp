#include "drafter/train/train_activations.h"

#include <cmath>

namespace specdec {
namespace {

inline float sigmoid(float y) { return 1.0f / (1.0f + std::exp(-y)); }

void silu_residual_ref(const float* y, const float* base, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (base ? base[i] : 0.0f) + y[i] * sigmoid(y[i]);
}

void silu_backward_ref(const float* dx, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(y[i]);
    y[i] = dx[i] * (s * (1.0f + y[i] * (1.0f - s)));
  }
}

CrossEntropyRow cross_entropy_row_ref(float* z, int64_t n, int32_t target, float grad_scale) {
  CrossEntropyRow r;
  float zmax = z[0];
  for (int64_t v = 1; v < n; ++v) {
    if (z[v] > zmax) {
      zmax = z[v];
      r.argmax = static_cast<int32_t>(v);
    }
  }
  double sum = 0;
  for (int64_t v = 0; v < n; ++v) sum += std::exp(static_cast<double>(z[v]) - zmax);
  r.loss = static_cast<double>(zmax) - z[target] + std::log(sum);
  if (grad_scale != 0.0f) {
    const double k = grad_scale / sum;
    for (int64_t v = 0; v < n; ++v) {
      z[v] = static_cast<float>(k * std::exp(static_cast<double>(z[v]) - zmax));
    }
    z[target] -= grad_scale;
  }
  return r;
}

}  // namespace

void silu_residual(Isa isa, const float* y, const float* base, float* out, int64_t n) {
  if (isa == Isa::kAvx512) return detail::silu_residual_avx512(y, base, out, n);
  silu_residual_ref(y, base, out, n);
}

void silu_backward(Isa isa, const float* dx, float* y, int64_t n) {
  if (isa == Isa::kAvx512) return detail::silu_backward_avx512(dx, y, n);
  silu_backward_ref(dx, y, n);
}

CrossEntropyRow cross_entropy_row(Isa isa, float* z, int64_t n, int32_t target, float grad_scale) {
  if (isa == Isa::kAvx512) return detail::cross_entropy_row_avx512(z, n, target, grad_scale);
  return cross_entropy_row_ref(z, n, target, grad_scale);
}

}  // namespace specdec
