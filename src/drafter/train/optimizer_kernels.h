// The element-wise kernels of the optimizer step (adamw.h), with a scalar reference and an
// AVX-512 variant that performs the very same IEEE operations in the same order (no fused
// multiply-add), so both give the same bits and SPECDEC_ISA never changes a trained head.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace specdec {

// The constants of one AdamW update (as floats, computed once per update).
struct AdamWStep {
  float beta1, one_minus_beta1;  // β1, 1 - β1
  float beta2, one_minus_beta2;  // β2, 1 - β2
  float step;                    // lr / (1 - β1^t)
  float inv_sqrt_c2;             // 1 / sqrt(1 - β2^t)
  float eps;
  float decay;                   // lr * weight_decay (0 for biases)
  float grad_scale;              // gradient clipping's factor (1: none)
};

// For i < n, with g = grad[i] * grad_scale:
//   m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g g;
//   w = w - (step m / (sqrt(v) inv_sqrt_c2 + eps) + decay w)
void adamw_kernel(Isa isa, const AdamWStep& s, int64_t n, const float* grad, float* w, float* m,
                  float* v);

// Σ x[i]² over i < n in double: eight partial sums (element i into sum i mod 8), each square
// exact in double, added in order, then the eight summed 0 + 1 + ... + 7.
double sum_squares_kernel(Isa isa, const float* x, int64_t n);

namespace detail {
void adamw_kernel_avx512(const AdamWStep& s, int64_t n, const float* grad, float* w, float* m,
                         float* v);
double sum_squares_avx512(const float* x, int64_t n);
}  // namespace detail

}  // namespace specdec
