// Element-wise and attention ops of the transformer forward pass, on float32 buffers.
// Each op has a scalar reference (`*_ref` in ops_ref.cpp) and SIMD variants chosen at run time;
// the conformance test compares every variant with the reference.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace specdec {

class ThreadPool;

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight[:]    x, y: [n_rows, dim]; may alias.
void rmsnorm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
             float* y);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).  n elements; out may alias.
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// In place: x[i] = exp(x[i] - max) / Σ.  n >= 1.
void softmax(float* x, int64_t n);

enum class RopeStyle {
  kNorm,  // rotate adjacent pairs (x[2i], x[2i+1]): GGUF `llama` (q/k weights permuted)
  kNeox,  // rotate halves (x[i], x[i + rope_dim/2])
};

// In place on x: [n_tokens, n_heads, head_dim]; token t is at position positions[t].
// The first rope_dim dims of each head rotate with theta_i = pos * freq_scale *
// freq_base^(-2i/rope_dim) (float math, as llama.cpp); the rest pass through. rope_dim even.
void rope(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
          int rope_dim, float freq_base, float freq_scale, RopeStyle style);

// Attention of n_new query tokens over a sequence's KV rows [0, n_past + n_new):
//   q:   [n_new, n_heads, head_dim]
//   k,v: [n_past + n_new, n_kv_heads, head_dim] (row j of the cache = token slot j; the new
//        tokens' K/V are already written at slots n_past ..)
//   mask: [n_new, n_new] row-major, mask[i * n_new + j] != 0 if new token i may attend to new
//        token j; nullptr means causal (j <= i). Every query sees all n_past cached slots.
//   out: [n_new, n_heads, head_dim]
// GQA: query head h reads KV head h / (n_heads / n_kv_heads). scale usually 1/sqrt(head_dim).
// n_new == 0 is a no-op; a query that sees no slot at all gets zeros. The queries are processed
// in blocks (all n_new when they are few): the slots every query of a block sees are read once
// for the whole block, all KV heads of a slot together; the pool's threads share a block (split
// by slot ranges) or take one block each. Scratch grows to the largest call seen and is reused.
// Bit-exact invariance: a query head's output depends only on its q and the contents of its
// visible slots in slot order - not on n_new, the mask of other queries, the thread count or how
// the work is split - so a token verified in a batch or tree gets exactly the output it gets when
// decoded alone (n_new = 1 after its visible slots). See ops.cpp for how.
struct AttentionShape {
  int64_t n_past = 0;
  int64_t n_new = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
};
void attention(const AttentionShape& s, const float* q, const float* k, const float* v,
               const uint8_t* mask, float* out, ThreadPool* pool);

// Index of the largest value (first one on ties). n >= 1.
int64_t argmax(const float* x, int64_t n);

// Explicit-variant entry points for the conformance test.
void rmsnorm_isa(Isa isa, const float* x, const float* weight, float eps, int64_t n_rows,
                 int64_t dim, float* y);
void swiglu_isa(Isa isa, const float* gate, const float* up, int64_t n, float* out);
void softmax_isa(Isa isa, float* x, int64_t n);
void attention_isa(Isa isa, const AttentionShape& s, const float* q, const float* k,
                   const float* v, const uint8_t* mask, float* out, ThreadPool* pool);

// Per-variant kernels behind the entry points above: ops.cpp dispatches on the Isa to one of
// these tables (ops_ref.cpp, ops_avx2.cpp, ops_avx512.cpp) and owns the attention driver
// (threading, masks, scratch); the tables hold only the inner loops. Not for other callers.
struct OpsKernels {
  void (*rmsnorm)(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                  float* y);
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* out);
  // max_i x[i]. n >= 1.
  float (*row_max)(const float* x, int64_t n);
  // x[i] = exp(x[i] - max) in place; returns Σ x[i]. n >= 1. The blocking of the sum is
  // relative to x (the driver calls it on fixed chunks of a query's visible list).
  float (*exp_shifted_sum)(float* x, int64_t n, float max);
  // x[i] *= a.
  void (*scale)(float* x, int64_t n, float a);
  // s[r * ld_s + j] = scale * <q[r], k[j * k_stride ..]>   q: [n_q, head_dim], j < n_rows.
  // Each score must come out bitwise the same whatever n_q, n_rows, r and j are (one fixed
  // instruction sequence per dot product): the driver scores a slot in different calls.
  void (*attn_scores)(const float* q, int n_q, const float* k, int64_t k_stride, int64_t n_rows,
                      int head_dim, float scale, float* s, int64_t ld_s);
  // out[r] += Σ_j p[r * ld_p + j] * v[j * v_stride ..]   out: [n_q, head_dim], j < n_rows.
  // Each output element must be updated once per j, in order j = 0, 1, .., from its current
  // value, p and v alone (no state carried within a call), so splitting the rows over calls
  // changes nothing.
  void (*attn_accumulate)(const float* p, int64_t ld_p, int n_q, const float* v,
                          int64_t v_stride, int64_t n_rows, int head_dim, float* out);
};
const OpsKernels& ops_kernels_ref();
const OpsKernels& ops_kernels_avx2();    // only call where isa_supported(Isa::kAvx2)
const OpsKernels& ops_kernels_avx512();  // only call where isa_supported(Isa::kAvx512)

}  // namespace specdec
