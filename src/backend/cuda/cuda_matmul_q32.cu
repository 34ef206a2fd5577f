// matmul for the 32-element-block quant types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) on int8 tensor
// cores, with the activations quantized as the CPU quantizes them (quant_kernels.h).
//
// 1. quantize_kernel: each token row of x, in blocks of 32, exactly as quantize_activations_ref:
//    amax = max |x|, d = amax / 127 (0 when amax < 1e-30), q = nearbyint(x * (1 / d)) clamped to
//    [-128, 127] (IEEE division and products, round half to even), S32 = sum of the block's q.
//    Scratch layout (per token, blocks padded to a multiple of kSlices):
//      xq int8 [n, nbp * 32], xd float [n, nbp], xc [n, nbp] (float(S32) * d for the types with a
//      min, int S32 for the types with an offset).
// 2. q32_kernel: a thread block computes 16 G output rows ("row groups" of 16) for a tile of 8 NTILE
//    tokens. The blocks of a row are split into kSlices = 16 slices (slice s = the blocks b with
//    b % 16 == s); the block walks the row in steps of 16 blocks (the rows' bytes of a step are
//    staged into shared memory with 16-byte cp.async over the 16-byte aligned words that cover
//    them - rows are only 2-byte aligned -, a kStages-deep pipeline, with the step's quantized x).
//    Warp w of row group g handles slices 4 (w % 4) .. + 4: per block, one
//    mma.m16n8k32.s8.s8.s32 per 8 tokens gives the exact integer dot products isum(row, token) of
//    the 16 rows of the group with the token's q; the float epilogue per (row, token, block) is
//    the CPU's: t = float(isum - offset * S32) * d_x; acc = fma(t, d_w, acc); [acc = fma(m_w,
//    float(S32) * d_x, acc)] - one accumulator per slice, blocks in increasing order. At the end
//    the 16 slice sums are added by a fixed tree ((s0 + s8) + (s4 + s12)) ... (pairs at distance
//    8, 4, 2, 1).
//
// 3. gemv_kernel (n <= 2 by default, SPECDEC_CUDA_GEMV_MAX_N, at most 16): the same arithmetic
//    per (row, token) as q32_kernel, bit for bit, with dp4a instead of mma - lane s of a half-warp
//    owns slice s of the half-warp's rows, the 16 slices are added by the same tree (shuffles).
//    Built for bandwidth at small n: a small grid unit (one warp = 2 rows at n <= 4), a per-warp
//    cp.async ring, no block-wide barrier.
// The quantization kernel and the GEMV are programmatic dependent launches (the GEMV fetches its
// first weights while the kernels before it finish; SPECDEC_CUDA_PDL=0 turns that off).
//
// Variants (offline autotune, bench_cuda_shapes --sweep): the GEMV's rows per half-warp, ring
// depth and warps per block; the mma kernel's rows per block, stages, precomputed load addresses,
// 8-token tiles, programmatic dependent launch; early PDL triggers - all bitwise the default's
// results (see "kernel variants" below; SPECDEC_CUDA_GEMV_VARIANT, SPECDEC_CUDA_MMA_VARIANT,
// SPECDEC_CUDA_PDL_EARLY).
//
// Batch invariance: the integer dot products are exact, and the float operations of (row, token)
// - its slices, their block order, the tree - depend only on cols, never on n, the tile or G, so
// a token's result is bitwise the same in any batch.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda::detail {

// Declared (and called) in cuda_matmul.cu.
bool q32_matmul_supported(GgmlType type);
void q32_matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y);
// Declared in tests/cuda/test_cuda_ops.cpp and bench/cuda/bench_cuda_shapes.cpp.
int64_t q32_set_gemv_max_n(int64_t n);
int q32_variant_count(int kind);
const char* q32_variant_name(int kind, int i);
int q32_set_variant(int kind, int i);
bool q32_set_pdl_early(bool on);

namespace {

constexpr int kSlices = 16;      // float partial sums per (row, token); blocks per step
constexpr int kStages = 3;       // cp.async pipeline depth
constexpr int kXqPitch = 528;    // bytes per token of a step's q in shared memory (512 + 16: the
                                 // 8 tokens of an mma hit distinct banks)
constexpr float kMinAmax = 1e-30f;  // detail::kMinActivationAmax of the CPU

// ---- programmatic dependent launch (sm_90) ------------------------------------------------------

// Waits until the grids this one depends on have completed and their writes are visible (a no-op
// when the kernel was launched normally).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Lets the grid launched after this one (as a programmatic dependent) start.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- activation quantization ---------------------------------------------------------------

// One warp per (token, block of 32); lane j takes element j.
__global__ void __launch_bounds__(256)
    quantize_kernel(const float* __restrict__ x, int64_t n, int64_t cols, int64_t nbp,
                    bool min_type, int8_t* __restrict__ xq, float* __restrict__ xd,
                    uint32_t* __restrict__ xc, bool early) {
  // Launched as a programmatic dependent (pdl_launch): x and the scratch may still be in use by
  // the previous kernels until pdl_wait; the matmul after this kernel may start (and fetch its
  // weights) at once - with `early` (SPECDEC_CUDA_PDL_EARLY) even before the kernel before this
  // one has finished (the matmul waits for this kernel, which waits for that one, before it
  // touches anything but its weights).
  if (early) pdl_trigger();
  pdl_wait();
  pdl_trigger();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t nb = cols / 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (item >= n * nb) return;
  const int64_t t = item / nb;
  const int64_t b = item % nb;
  const float v = x[t * cols + b * 32 + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const bool nonzero = amax >= kMinAmax;
  const float d = nonzero ? __fdiv_rn(amax, 127.0f) : 0.0f;
  const float inv = nonzero ? __fdiv_rn(1.0f, d) : 0.0f;
  const float r = rintf(__fmul_rn(v, inv));
  const int q = static_cast<int>(fminf(fmaxf(r, -128.0f), 127.0f));
  const int s32 = __reduce_add_sync(0xffffffffu, q);
  xq[t * nbp * 32 + b * 32 + lane] = static_cast<int8_t>(q);
  if (lane == 0) {
    xd[t * nbp + b] = d;
    xc[t * nbp + b] = min_type ? __float_as_uint(__fmul_rn(static_cast<float>(s32), d))
                               : static_cast<uint32_t>(s32);
  }
}

// ---- the weight types ------------------------------------------------------------------------

__device__ __forceinline__ float h2f(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
}
__device__ __forceinline__ uint32_t ld16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t* p) {
  return ld16(p) | (ld16(p + 2) << 16);
}
// Bits 0..3 of v to bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t spread4(uint32_t v) {
  return ((v & 0xfu) * 0x00204081u & 0x01010101u) << 4;
}

// Per type: block bytes, the code offset (isum -= offset * S32), whether it has a min, and the
// A-fragment words of one block: lo = codes of elements 4c .. 4c + 3, hi = of 16 + 4c .. + 3
// (one byte per element), plus d and m.
template <GgmlType T>
struct Q32;

template <>
struct Q32<GgmlType::kQ8_0> {  // d, qs[32] int8
  static constexpr int kBytes = 34, kOffset = 0;
  static constexpr bool kMin = false;
  static __device__ __forceinline__ void frag(const uint8_t* b, int c, uint32_t* lo, uint32_t* hi,
                                              float* d, float* m) {
    *lo = ld32_a2(b + 2 + 4 * c);
    *hi = ld32_a2(b + 18 + 4 * c);
    *d = h2f(ld16(b));
    *m = 0.0f;
  }
};
template <>
struct Q32<GgmlType::kQ4_0> {  // d, qs[16]: element j low nibble of qs[j], j + 16 high nibble
  static constexpr int kBytes = 18, kOffset = 8;
  static constexpr bool kMin = false;
  static __device__ __forceinline__ void frag(const uint8_t* b, int c, uint32_t* lo, uint32_t* hi,
                                              float* d, float* m) {
    const uint32_t w = ld32_a2(b + 2 + 4 * c);
    *lo = w & 0x0f0f0f0fu;
    *hi = (w >> 4) & 0x0f0f0f0fu;
    *d = h2f(ld16(b));
    *m = 0.0f;
  }
};
template <>
struct Q32<GgmlType::kQ4_1> {  // d, m, qs[16] (4-byte aligned)
  static constexpr int kBytes = 20, kOffset = 0;
  static constexpr bool kMin = true;
  static __device__ __forceinline__ void frag(const uint8_t* b, int c, uint32_t* lo, uint32_t* hi,
                                              float* d, float* m) {
    const uint32_t w = ld32(b + 4 + 4 * c);
    *lo = w & 0x0f0f0f0fu;
    *hi = (w >> 4) & 0x0f0f0f0fu;
    const uint32_t dm = ld32(b);
    *d = h2f(dm);
    *m = h2f(dm >> 16);
  }
};
template <>
struct Q32<GgmlType::kQ5_0> {  // d, qh[4], qs[16]; bit j of qh: bit 4 of element j
  static constexpr int kBytes = 22, kOffset = 16;
  static constexpr bool kMin = false;
  static __device__ __forceinline__ void frag(const uint8_t* b, int c, uint32_t* lo, uint32_t* hi,
                                              float* d, float* m) {
    const uint32_t qh = ld32_a2(b + 2);
    const uint32_t w = ld32_a2(b + 6 + 4 * c);
    *lo = (w & 0x0f0f0f0fu) | spread4(qh >> (4 * c));
    *hi = ((w >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * c));
    *d = h2f(ld16(b));
    *m = 0.0f;
  }
};
template <>
struct Q32<GgmlType::kQ5_1> {  // d, m, qh[4], qs[16] (8-byte aligned)
  static constexpr int kBytes = 24, kOffset = 0;
  static constexpr bool kMin = true;
  static __device__ __forceinline__ void frag(const uint8_t* b, int c, uint32_t* lo, uint32_t* hi,
                                              float* d, float* m) {
    const uint32_t qh = ld32(b + 4);
    const uint32_t w = ld32(b + 8 + 4 * c);
    *lo = (w & 0x0f0f0f0fu) | spread4(qh >> (4 * c));
    *hi = ((w >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * c));
    const uint32_t dm = ld32(b);
    *d = h2f(dm);
    *m = h2f(dm >> 16);
  }
};

// Shared-memory pitch of one row's step: the 16-byte words covering kSlices blocks at any 2-byte
// alignment, rounded so that the pitch is 16 mod 128 bytes (8 rows x 4 words hit distinct banks).
template <GgmlType T>
__host__ __device__ constexpr int row_pitch() {
  const int need = (kSlices * Q32<T>::kBytes + 30 + 15) / 16 * 16;
  return (need - 16 + 127) / 128 * 128 + 16;
}
template <GgmlType T>
__host__ __device__ constexpr int row_words() {
  return (kSlices * Q32<T>::kBytes + 30 + 15) / 16;
}
template <GgmlType T, int G, int NT>
__host__ __device__ constexpr int stage_bytes() {
  return 16 * G * row_pitch<T>() + NT * kXqPitch + NT * kSlices * 4 * 2;
}
template <GgmlType T, int G, int NT, int S = kStages>
__host__ __device__ constexpr int smem_bytes() {
  const int stages = S * stage_bytes<T, G, NT>();
  const int partials = 16 * G * NT * kSlices * 4;
  return stages > partials ? stages : partials;
}

// ---- cp.async and mma ---------------------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// d[4] = A (16x32 s8, row) * B (32x8 s8, col), int32.
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

// ---- the matmul kernel -----------------------------------------------------------------------------

// Thread block b: rows 16 G (b / n_tiles) .. + 16 G, tokens t_base + NT (b % n_tiles) .. + NT
// (clipped to n_total). w: the matrix (16-byte aligned), w_bytes = rows * row_bytes.
// Variants (bitwise the same results, only the loads differ): S pipeline stages; FAST: the
// addresses of a thread's cp.async words are computed once (every step but the last adds the step
// to them), and the prologue fetches the weights of the first S - 1 steps before waiting for the
// previous kernel (programmatic dependent launch), then their x. trig: lets the next kernel (a
// programmatic dependent) launch at once.
template <GgmlType T, int G, int NTILE, int kStages = 3, bool FAST = false>
__global__ void __launch_bounds__(G * 128)
    q32_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t nb,
               const int8_t* __restrict__ xq, const float* __restrict__ xd,
               const uint32_t* __restrict__ xc, int64_t nbp, int64_t n_total, int64_t t_base,
               int n_tiles, float* __restrict__ y, bool trig) {
  using Q = Q32<T>;
  if (trig) pdl_trigger();
  constexpr int NT = 8 * NTILE;
  constexpr int kRows = 16 * G;
  constexpr int kThreads = G * 128;
  constexpr int kPitch = row_pitch<T>();
  constexpr int kWords = row_words<T>();
  constexpr int kStage = stage_bytes<T, G, NT>();
  constexpr int kXqOff = kRows * kPitch;
  constexpr int kXdOff = kXqOff + NT * kXqPitch;
  constexpr int kXcOff = kXdOff + NT * kSlices * 4;
  extern __shared__ __align__(16) uint8_t smem[];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int rg = warp >> 2;        // row group
  const int sw = (warp & 3) * 4;   // first slice of the warp
  const int g = lane >> 2, c = lane & 3;
  const int64_t row_block = static_cast<int64_t>(blockIdx.x) / n_tiles;
  const int tile = static_cast<int>(static_cast<int64_t>(blockIdx.x) % n_tiles);
  const int64_t t0 = t_base + static_cast<int64_t>(tile) * NT;
  const int nt = n_total - t0 < NT ? static_cast<int>(n_total - t0) : NT;  // >= 1
  const int64_t row0 = row_block * kRows;
  const int64_t w_end = rows * row_bytes;
  const int64_t steps = (nb + kSlices - 1) / kSlices;

  auto load_w = [&](int buf, int64_t j) {
    uint8_t* st = smem + buf * kStage;
    // Weights: row r's bytes of blocks [16 j, 16 j + 16), as the aligned 16-byte words over them.
    for (int i = tid; i < kRows * kWords; i += kThreads) {
      const int r = i / kWords;
      const int k = i - r * kWords;
      const int64_t row = row0 + r;
      if (row >= rows) continue;
      const int64_t start = row * row_bytes + j * (kSlices * Q::kBytes);
      int64_t end = start + kSlices * Q::kBytes;
      const int64_t row_end = (row + 1) * row_bytes;
      if (end > row_end) end = row_end;
      const int64_t a = (start & ~int64_t{15}) + 16 * k;
      if (a >= end) continue;
      const int64_t left = w_end - a;
      cp_async16(st + r * kPitch + 16 * k, w + a, left < 16 ? static_cast<int>(left) : 16);
    }
  };
  // Quantized x of the tile's tokens: 512 bytes of q, 64 of d, 64 of the correction (not for
  // Q8_0, which needs none).
  constexpr int kXWords = Q::kMin || Q::kOffset != 0 ? 40 : 36;
  auto load_x = [&](int buf, int64_t j) {
    uint8_t* st = smem + buf * kStage;
    for (int i = tid; i < NT * kXWords; i += kThreads) {
      const int t = i / kXWords;
      const int k = i - t * kXWords;
      if (t >= nt) continue;
      const int64_t tok = t0 + t;
      if (k < 32) {
        cp_async16(st + kXqOff + t * kXqPitch + 16 * k,
                   xq + tok * nbp * 32 + j * (kSlices * 32) + 16 * k, 16);
      } else if (k < 36) {
        cp_async16(st + kXdOff + t * 64 + 16 * (k - 32), xd + tok * nbp + j * kSlices + 4 * (k - 32),
                   16);
      } else {
        cp_async16(st + kXcOff + t * 64 + 16 * (k - 36), xc + tok * nbp + j * kSlices + 4 * (k - 36),
                   16);
      }
    }
  };

  // FAST: the thread's words at step 0 (every step but the last: the same words + j * the step's
  // bytes, all of them whole - see load_w: a < end <=> a0 < row start + step bytes, and w_end - a
  // >= 16 since a block of the row follows) and its x words (x is padded to whole steps).
  constexpr int kStepBytes = kSlices * Q::kBytes;  // a multiple of 16 for every type
  constexpr int kWIters = (kRows * kWords + kThreads - 1) / kThreads;
  constexpr int kXIters = (NT * kXWords + kThreads - 1) / kThreads;
  const uint8_t* fw_src[FAST ? kWIters : 1];
  int fw_dst[FAST ? kWIters : 1];
  const uint8_t* fx_src[FAST ? kXIters : 1];
  int fx_dst[FAST ? kXIters : 1];
  int fx_stride[FAST ? kXIters : 1];
  if constexpr (FAST) {
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
      const int i = tid + it * kThreads;
      fw_dst[it] = -1;
      fw_src[it] = w;
      if (i < kRows * kWords) {
        const int r = i / kWords;
        const int k = i - r * kWords;
        const int64_t row = row0 + r;
        if (row < rows) {
          const int64_t rs = row * row_bytes;
          const int64_t a0 = (rs & ~int64_t{15}) + 16 * k;
          if (a0 < rs + kStepBytes) {
            fw_dst[it] = r * kPitch + 16 * k;
            fw_src[it] = w + a0;
          }
        }
      }
    }
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      const int i = tid + it * kThreads;
      fx_dst[it] = -1;
      fx_src[it] = reinterpret_cast<const uint8_t*>(xq);
      fx_stride[it] = 0;
      if (i < NT * kXWords) {
        const int t = i / kXWords;
        const int k = i - t * kXWords;
        if (t < nt) {
          const int64_t tok = t0 + t;
          if (k < 32) {
            fx_dst[it] = kXqOff + t * kXqPitch + 16 * k;
            fx_src[it] = reinterpret_cast<const uint8_t*>(xq + tok * nbp * 32 + 16 * k);
            fx_stride[it] = kSlices * 32;
          } else if (k < 36) {
            fx_dst[it] = kXdOff + t * 64 + 16 * (k - 32);
            fx_src[it] = reinterpret_cast<const uint8_t*>(xd + tok * nbp + 4 * (k - 32));
            fx_stride[it] = kSlices * 4;
          } else {
            fx_dst[it] = kXcOff + t * 64 + 16 * (k - 36);
            fx_src[it] = reinterpret_cast<const uint8_t*>(xc + tok * nbp + 4 * (k - 36));
            fx_stride[it] = kSlices * 4;
          }
        }
      }
    }
  }
  auto load_w_fast = [&](int buf, int64_t j) {
    if (j == steps - 1) return load_w(buf, j);  // the last step: partial rows, the matrix's end
    uint8_t* st = smem + buf * kStage;
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
      if (fw_dst[it] >= 0) cp_async16(st + fw_dst[it], fw_src[it] + j * kStepBytes, 16);
    }
  };
  auto load_x_fast = [&](int buf, int64_t j) {
    uint8_t* st = smem + buf * kStage;
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
      if (fx_dst[it] >= 0) cp_async16(st + fx_dst[it], fx_src[it] + j * fx_stride[it], 16);
    }
  };
  auto load_stage = [&](int buf, int64_t j) {
    if constexpr (FAST) {
      load_w_fast(buf, j);
      load_x_fast(buf, j);
    } else {
      load_w(buf, j);
      load_x(buf, j);
    }
  };

  float acc[4][NTILE][4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int q = 0; q < NTILE; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[s][q][e] = 0.0f;
    }
  }
  // Byte offset of the first block of rows g / g + 8 of this warp's group in a staged row.
  const int r_lo = rg * 16 + g, r_hi = r_lo + 8;
  const int off_lo = static_cast<int>(((row0 + r_lo) * row_bytes) & 15);
  const int off_hi = static_cast<int>(((row0 + r_hi) * row_bytes) & 15);

  if constexpr (FAST) {
    // The weights do not depend on the previous kernels: fetched before waiting for them.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) load_w_fast(s, s);
    }
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) load_x_fast(s, s);
      cp_async_commit();
    }
  } else {
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) load_stage(s, s);
      cp_async_commit();
    }
  }
  for (int64_t j = 0; j < steps; ++j) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int64_t jn = j + kStages - 1;
      if (jn < steps) load_stage(static_cast<int>(jn % kStages), jn);
      cp_async_commit();
    }
    const uint8_t* st = smem + static_cast<int>(j % kStages) * kStage;
    const float* sxd = reinterpret_cast<const float*>(st + kXdOff);
    const uint32_t* sxc = reinterpret_cast<const uint32_t*>(st + kXcOff);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int slice = sw + s;
      if (j * kSlices + slice >= nb) break;  // uniform over the warp
      uint32_t a0, a1, a2, a3;
      float d_lo, d_hi, m_lo, m_hi;
      Q::frag(st + r_lo * kPitch + off_lo + slice * Q::kBytes, c, &a0, &a2, &d_lo, &m_lo);
      Q::frag(st + r_hi * kPitch + off_hi + slice * Q::kBytes, c, &a1, &a3, &d_hi, &m_hi);
#pragma unroll
      for (int q = 0; q < NTILE; ++q) {
        const uint8_t* xb = st + kXqOff + (8 * q + g) * kXqPitch + slice * 32 + 4 * c;
        int isum[4];
        mma_s8(isum, a0, a1, a2, a3, ld32(xb), ld32(xb + 16));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = 8 * q + 2 * c + (e & 1);
          const float dx = sxd[tok * kSlices + slice];
          int is = isum[e];
          if constexpr (Q::kOffset != 0) {
            is -= Q::kOffset * static_cast<int>(sxc[tok * kSlices + slice]);
          }
          const float t = __fmul_rn(static_cast<float>(is), dx);
          float a = __fmaf_rn(t, e < 2 ? d_lo : d_hi, acc[s][q][e]);
          if constexpr (Q::kMin) {
            a = __fmaf_rn(e < 2 ? m_lo : m_hi, __uint_as_float(sxc[tok * kSlices + slice]), a);
          }
          acc[s][q][e] = a;
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Slice partials: part[(row_local * NT + token) * kSlices + slice], then the fixed tree.
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int q = 0; q < NTILE; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? r_lo : r_hi;
        const int tok = 8 * q + 2 * c + (e & 1);
        part[(r * NT + tok) * kSlices + sw + s] = acc[s][q][e];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < kRows * NT; i += kThreads) {
    const int r = i / NT;
    const int tok = i - r * NT;
    if (tok >= nt || row0 + r >= rows) continue;
    float v[kSlices];
#pragma unroll
    for (int s = 0; s < kSlices; ++s) v[s] = part[i * kSlices + s];
    // (written out level by level: a loop over off left v in local memory)
    static_assert(kSlices == 16);
#pragma unroll
    for (int s = 0; s < 8; ++s) v[s] = __fadd_rn(v[s], v[s + 8]);
#pragma unroll
    for (int s = 0; s < 4; ++s) v[s] = __fadd_rn(v[s], v[s + 4]);
#pragma unroll
    for (int s = 0; s < 2; ++s) v[s] = __fadd_rn(v[s], v[s + 2]);
    v[0] = __fadd_rn(v[0], v[1]);
    y[(t0 + tok) * rows + row0 + r] = v[0];
  }
}

// ---- the GEMV kernel (small n) ---------------------------------------------------------------------
//
// The same per-(row, token) arithmetic as q32_kernel, bit for bit, without tensor cores: the exact
// integer block dot products come from dp4a, and lane s of a half-warp owns slice s of its rows
// (blocks b = s, s + 16, ... in increasing order, the same epilogue expression), the 16 slices
// are added by the same tree (shuffles at distance 8, 4, 2, 1). A half-warp handles R rows for
// the NT tokens of its tile; a warp's rows are staged into its own shared-memory ring of kGStages
// steps (16 blocks of each row per step, 16-byte cp.async over the aligned words that cover them,
// as q32_kernel) - coalesced loads, no block-wide barrier; the lanes then read their block's bytes
// from shared memory (aligned 32-bit words and a funnel shift where the block is only 2-byte
// aligned). The quantized x is read through the read-only cache (each token's 32-byte block once
// per R rows).

template <int R>
__host__ __device__ constexpr int gemv_stages() {
  return R == 1 ? 6 : 3;  // R = 1 (n <= 4): deep, so that small matrices have all in flight
}
// Pitch of a staged row: the words of a step (+ 16 bytes, the funnel shift reads one word past a
// block), with R * pitch = 64 mod 128 bytes so that the two half-warps read distinct banks.
template <GgmlType T, int R>
__host__ __device__ constexpr int gemv_pitch() {
  const int need = row_words<T>() * 16 + 16;
  const int mod = 128 / R, want = 64 / R;
  return need + ((want - need % mod) + mod) % mod;
}
template <GgmlType T, int R, int S = gemv_stages<R>()>
__host__ __device__ constexpr int gemv_warp_bytes() {
  return S * 2 * R * gemv_pitch<T, R>();
}

// N 32-bit words from the 2-byte aligned shared-memory address p (N + 1 aligned loads).
template <int N>
__device__ __forceinline__ void ldw_a2(const uint8_t* p, uint32_t (&w)[N]) {
  const uint32_t mis = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p)) & 3u;
  const uint32_t* base = reinterpret_cast<const uint32_t*>(p - mis);  // keeps p's address space
  const uint32_t sh = mis * 8u;
  uint32_t prev = base[0];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t next = base[i + 1];
    w[i] = __funnelshift_r(prev, next, sh);
    prev = next;
  }
}

// Per type: the 32 codes of a staged block as 8 words (word i = elements 4i .. 4i + 3, one byte
// each, the layout of a token's quantized x block), d and m. The codes are those of Q32<T>::frag
// (q[c] = frag's lo of c, q[4 + c] = its hi).
template <GgmlType T>
struct GemvUnpack;
template <>
struct GemvUnpack<GgmlType::kQ8_0> {
  static __device__ __forceinline__ void codes(const uint8_t* b, uint32_t (&q)[8], float* d,
                                               float* m) {
    *d = h2f(ld16(b));
    *m = 0.0f;
    ldw_a2<8>(b + 2, q);
  }
};
template <>
struct GemvUnpack<GgmlType::kQ4_0> {
  static __device__ __forceinline__ void codes(const uint8_t* b, uint32_t (&q)[8], float* d,
                                               float* m) {
    *d = h2f(ld16(b));
    *m = 0.0f;
    uint32_t w[4];
    ldw_a2<4>(b + 2, w);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      q[c] = w[c] & 0x0f0f0f0fu;
      q[4 + c] = (w[c] >> 4) & 0x0f0f0f0fu;
    }
  }
};
template <>
struct GemvUnpack<GgmlType::kQ4_1> {
  static __device__ __forceinline__ void codes(const uint8_t* b, uint32_t (&q)[8], float* d,
                                               float* m) {
    const uint32_t dm = ld32(b);
    *d = h2f(dm);
    *m = h2f(dm >> 16);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t w = ld32(b + 4 + 4 * c);
      q[c] = w & 0x0f0f0f0fu;
      q[4 + c] = (w >> 4) & 0x0f0f0f0fu;
    }
  }
};
template <>
struct GemvUnpack<GgmlType::kQ5_0> {
  static __device__ __forceinline__ void codes(const uint8_t* b, uint32_t (&q)[8], float* d,
                                               float* m) {
    *d = h2f(ld16(b));
    *m = 0.0f;
    uint32_t w[5];  // qh, qs[0..16)
    ldw_a2<5>(b + 2, w);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      q[c] = (w[1 + c] & 0x0f0f0f0fu) | spread4(w[0] >> (4 * c));
      q[4 + c] = ((w[1 + c] >> 4) & 0x0f0f0f0fu) | spread4(w[0] >> (16 + 4 * c));
    }
  }
};
template <>
struct GemvUnpack<GgmlType::kQ5_1> {
  static __device__ __forceinline__ void codes(const uint8_t* b, uint32_t (&q)[8], float* d,
                                               float* m) {
    const uint32_t dm = ld32(b);
    *d = h2f(dm);
    *m = h2f(dm >> 16);
    const uint32_t qh = ld32(b + 4);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t w = ld32(b + 8 + 4 * c);
      q[c] = (w & 0x0f0f0f0fu) | spread4(qh >> (4 * c));
      q[4 + c] = ((w >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * c));
    }
  }
};

// Thread block b (blockDim.x / 32 warps, at most MAXW): tile b % n_tiles of NT tokens, rows
// (b / n_tiles) * (2 R warps) ..; warp w's half h takes rows R (2 (warp index in the grid) + h) ..
// + R. Variants (the same bits): R, the ring's depth S, MAXW; trig lets the next kernel (a
// programmatic dependent) launch at once.
template <GgmlType T, int R, int NT, int S = gemv_stages<R>(), int MAXW = 4>
__global__ void __launch_bounds__(MAXW * 32)
    gemv_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t nb,
                const int8_t* __restrict__ xq, const float* __restrict__ xd,
                const uint32_t* __restrict__ xc, int64_t nbp, int64_t n_total, int n_tiles,
                float* __restrict__ y, bool trig) {
  using Q = Q32<T>;
  constexpr int kStages = S;
  if (trig) pdl_trigger();
  constexpr int kPitch = gemv_pitch<T, R>();
  constexpr int kWords = row_words<T>();
  constexpr int kStage = 2 * R * kPitch;
  extern __shared__ __align__(16) uint8_t smem[];

  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int h = lane >> 4;
  const int s = lane & 15;  // the lane's slice
  const int64_t row_block = static_cast<int64_t>(blockIdx.x) / n_tiles;
  const int tile = static_cast<int>(static_cast<int64_t>(blockIdx.x) % n_tiles);
  const int64_t t0 = static_cast<int64_t>(tile) * NT;
  const int nt = n_total - t0 < NT ? static_cast<int>(n_total - t0) : NT;  // >= 1
  const int64_t row0 = ((row_block * warps + warp) * 2 + h) * R;  // the half-warp's first row
  const int64_t w_end = rows * row_bytes;
  const int64_t steps = (nb + kSlices - 1) / kSlices;
  uint8_t* ring = smem + warp * (kStages * kStage);

  // The half-warp stages its own R rows (lane s: words s, s + 16, ... of each row's step).
  auto load_stage = [&](int buf, int64_t j) {
    uint8_t* st = ring + buf * kStage + h * R * kPitch;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = row0 + r;
      if (row >= rows) break;
      const int64_t start = row * row_bytes + j * (kSlices * Q::kBytes);
      int64_t end = start + kSlices * Q::kBytes;
      const int64_t row_end = (row + 1) * row_bytes;
      if (end > row_end) end = row_end;
#pragma unroll
      for (int kk = 0; kk < (kWords + 15) / 16; ++kk) {
        const int k = s + 16 * kk;
        if (k >= kWords) break;
        const int64_t a = (start & ~int64_t{15}) + 16 * k;
        if (a >= end) break;
        const int64_t left = w_end - a;
        cp_async16(st + r * kPitch + 16 * k, w + a, left < 16 ? static_cast<int>(left) : 16);
      }
    }
  };

  int off[R];  // byte offset of the row's first block in a staged row
#pragma unroll
  for (int r = 0; r < R; ++r) off[r] = static_cast<int>(((row0 + r) * row_bytes) & 15);
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int q = 0; q < NT; ++q) acc[r][q] = 0.0f;
  }

  // The weights do not depend on the previous kernels: the first steps are fetched before waiting
  // for them (programmatic dependent launch).
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < steps) load_stage(st, st);
    cp_async_commit();
  }
  pdl_wait();

  for (int64_t j = 0; j < steps; ++j) {
    cp_async_wait<kStages - 2>();
    __syncwarp();  // every lane's copies of step j landed; every lane is done with step j - 1
    {
      const int64_t jn = j + kStages - 1;
      if (jn < steps) load_stage(static_cast<int>(jn % kStages), jn);
      cp_async_commit();
    }
    const int64_t b = j * kSlices + s;
    if (b >= nb) continue;
    const uint8_t* st = ring + static_cast<int>(j % kStages) * kStage + h * R * kPitch;
    uint32_t wq[R][8];
    float dw[R], mw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      GemvUnpack<T>::codes(st + r * kPitch + off[r] + s * Q::kBytes, wq[r], &dw[r], &mw[r]);
    }
#pragma unroll
    for (int q = 0; q < NT; ++q) {
      if (q >= nt) break;
      const int64_t tok = t0 + q;
      const uint4* xp = reinterpret_cast<const uint4*>(xq + tok * nbp * 32 + b * 32);
      const uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const float dx = __ldg(xd + tok * nbp + b);
      uint32_t cx = 0;
      if constexpr (Q::kMin || Q::kOffset != 0) cx = __ldg(xc + tok * nbp + b);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        int is = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          is = __dp4a(static_cast<int>(wq[r][i]), static_cast<int>(xw[i]), is);
        }
        if constexpr (Q::kOffset != 0) is -= Q::kOffset * static_cast<int>(cx);
        const float t = __fmul_rn(static_cast<float>(is), dx);
        float a = __fmaf_rn(t, dw[r], acc[r][q]);
        if constexpr (Q::kMin) a = __fmaf_rn(mw[r], __uint_as_float(cx), a);
        acc[r][q] = a;
      }
    }
  }
  cp_async_wait<0>();

  // The fixed tree over the 16 slices: v[s] += v[s + off] for off = 8, 4, 2, 1.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int q = 0; q < NT; ++q) {
      float v = acc[r][q];
#pragma unroll
      for (int o = kSlices / 2; o >= 1; o >>= 1) {
        v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, o, 16));
      }
      if (s == 0 && q < nt && row0 + r < rows) y[(t0 + q) * rows + row0 + r] = v;
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

// Scratch for the quantized activations.
StreamScratch& scratch() {
  static StreamScratch* s = new StreamScratch("matmul: activation scratch", size_t{8} << 20);
  return *s;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Programmatic dependent launches (the quantization kernel and the GEMV start while the kernel
// before them drains; each waits for it with griddepcontrol.wait before touching its outputs).
// On by default; SPECDEC_CUDA_PDL=0 turns them off, and a launch the driver refuses turns them off
// for the rest of the process.
std::atomic<bool>& pdl_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv("SPECDEC_CUDA_PDL");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }()};
  return f;
}

template <class... P, class... A>
void pdl_launch(const char* what, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_flag().load(std::memory_order_relaxed) ? 1 : 0;
  cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
  if (err != cudaSuccess && cfg.numAttrs == 1 &&
      (err == cudaErrorNotSupported || err == cudaErrorInvalidValue)) {
    (void)cudaGetLastError();  // clear it, retry as a plain launch
    pdl_flag().store(false);
    cfg.numAttrs = 0;
    err = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
  }
  if (err != cudaSuccess) throw_cuda_error(what, err, __FILE__, __LINE__);
}

// The largest n that takes the GEMV kernel, at most 16 (SPECDEC_CUDA_GEMV_MAX_N overrides the
// default 2; 0 = never). Default from the H100/H200 runs of session 19 (8B shapes, Q8_0, graph
// replay): GEMV n = 1, 2, 4, 8: 4.00, 4.89, 7.97, 12.7 ms on an H200; the mma kernel 7.41, 7.49,
// 7.62, 7.85 ms on an H100 - the GEMV wins up to 2 tokens, the mma from about 4.
std::atomic<int64_t>& gemv_max_n_flag() {
  static std::atomic<int64_t> v{[] {
    const char* e = std::getenv("SPECDEC_CUDA_GEMV_MAX_N");
    if (e == nullptr || *e == '\0') return int64_t{2};
    return std::min<int64_t>(std::max<int64_t>(std::atoll(e), 0), 16);
  }()};
  return v;
}
int64_t gemv_max_n() {
  return gemv_max_n_flag().load(std::memory_order_relaxed);
}

// Early triggers (SPECDEC_CUDA_PDL_EARLY=1, off by default): every kernel of this file lets the
// kernel after it launch at once (griddepcontrol.launch_dependents first thing), and the
// quantization kernel does so before it waits - so the next matmul's thread blocks become resident
// and fetch their weights while the current matmul drains. Safe: a kernel touches nothing but its
// weights before griddepcontrol.wait, which returns only when the kernel before it (and so, by
// induction, every earlier one) has completed.
std::atomic<bool>& pdl_early_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv("SPECDEC_CUDA_PDL_EARLY");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }()};
  return f;
}
bool pdl_early() {
  return pdl_early_flag().load(std::memory_order_relaxed);
}

// ---- kernel variants (for the offline autotune: bench_cuda_shapes --sweep) ----------------------
//
// Every variant gives bitwise the same results as the default (the same slices, block order,
// epilogue and tree; only the work distribution, pipelining and loads differ). Selected by name
// with SPECDEC_CUDA_GEMV_VARIANT / SPECDEC_CUDA_MMA_VARIANT, or q32_set_variant (tests, bench).
// Only Q8_0 and Q4_1 have the non-default variants compiled (compile time); the other types
// always take the default.
//
// GEMV: r = rows per half-warp (0: the default's choice by n: 1 up to 4 tokens, 2 up to 8, else 4,
// with its default ring depth), s = cp.async ring depth (steps of 16 blocks), w = warps per thread
// block (0: 4, or fewer while that leaves under 3 thread blocks per SM).
struct GemvVariant {
  const char* name;
  int r, s, w;
};
constexpr GemvVariant kGemvVariants[] = {
    {"default", 0, 0, 0}, {"r1s2", 1, 2, 0},   {"r1s4", 1, 4, 0},   {"r1s8", 1, 8, 0},
    {"r2s3", 2, 3, 0},    {"r2s6", 2, 6, 0},   {"r4s3", 4, 3, 0},   {"r1s6w1", 1, 6, 1},
    {"r1s6w2", 1, 6, 2},  {"r1s6w8", 1, 6, 8}, {"r1s4w8", 1, 4, 8}, {"r2s3w8", 2, 3, 8},
};
constexpr int kGemvVariantCount = sizeof(kGemvVariants) / sizeof(kGemvVariants[0]);
// mma: g = row groups of 16 per thread block (0: the default - 2 when that leaves every SM two
// thread blocks, else 1), s = pipeline stages, fast = precomputed cp.async addresses and the
// weights of the prologue fetched before waiting for the previous kernel, t8 = every tile 8 tokens
// (n = 16: two tiles of 8 instead of one of 16), pdl = launched as a programmatic dependent (its
// prologue's weight fetch overlaps the quantization kernel).
struct MmaVariant {
  const char* name;
  int g, s;
  bool fast, t8, pdl;
};
constexpr MmaVariant kMmaVariants[] = {
    {"default", 0, 3, false, false, false},   {"fast", 0, 3, true, false, false},
    {"fast_pdl", 0, 3, true, false, true},    {"fast_t8", 0, 3, true, true, false},
    {"g1s3f", 1, 3, true, false, false},      {"g1s4f", 1, 4, true, false, false},
    {"g1s5f", 1, 5, true, false, false},      {"g2s2f", 2, 2, true, false, false},
    {"g2s3f", 2, 3, true, false, false},      {"g2s4f", 2, 4, true, false, false},
    {"g4s2f", 4, 2, true, false, false},      {"g4s3f", 4, 3, true, false, false},
    {"g1s4f_pdl", 1, 4, true, false, true},   {"g2s4f_pdl", 2, 4, true, false, true},
    {"g2s3f_t8_pdl", 2, 3, true, true, true},
};
constexpr int kMmaVariantCount = sizeof(kMmaVariants) / sizeof(kMmaVariants[0]);

int variant_from_env(const char* var, bool gemv) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return 0;
  const int count = gemv ? kGemvVariantCount : kMmaVariantCount;
  for (int i = 0; i < count; ++i) {
    if (std::strcmp(e, gemv ? kGemvVariants[i].name : kMmaVariants[i].name) == 0) return i;
  }
  throw Error(std::string(var) + "=" + e + ": no such variant");
}
std::atomic<int>& gemv_variant_flag() {
  static std::atomic<int> v{variant_from_env("SPECDEC_CUDA_GEMV_VARIANT", true)};
  return v;
}
std::atomic<int>& mma_variant_flag() {
  static std::atomic<int> v{variant_from_env("SPECDEC_CUDA_MMA_VARIANT", false)};
  return v;
}

template <GgmlType T>
constexpr bool kTuned = T == GgmlType::kQ8_0 || T == GgmlType::kQ4_1;

// The variant a call takes when none is forced (variant 0 = "default" then means: chosen by n),
// from `bench_cuda_shapes --sweep` on an H200 (session 19; 8B shapes, graph replay, time vs the
// untuned kernel): GEMV n = 1 r1s8 (0.95), n = 2 r1s2 (0.75-0.95); mma n <= 4 g1s3f / g1s4f_pdl
// (0.79 / 0.84), n <= 8 fast (0.82-0.83), larger g2s3f / fast_t8 (0.82 / 0.79). All variants give
// the same bits, so the choice never changes a result.
constexpr int variant_index(const char* name, bool gemv) {
  const int count = gemv ? kGemvVariantCount : kMmaVariantCount;
  for (int i = 0; i < count; ++i) {
    const char* a = gemv ? kGemvVariants[i].name : kMmaVariants[i].name;
    const char* b = name;
    while (*a != '\0' && *a == *b) {
      ++a;
      ++b;
    }
    if (*a == *b) return i;
  }
  return 0;
}
template <GgmlType T>
int auto_gemv_variant(int64_t n) {
  if constexpr (!kTuned<T>) return 0;
  return n <= 1 ? variant_index("r1s8", true) : variant_index("r1s2", true);
}
template <GgmlType T>
int auto_mma_variant(int64_t n) {
  if constexpr (!kTuned<T>) return 0;
  constexpr bool q8 = T == GgmlType::kQ8_0;
  if (n <= 4) return variant_index(q8 ? "g1s3f" : "g1s4f_pdl", false);
  if (n <= 8) return variant_index("fast", false);
  return variant_index(q8 ? "g2s3f" : "fast_t8", false);
}

// ---- mma launches ----------------------------------------------------------------------------------

template <GgmlType T, int G, int NTILE, int S, bool FAST>
void launch(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
            int64_t nbp, int64_t n, int64_t t_base, int64_t n_tiles, float* y, bool pdl) {
  constexpr int kSmem = smem_bytes<T, G, 8 * NTILE, S>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(q32_kernel<T, G, NTILE, S, FAST>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)attr;
  const int64_t row_blocks = (w.rows + 16 * G - 1) / (16 * G);
  const int64_t blocks = row_blocks * n_tiles;
  if (blocks > 0x7fffffffLL) {
    throw Error("cuda::matmul: too many thread blocks (" + std::to_string(blocks) + ")");
  }
  const bool trig = pdl_early();
  if (pdl) {
    pdl_launch("q32_kernel", q32_kernel<T, G, NTILE, S, FAST>,
               dim3(static_cast<unsigned>(blocks)), dim3(G * 128), static_cast<size_t>(kSmem),
               static_cast<const uint8_t*>(w.data), w.rows, w.row_bytes, w.cols / 32, xq, xd, xc,
               nbp, n, t_base, static_cast<int>(n_tiles), y, trig);
    return;
  }
  q32_kernel<T, G, NTILE, S, FAST><<<static_cast<unsigned>(blocks), G * 128, kSmem, stream()>>>(
      static_cast<const uint8_t*>(w.data), w.rows, w.row_bytes, w.cols / 32, xq, xd, xc, nbp, n,
      t_base, static_cast<int>(n_tiles), y, trig);
  CUDA_CHECK_LAUNCH("q32_kernel");
}

// G: 0 = the default's choice.
template <GgmlType T, int NTILE, int G, int S, bool FAST>
void launch_g(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
              int64_t nbp, int64_t n, int64_t t_base, int64_t n_tiles, float* y, bool pdl) {
  if constexpr (G != 0) {
    launch<T, G, NTILE, S, FAST>(w, xq, xd, xc, nbp, n, t_base, n_tiles, y, pdl);
  } else if ((w.rows + 31) / 32 * n_tiles >= 2 * sm_count()) {
    // 32 rows per thread block (x staged once for more rows) when that still gives every SM two.
    launch<T, 2, NTILE, S, FAST>(w, xq, xd, xc, nbp, n, t_base, n_tiles, y, pdl);
  } else {
    launch<T, 1, NTILE, S, FAST>(w, xq, xd, xc, nbp, n, t_base, n_tiles, y, pdl);
  }
}

template <GgmlType T, int G, int S, bool FAST>
void run_mma_tiles(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
                   int64_t nbp, int64_t n, float* y, bool t8, bool pdl) {
  if (t8) {  // tiles of 8 tokens only
    launch_g<T, 1, G, S, FAST>(w, xq, xd, xc, nbp, n, 0, (n + 7) / 8, y, pdl);
    return;
  }
  // Tiles of 16 tokens, the rest in one tile of 8 or 16.
  const int64_t full = n / 16;
  if (full > 0) launch_g<T, 2, G, S, FAST>(w, xq, xd, xc, nbp, n, 0, full, y, pdl);
  const int64_t rest = n - full * 16;
  if (rest == 0) return;
  // The second launch of a call must not be a programmatic dependent of the first (it would
  // wait for it for nothing, but it is also harmless); keep it a plain launch.
  if (rest <= 8) {
    launch_g<T, 1, G, S, FAST>(w, xq, xd, xc, nbp, n, full * 16, 1, y, pdl && full == 0);
  } else {
    launch_g<T, 2, G, S, FAST>(w, xq, xd, xc, nbp, n, full * 16, 1, y, pdl && full == 0);
  }
}

template <GgmlType T, int V>
void run_mma_v(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
               int64_t nbp, int64_t n, float* y) {
  constexpr MmaVariant v = kMmaVariants[V];
  run_mma_tiles<T, v.g, v.s, v.fast>(w, xq, xd, xc, nbp, n, y, v.t8, v.pdl);
}
template <GgmlType T, size_t... I>
void run_mma_dispatch(int v, const DeviceMatrix& w, const int8_t* xq, const float* xd,
                      const uint32_t* xc, int64_t nbp, int64_t n, float* y,
                      std::index_sequence<I...>) {
  (void)((v == static_cast<int>(I) ? (run_mma_v<T, static_cast<int>(I)>(w, xq, xd, xc, nbp, n, y),
                                      true)
                                   : false) ||
         ...);
}
template <GgmlType T>
void run_mma(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
             int64_t nbp, int64_t n, float* y) {
  int v = mma_variant_flag().load(std::memory_order_relaxed);
  if (v == 0) v = auto_mma_variant<T>(n);
  if constexpr (kTuned<T>) {
    if (v != 0) {
      return run_mma_dispatch<T>(v, w, xq, xd, xc, nbp, n, y,
                                 std::make_index_sequence<kMmaVariantCount>{});
    }
  }
  run_mma_v<T, 0>(w, xq, xd, xc, nbp, n, y);
}

// ---- GEMV launches ---------------------------------------------------------------------------------

// warps_fixed: warps per thread block (<= MAXW), 0: the default's choice (at most 4).
template <GgmlType T, int R, int NT, int S, int MAXW>
void launch_gemv(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
                 int64_t nbp, int64_t n, float* y, int warps_fixed) {
  constexpr int kWarpBytes = gemv_warp_bytes<T, R, S>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<T, R, NT, S, MAXW>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    MAXW * kWarpBytes));
    return true;
  }();
  (void)attr;
  const int64_t n_tiles = (n + NT - 1) / NT;
  const int64_t warps_needed = (w.rows + 2 * R - 1) / (2 * R);  // 2 R rows per warp
  int warps = warps_fixed > 0 ? std::min(warps_fixed, MAXW) : std::min(4, MAXW);
  if (warps_fixed <= 0) {
    // Warps per thread block: 4, or fewer when that leaves under 3 thread blocks per SM.
    while (warps > 1 && (warps_needed + warps - 1) / warps * n_tiles < 3 * sm_count()) warps /= 2;
  }
  const int64_t blocks = (warps_needed + warps - 1) / warps * n_tiles;
  if (blocks > 0x7fffffffLL) {
    throw Error("cuda::matmul: too many thread blocks (" + std::to_string(blocks) + ")");
  }
  pdl_launch("gemv_kernel", gemv_kernel<T, R, NT, S, MAXW>, dim3(static_cast<unsigned>(blocks)),
             dim3(static_cast<unsigned>(32 * warps)), static_cast<size_t>(warps * kWarpBytes),
             static_cast<const uint8_t*>(w.data), w.rows, w.row_bytes, w.cols / 32, xq, xd, xc,
             nbp, n, static_cast<int>(n_tiles), y, pdl_early());
}

template <GgmlType T, int R, int S, int MAXW>
void run_gemv_rs(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
                 int64_t nbp, int64_t n, float* y, int warps) {
  if (n == 1) return launch_gemv<T, R, 1, S, MAXW>(w, xq, xd, xc, nbp, n, y, warps);
  if (n == 2) return launch_gemv<T, R, 2, S, MAXW>(w, xq, xd, xc, nbp, n, y, warps);
  if (n <= 4) return launch_gemv<T, R, 4, S, MAXW>(w, xq, xd, xc, nbp, n, y, warps);
  if (n <= 8) return launch_gemv<T, R, 8, S, MAXW>(w, xq, xd, xc, nbp, n, y, warps);
  return launch_gemv<T, R, 16, S, MAXW>(w, xq, xd, xc, nbp, n, y, warps);
}

template <GgmlType T>
void run_gemv_default(const DeviceMatrix& w, const int8_t* xq, const float* xd,
                      const uint32_t* xc, int64_t nbp, int64_t n, float* y) {
  if (n == 1) return launch_gemv<T, 1, 1, gemv_stages<1>(), 4>(w, xq, xd, xc, nbp, n, y, 0);
  if (n == 2) return launch_gemv<T, 1, 2, gemv_stages<1>(), 4>(w, xq, xd, xc, nbp, n, y, 0);
  if (n <= 4) return launch_gemv<T, 1, 4, gemv_stages<1>(), 4>(w, xq, xd, xc, nbp, n, y, 0);
  if (n <= 8) return launch_gemv<T, 2, 8, gemv_stages<2>(), 4>(w, xq, xd, xc, nbp, n, y, 0);
  return launch_gemv<T, 4, 16, gemv_stages<4>(), 4>(w, xq, xd, xc, nbp, n, y, 0);
}

template <GgmlType T, int V>
void run_gemv_v(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
                int64_t nbp, int64_t n, float* y) {
  constexpr GemvVariant v = kGemvVariants[V];
  if constexpr (v.r == 0) {
    run_gemv_default<T>(w, xq, xd, xc, nbp, n, y);
  } else {
    run_gemv_rs<T, v.r, v.s, (v.w > 4 ? 8 : 4)>(w, xq, xd, xc, nbp, n, y, v.w);
  }
}
template <GgmlType T, size_t... I>
void run_gemv_dispatch(int v, const DeviceMatrix& w, const int8_t* xq, const float* xd,
                       const uint32_t* xc, int64_t nbp, int64_t n, float* y,
                       std::index_sequence<I...>) {
  (void)((v == static_cast<int>(I)
              ? (run_gemv_v<T, static_cast<int>(I)>(w, xq, xd, xc, nbp, n, y), true)
              : false) ||
         ...);
}
template <GgmlType T>
void run_gemv(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
              int64_t nbp, int64_t n, float* y) {
  int v = gemv_variant_flag().load(std::memory_order_relaxed);
  if (v == 0) v = auto_gemv_variant<T>(n);
  if constexpr (kTuned<T>) {
    if (v != 0) {
      return run_gemv_dispatch<T>(v, w, xq, xd, xc, nbp, n, y,
                                  std::make_index_sequence<kGemvVariantCount>{});
    }
  }
  run_gemv_default<T>(w, xq, xd, xc, nbp, n, y);
}

template <GgmlType T>
void run(const DeviceMatrix& w, const float* x, int64_t n, float* y) {
  const int64_t nb = w.cols / 32;
  const int64_t nbp = (nb + kSlices - 1) / kSlices * kSlices;
  const size_t q_bytes = static_cast<size_t>(n * nbp * 32);
  const size_t f_bytes = static_cast<size_t>(n * nbp * 4);
  uint8_t* base = static_cast<uint8_t*>(scratch().get(q_bytes + 2 * f_bytes));
  auto* xq = reinterpret_cast<int8_t*>(base);
  auto* xd = reinterpret_cast<float*>(base + q_bytes);
  auto* xc = reinterpret_cast<uint32_t*>(base + q_bytes + f_bytes);
  {
    const int64_t items = n * nb;
    const int64_t blocks = (items + 7) / 8;
    if (blocks > 0x7fffffffLL) throw Error("cuda::matmul: too many tokens");
    pdl_launch("quantize_kernel", quantize_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256),
               0, x, n, w.cols, nbp, Q32<T>::kMin, xq, xd, xc, pdl_early());
  }
  if (n <= gemv_max_n()) return run_gemv<T>(w, xq, xd, xc, nbp, n, y);
  run_mma<T>(w, xq, xd, xc, nbp, n, y);
}

}  // namespace

// For the tests (declared there): sets the largest n of the GEMV path (clamped to [0, 16]),
// returns the previous value.
int64_t q32_set_gemv_max_n(int64_t n) {
  return gemv_max_n_flag().exchange(std::min<int64_t>(std::max<int64_t>(n, 0), 16));
}

// For the tests and bench_cuda_shapes --sweep (declared there): the kernel variants (kind 0: the
// GEMV, 1: the mma kernel; variant 0 is the default), and the early PDL triggers. The setters
// return the previous value; not for use while work is queued that the change would affect.
int q32_variant_count(int kind) {
  return kind == 0 ? kGemvVariantCount : kMmaVariantCount;
}
const char* q32_variant_name(int kind, int i) {
  if (i < 0 || i >= q32_variant_count(kind)) return nullptr;
  return kind == 0 ? kGemvVariants[i].name : kMmaVariants[i].name;
}
int q32_set_variant(int kind, int i) {
  if (i < 0 || i >= q32_variant_count(kind)) throw Error("q32_set_variant: no such variant");
  return kind == 0 ? gemv_variant_flag().exchange(i) : mma_variant_flag().exchange(i);
}
bool q32_set_pdl_early(bool on) {
  return pdl_early_flag().exchange(on);
}

bool q32_matmul_supported(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
      return true;
    default:
      return false;
  }
}

void q32_matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y) {
  switch (w.type) {
    case GgmlType::kQ8_0:
      return run<GgmlType::kQ8_0>(w, x, n, y);
    case GgmlType::kQ4_0:
      return run<GgmlType::kQ4_0>(w, x, n, y);
    case GgmlType::kQ4_1:
      return run<GgmlType::kQ4_1>(w, x, n, y);
    case GgmlType::kQ5_0:
      return run<GgmlType::kQ5_0>(w, x, n, y);
    case GgmlType::kQ5_1:
      return run<GgmlType::kQ5_1>(w, x, n, y);
    default:
      throw Error("cuda::matmul: no int8 path for this type");
  }
}

}  // namespace specdec::cuda::detail
