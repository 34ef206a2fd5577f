// Scalar reference kernels of the element-wise and attention ops (the OpsKernels table for
// Isa::kScalar), plus the RoPE angles and argmax, which have only this variant (once per forward
// pass / one pass over the vocabulary per sampled row, negligible beside the matmuls).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16
#include "util/check.h"

namespace specdec {
namespace {

// Sums of squares accumulate in double so the reference is accurate to a float rounding.
void rmsnorm_ref(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                 float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;  // [dim]
    float* yr = y + r * dim;        // [dim]
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float inv_rms =
        static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv_rms * weight[i];
  }
}

void swiglu_ref(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float row_max_ref(const float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  return max;
}

float exp_shifted_sum_ref(float* x, int64_t n, float max) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return static_cast<float>(sum);
}

void scale_ref(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

// The packed form is q·mult, row-major.
void attn_pack_q_ref(const float* q, int n_q, int run_rows, int64_t run_stride, int head_dim,
                     float mult, float* packed) {
  for (int r = 0; r < n_q; ++r) {
    const float* qr = q + r / run_rows * run_stride + static_cast<int64_t>(r % run_rows) * head_dim;
    float* pr = packed + static_cast<int64_t>(r) * head_dim;  // [head_dim]
    for (int d = 0; d < head_dim; ++d) pr[d] = qr[d] * mult;
  }
}

// The reference ignores the prefetch hints.
void attn_scores_ref(const float* q, int n_q, const float* k, int64_t k_stride, int64_t n_rows,
                     int head_dim, float* s, int64_t ld_s, AttnPrefetch /*next*/) {
  for (int r = 0; r < n_q; ++r) {
    const float* qr = q + static_cast<int64_t>(r) * head_dim;  // [head_dim]
    for (int64_t j = 0; j < n_rows; ++j) {
      const float* kj = k + j * k_stride;  // [head_dim]
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot += qr[d] * kj[d];
      s[r * ld_s + j] = dot;
    }
  }
}

// The sum runs over all kAttnChunk columns in order, in double (the zeros past n change nothing).
void attn_chunk_softmax_ref(float* s, int64_t ld_s, int n_q, const int32_t* n_valid, float* m,
                            float* l) {
  for (int r = 0; r < n_q; ++r) {
    float* row = s + r * ld_s;  // [kAttnChunk]
    const int n = n_valid[r];
    if (n == 0) {
      std::fill_n(row, kAttnChunk, 0.0f);
      m[r] = -INFINITY;
      l[r] = 0.0f;
      continue;
    }
    const float max = row_max_ref(row, n);
    double sum = 0.0;
    for (int j = 0; j < kAttnChunk; ++j) {
      row[j] = j < n ? std::exp2(row[j] - max) : 0.0f;
      sum += row[j];
    }
    m[r] = max;
    l[r] = static_cast<float>(sum);
  }
}

void attn_accumulate_ref(const float* p, int64_t ld_p, int n_q, const float* v, int64_t v_stride,
                         int64_t n_rows, int head_dim, float* out, AttnPrefetch /*next*/) {
  for (int r = 0; r < n_q; ++r) {
    float* out_r = out + static_cast<int64_t>(r) * head_dim;  // [head_dim]
    for (int64_t j = 0; j < n_rows; ++j) {
      const float pj = p[r * ld_p + j];
      const float* vj = v + j * v_stride;  // [head_dim]
      for (int d = 0; d < head_dim; ++d) out_r[d] += pj * vj[d];
    }
  }
}

void attn_merge_weights_ref(const float* m, const float* l, int n_q, float* big_m, float* big_l,
                            float* wo, float* wn) {
  for (int r = 0; r < n_q; ++r) {
    if (m[r] == -INFINITY) {
      wo[r] = 1.0f;
      wn[r] = 0.0f;
      continue;
    }
    const float new_max = std::max(big_m[r], m[r]);
    wo[r] = std::exp2(big_m[r] - new_max);
    wn[r] = std::exp2(m[r] - new_max);
    big_l[r] = big_l[r] * wo[r] + l[r] * wn[r];
    big_m[r] = new_max;
  }
}

void attn_merge_rows_ref(const float* a, int n_q, int head_dim, const float* wo, const float* wn,
                         float* big_a) {
  for (int r = 0; r < n_q; ++r) {
    const float* a_r = a + static_cast<int64_t>(r) * head_dim;    // [head_dim]
    float* big_a_r = big_a + static_cast<int64_t>(r) * head_dim;  // [head_dim]
    for (int d = 0; d < head_dim; ++d) big_a_r[d] = big_a_r[d] * wo[r] + a_r[d] * wn[r];
  }
}

// The two kernels above, row by row through a zeroed row of scratch (the same arithmetic).
void attn_accumulate_merge_ref(const float* p, int64_t ld_p, int n_q, const float* v,
                               int64_t v_stride, int64_t n_rows, int head_dim, const float* wo,
                               const float* wn, float* big_a, AttnPrefetch /*next*/) {
  thread_local std::vector<float> a;  // [head_dim]; grows to the largest call and is kept
  if (a.size() < static_cast<size_t>(head_dim)) a.resize(static_cast<size_t>(head_dim));
  for (int r = 0; r < n_q; ++r) {
    std::fill_n(a.data(), head_dim, 0.0f);
    attn_accumulate_ref(p + r * ld_p, ld_p, 1, v, v_stride, n_rows, head_dim, a.data(), {});
    attn_merge_rows_ref(a.data(), 1, head_dim, wo + r, wn + r,
                        big_a + static_cast<int64_t>(r) * head_dim);
  }
}

void f32_to_f16_ref(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void f16_to_f32_rows_ref(const uint16_t* src, int64_t src_stride, int64_t n_rows, int cols,
                         float* dst) {
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[r * cols + c] = fp16_to_fp32(src[r * src_stride + c]);
  }
}

void i8_to_f32_rows_ref(const int8_t* src, int64_t src_stride, int64_t n_rows, int cols,
                        float* dst) {
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int c = 0; c < cols; ++c) dst[r * cols + c] = static_cast<float>(src[r * src_stride + c]);
  }
}

void scale_columns_ref(const float* x, int64_t ld_x, int n_rows, const float* d, int64_t n,
                       float* out, int64_t ld_out) {
  for (int r = 0; r < n_rows; ++r) {
    for (int64_t j = 0; j < n; ++j) out[r * ld_out + j] = x[r * ld_x + j] * d[j];
  }
}

// The products are rounded before the sum (no contraction into an FMA, which a -march=native
// build would otherwise allow), so the SIMD variants can match bit for bit.
[[gnu::optimize("fp-contract=off")]] void rope_apply_ref(float* x, const float* cos_sin,
                                                         int64_t n_tokens, int n_heads,
                                                         int head_dim, int rope_dim,
                                                         RopeStyle style) {
  const int n_pairs = rope_dim / 2;
  // Style kNorm rotates (x[2i], x[2i+1]); kNeox rotates (x[i], x[i + rope_dim/2]).
  const int first_stride = style == RopeStyle::kNorm ? 2 : 1;
  const int second_offset = style == RopeStyle::kNorm ? 1 : n_pairs;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* xt = x + t * n_heads * head_dim;    // [n_heads, head_dim]
    const float* cs = cos_sin + t * rope_dim;  // [n_pairs, 2]
    for (int h = 0; h < n_heads; ++h) {
      float* xh = xt + static_cast<int64_t>(h) * head_dim;  // [head_dim]
      for (int i = 0; i < n_pairs; ++i) {
        const float cos_t = cs[2 * i], sin_t = cs[2 * i + 1];
        const int a = i * first_stride;
        const int b = a + second_offset;
        const float x0 = xh[a];
        const float x1 = xh[b];
        xh[a] = x0 * cos_t - x1 * sin_t;
        xh[b] = x0 * sin_t + x1 * cos_t;
      }
    }
  }
}

}  // namespace

const OpsKernels& ops_kernels_ref() {
  // clang-format off
  static const OpsKernels kernels = {
      rmsnorm_ref,         swiglu_ref,
      row_max_ref,         exp_shifted_sum_ref,
      scale_ref,           attn_pack_q_ref,
      attn_scores_ref,     attn_chunk_softmax_ref,
      attn_accumulate_ref, attn_merge_weights_ref,
      attn_merge_rows_ref, attn_accumulate_merge_ref,
      f32_to_f16_ref,      f16_to_f32_rows_ref,
      // No f16 K-tile or V kernels: the driver converts the tiles and rows into float rows.
      nullptr,             nullptr,
      nullptr,             nullptr,
      rope_apply_ref,
      // q8_0: the driver converts the codes for the float kernels.
      i8_to_f32_rows_ref,  nullptr,
      nullptr,             nullptr,
      scale_columns_ref,   nullptr,
  };
  // clang-format on
  return kernels;
}

// theta_i = pos * freq_scale * freq_base^(-2i/rope_dim), in float as llama.cpp does.
void rope_angles(const int32_t* positions, int64_t n_tokens, int rope_dim, float freq_base,
                 float freq_scale, float* cos_sin) {
  SPECDEC_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope: rope_dim must be even and positive");
  const int n_pairs = rope_dim / 2;
  // freq_base^(-2i/rope_dim) once per call; the scratch grows once and is kept.
  thread_local std::vector<float> inv_freq;  // [n_pairs]
  if (inv_freq.size() < static_cast<size_t>(n_pairs)) inv_freq.resize(static_cast<size_t>(n_pairs));
  for (int i = 0; i < n_pairs; ++i) {
    inv_freq[i] = std::pow(freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(rope_dim));
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    float* cs = cos_sin + t * rope_dim;  // [n_pairs, 2]
    for (int i = 0; i < n_pairs; ++i) {
      const float theta = pos * freq_scale * inv_freq[i];
      cs[2 * i] = std::cos(theta);
      cs[2 * i + 1] = std::sin(theta);
    }
  }
}

void rope(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
          int rope_dim, float freq_base, float freq_scale, RopeStyle style) {
  SPECDEC_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim,
                "rope: rope_dim must be even and in (0, head_dim]");
  thread_local std::vector<float> cos_sin;  // [n_tokens, rope_dim / 2, 2]
  if (cos_sin.size() < static_cast<size_t>(n_tokens * rope_dim)) {
    cos_sin.resize(static_cast<size_t>(n_tokens * rope_dim));
  }
  rope_angles(positions, n_tokens, rope_dim, freq_base, freq_scale, cos_sin.data());
  rope_apply(x, cos_sin.data(), n_tokens, n_heads, head_dim, rope_dim, style);
}

int64_t argmax(const float* x, int64_t n) {
  SPECDEC_CHECK(n >= 1, "argmax: empty input");
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace specdec
