// Internal interface between matmul.cpp (validation, dispatch) and the per-ISA matmul files.
//
// The arithmetic every variant performs, bit for bit (so each variant equals the scalar
// reference exactly, and a row's result does not depend on n or on the thread count):
//
// Float weights (F32, F16, BF16): y[i][r] = fma chain over k = 0, 1, ..., cols-1 of
//   acc = fma(w[r][k], x[i][k], acc), starting from acc = 0.
//
// Quantized weights: x row i is quantized in blocks of 32 (quantize_activations):
//   amax = max |x|, d = amax / 127 (0 when amax < kMinActivationAmax), q = nearbyint(x * (1/d)),
//   and S16 = sum of q over each 16 elements.
// With the sub-block view of quant_blocks.h (sub = 32 or 16, even sub-blocks "A", odd "B"):
//   acc[0] = acc[1] = 0
//   for each sub-block b in order:
//     isum = sum_j (q_w[j] - offset) * q_x[j]                        (exact integer)
//     t    = float(isum) * d_x                                       (d_x of the 32-block of b)
//     acc[b & 1] = fma(t, dw, acc[b & 1])
//     if has_min: acc[b & 1] = fma(mw, float(S32) * d_x, acc[b & 1])  (S32: q_x sum of b)
//   y[i][r] = acc[0] + acc[1]
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/matmul.h"

namespace specdec {
namespace detail {

inline constexpr int64_t kActBlock = 32;             // activation quantization block
inline constexpr float kMinActivationAmax = 1e-30f;  // smaller blocks quantize to zero

// Reference activation quantization of one row (cols a multiple of 32):
//   q[cols], d[cols / 32], s16[cols / 16].
void quantize_activations_ref(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16);

// Per-ISA implementations; arguments already validated, n > 0, rows > 0.
void matmul_ref(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool);
void matmul_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool);
void matmul_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool);
// w.packed set (packed_weights.h); any packable type. From kPackedPanelMinRows rows on,
// matmul_avx512's panel kernel (building its panels from the packed rows) is faster.
inline constexpr int64_t kPackedPanelMinRows = 32;
// glu: x is [n, 2 cols] gate | up and the activations are swiglu(gate, up) (matmul_swiglu).
void packed_matmul_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y,
                          ThreadPool* pool, bool glu = false);
// matmul_prefetch() for packed weights: the start of thread ti's stretch.
void packed_prefetch_avx512(const WeightMatrix& w, int ti, int nt, int64_t max_bytes);
// The AVX2 kernel over packed weights (any packable type; any n, used below
// kPackedPanelMinRows rows and for packed-only matrices) and its matmul_prefetch().
void packed_matmul_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y,
                        ThreadPool* pool);
// The same kernel compiled with AVX-VNNI (matmul_packed_avxvnni.cpp): vpdpbusd for the dot
// products, bitwise the same results. With AVX-VNNI it serves prefill as well, in slabs of
// kVnniPrefillSlab activation rows (Emerald Rapids, one thread, n = 256, against AVX2's tile
// kernel: Q4_0 / Q4_1 +35%, Q5_0 / Q5_1 / Q4_K +21-24%, Q8_0 2.8x, Q6_K level; without slabs
// the activations of a long prompt outgrow the caches: -15% at n = 512).
void packed_matmul_avxvnni(const WeightMatrix& w, const float* x, int64_t n, float* y,
                           ThreadPool* pool);
inline constexpr int64_t kVnniPrefillSlab = 64;
void packed_prefetch_avx2(const WeightMatrix& w, int ti, int nt, int64_t max_bytes);

// Per-ISA activation quantization (exposed so tests can check it against the reference).
void quantize_activations_avx2(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16);
void quantize_activations_avx512(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16);

// A 64-byte aligned buffer owned by the calling thread, one per slot. get() grows it (the only
// allocation) when a call needs more than any earlier call on this thread did.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* get(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

enum ScratchSlot { kScratchActivations = 0, kScratchWeights = 1, kScratchExtra = 2, kNumSlots = 3 };
ScratchBuffer& thread_scratch(ScratchSlot slot);

}  // namespace detail
}  // namespace specdec
