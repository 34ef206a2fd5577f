// The element-wise parts of the ReDrafter head's training pass: SiLU with its residual add and
// its derivative, and one row of softmax cross-entropy with its gradient. Scalar reference and
// an AVX-512 variant (its own exp: a degree-6 polynomial, ~2 ulp), chosen by the caller's Isa;
// each element / row is computed the same way wherever it lies, so the thread count changes no
// bit (the variants differ from each other by rounding only).
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace specdec {

// out[i] = (base ? base[i] : 0) + SiLU(y[i]),  SiLU(y) = y / (1 + e^-y). out may alias base.
void silu_residual(Isa isa, const float* y, const float* base, float* out, int64_t n);

// In place: y[i] = dx[i] * SiLU'(y[i]),  SiLU'(y) = σ(y) (1 + y (1 - σ(y))).
void silu_backward(Isa isa, const float* dx, float* y, int64_t n);

struct CrossEntropyRow {
  double loss = 0;   // log Σ_v e^{z_v} - z_target
  int32_t argmax = 0;  // first index of the largest logit
};

// One row z[n] of logits against `target` (0 <= target < n). With grad_scale != 0, z becomes
// grad_scale * (softmax(z) - onehot(target)); with grad_scale == 0 z is left unchanged.
CrossEntropyRow cross_entropy_row(Isa isa, float* z, int64_t n, int32_t target, float grad_scale);

namespace detail {
void silu_residual_avx512(const float* y, const float* base, float* out, int64_t n);
void silu_backward_avx512(const float* dx, float* y, int64_t n);
CrossEntropyRow cross_entropy_row_avx512(float* z, int64_t n, int32_t target, float grad_scale);
}  // namespace detail

}  // namespace specdec
