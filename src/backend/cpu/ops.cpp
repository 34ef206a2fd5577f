// Dispatch of the element-wise ops on active_isa() (or an explicit variant, for the tests) to the
// per-ISA kernel tables. The attention driver, which uses the same tables, is in
// attention_driver.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cpu/ops.h"
#include "util/check.h"

namespace specdec {

const OpsKernels& ops_kernels_for(Isa isa, bool checked) {
  // For the explicit-variant entry points: running an unsupported variant would be SIGILL.
  if (checked) {
    SPECDEC_CHECK(isa_supported(isa), "ops: requested ISA variant is not supported here");
  }
  switch (isa) {
    case Isa::kAvx512:
      return ops_kernels_avx512();
    case Isa::kAvx2:
    case Isa::kAvxVnni:  // the AVX2 kernels (AVX-VNNI changes only the int8 matmuls)
      return ops_kernels_avx2();
    case Isa::kScalar:
      break;
  }
  return ops_kernels_ref();
}

void rmsnorm_isa(Isa isa, const float* x, const float* weight, float eps, int64_t n_rows,
                 int64_t dim, float* y) {
  ops_kernels_for(isa, true).rmsnorm(x, weight, eps, n_rows, dim, y);
}

void swiglu_isa(Isa isa, const float* gate, const float* up, int64_t n, float* out) {
  ops_kernels_for(isa, true).swiglu(gate, up, n, out);
}

void softmax_isa(Isa isa, float* x, int64_t n) {
  SPECDEC_CHECK(n >= 1, "softmax: empty input");
  const OpsKernels& kern = ops_kernels_for(isa, true);
  kern.scale(x, n, 1.0f / kern.exp_shifted_sum(x, n, kern.row_max(x, n)));
}

void f32_to_f16_isa(Isa isa, const float* x, int64_t n, uint16_t* y) {
  ops_kernels_for(isa, true).f32_to_f16(x, n, y);
}

// n elements as rows of at most 2^20 (the kernel's column count is an int).
void f16_to_f32_with(const OpsKernels& kern, const uint16_t* x, int64_t n, float* y) {
  constexpr int64_t kRow = int64_t{1} << 20;
  for (int64_t i = 0; i < n; i += kRow) {
    kern.f16_to_f32_rows(x + i, kRow, 1, static_cast<int>(std::min(kRow, n - i)), y + i);
  }
}

void f16_to_f32_isa(Isa isa, const uint16_t* x, int64_t n, float* y) {
  f16_to_f32_with(ops_kernels_for(isa, true), x, n, y);
}

// The kernels take checked arguments.
void rope_apply_with(const OpsKernels& kern, float* x, const float* cos_sin, int64_t n_tokens,
                     int n_heads, int head_dim, int rope_dim, RopeStyle style) {
  SPECDEC_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim,
                "rope: rope_dim must be even and in (0, head_dim]");
  kern.rope_apply(x, cos_sin, n_tokens, n_heads, head_dim, rope_dim, style);
}

void rope_apply_isa(Isa isa, float* x, const float* cos_sin, int64_t n_tokens, int n_heads,
                    int head_dim, int rope_dim, RopeStyle style) {
  rope_apply_with(ops_kernels_for(isa, true), x, cos_sin, n_tokens, n_heads, head_dim, rope_dim,
                  style);
}

void rope_apply(float* x, const float* cos_sin, int64_t n_tokens, int n_heads, int head_dim,
                int rope_dim, RopeStyle style) {
  rope_apply_with(ops_kernels_for(active_isa(), false), x, cos_sin, n_tokens, n_heads, head_dim,
                  rope_dim, style);
}

void f32_to_f16(const float* x, int64_t n, uint16_t* y) {
  ops_kernels_for(active_isa(), false).f32_to_f16(x, n, y);
}

void f16_to_f32(const uint16_t* x, int64_t n, float* y) {
  f16_to_f32_with(ops_kernels_for(active_isa(), false), x, n, y);
}

void rmsnorm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
             float* y) {
  ops_kernels_for(active_isa(), false).rmsnorm(x, weight, eps, n_rows, dim, y);
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  ops_kernels_for(active_isa(), false).swiglu(gate, up, n, out);
}

void softmax(float* x, int64_t n) {
  SPECDEC_CHECK(n >= 1, "softmax: empty input");
  const OpsKernels& kern = ops_kernels_for(active_isa(), false);
  kern.scale(x, n, 1.0f / kern.exp_shifted_sum(x, n, kern.row_max(x, n)));
}

float log_sum_exp_inplace(float* x, int64_t n) {
  SPECDEC_CHECK(n >= 1, "log_sum_exp_inplace: empty input");
  const OpsKernels& kern = ops_kernels_for(active_isa(), false);
  const float m = kern.row_max(x, n);
  return m + std::log(kern.exp_shifted_sum(x, n, m));
}

}  // namespace specdec
