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

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda::detail {

// Declared (and called) in cuda_matmul.cu.
bool q32_matmul_supported(GgmlType type);
void q32_matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y);
// Declared in tests/cuda/test_cuda_ops.cpp.
int64_t q32_set_gemv_max_n(int64_t n);

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
                    uint32_t* __restrict__ xc) {
  // Launched as a programmatic dependent (pdl_launch): x and the scratch may still be in use by
  // the previous kernels until pdl_wait; the matmul after this kernel may start (and fetch its
  // weights) at once.
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
template <GgmlType T, int G, int NT>
__host__ __device__ constexpr int smem_bytes() {
  const int stages = kStages * stage_bytes<T, G, NT>();
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
template <GgmlType T, int G, int NTILE>
__global__ void __launch_bounds__(G * 128)
    q32_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t nb,
               const int8_t* __restrict__ xq, const float* __restrict__ xd,
               const uint32_t* __restrict__ xc, int64_t nbp, int64_t n_total, int64_t t_base,
               int n_tiles, float* __restrict__ y) {
  using Q = Q32<T>;
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

  auto load_stage = [&](int buf, int64_t j) {
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
    // Quantized x of the tile's tokens: 512 bytes of q, 64 of d, 64 of the correction (not for
    // Q8_0, which needs none).
    constexpr int kXWords = Q::kMin || Q::kOffset != 0 ? 40 : 36;
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

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s, s);
    cp_async_commit();
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
#pragma unroll
    for (int off = kSlices / 2; off >= 1; off >>= 1) {
#pragma unroll
      for (int s = 0; s < off; ++s) v[s] = __fadd_rn(v[s], v[s + off]);
    }
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
template <GgmlType T, int R>
__host__ __device__ constexpr int gemv_warp_bytes() {
  return gemv_stages<R>() * 2 * R * gemv_pitch<T, R>();
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

// Thread block b (blockDim.x / 32 warps): tile b % n_tiles of NT tokens, rows (b / n_tiles) *
// (2 R warps) ..; warp w's half h takes rows R (2 (warp index in the grid) + h) .. + R.
template <GgmlType T, int R, int NT>
__global__ void __launch_bounds__(128)
    gemv_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t nb,
                const int8_t* __restrict__ xq, const float* __restrict__ xd,
                const uint32_t* __restrict__ xc, int64_t nbp, int64_t n_total, int n_tiles,
                float* __restrict__ y) {
  using Q = Q32<T>;
  constexpr int kStages = gemv_stages<R>();
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

// Scratch for the quantized activations: grows (never during a stream capture).
struct Scratch {
  DeviceBuffer buf;
  void* get(size_t bytes) {
    if (bytes > buf.bytes()) {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      CUDA_CHECK(cudaStreamIsCapturing(stream(), &st));
      if (st != cudaStreamCaptureStatusNone) {
        throw Error("cuda::matmul: activation scratch of " + std::to_string(bytes) +
                    " bytes needed during a graph capture (run the shape once before capturing)");
      }
      CUDA_CHECK(cudaStreamSynchronize(stream()));  // the old buffer may still be in use
      buf = DeviceBuffer(std::max(bytes, size_t{8} << 20));
    }
    return buf.data();
  }
};
Scratch& scratch() {
  static Scratch* s = new Scratch;  // never destroyed: no cudaFree after the runtime's teardown
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

template <GgmlType T, int G, int NTILE>
void launch(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
            int64_t nbp, int64_t n, int64_t t_base, int64_t n_tiles, float* y) {
  constexpr int kSmem = smem_bytes<T, G, 8 * NTILE>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(q32_kernel<T, G, NTILE>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)attr;
  const int64_t row_blocks = (w.rows + 16 * G - 1) / (16 * G);
  const int64_t blocks = row_blocks * n_tiles;
  if (blocks > 0x7fffffffLL) {
    throw Error("cuda::matmul: too many thread blocks (" + std::to_string(blocks) + ")");
  }
  q32_kernel<T, G, NTILE><<<static_cast<unsigned>(blocks), G * 128, kSmem, stream()>>>(
      static_cast<const uint8_t*>(w.data), w.rows, w.row_bytes, w.cols / 32, xq, xd, xc, nbp, n,
      t_base, static_cast<int>(n_tiles), y);
  CUDA_CHECK_LAUNCH("q32_kernel");
}

template <GgmlType T, int NTILE>
void launch_g(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
              int64_t nbp, int64_t n, int64_t t_base, int64_t n_tiles, float* y) {
  // 32 rows per thread block (x staged once for more rows) when that still gives every SM two.
  if ((w.rows + 31) / 32 * n_tiles >= 2 * sm_count()) {
    launch<T, 2, NTILE>(w, xq, xd, xc, nbp, n, t_base, n_tiles, y);
  } else {
    launch<T, 1, NTILE>(w, xq, xd, xc, nbp, n, t_base, n_tiles, y);
  }
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

template <GgmlType T, int R, int NT>
void launch_gemv(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
                 int64_t nbp, int64_t n, float* y) {
  constexpr int kWarpBytes = gemv_warp_bytes<T, R>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<T, R, NT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * kWarpBytes));
    return true;
  }();
  (void)attr;
  const int64_t n_tiles = (n + NT - 1) / NT;
  // Warps per thread block: 4, or fewer when that leaves under 3 thread blocks per SM.
  const int64_t warps_needed = (w.rows + 2 * R - 1) / (2 * R);  // 2 R rows per warp
  int warps = 4;
  while (warps > 1 && (warps_needed + warps - 1) / warps * n_tiles < 3 * sm_count()) warps /= 2;
  const int64_t blocks = (warps_needed + warps - 1) / warps * n_tiles;
  if (blocks > 0x7fffffffLL) {
    throw Error("cuda::matmul: too many thread blocks (" + std::to_string(blocks) + ")");
  }
  pdl_launch("gemv_kernel", gemv_kernel<T, R, NT>, dim3(static_cast<unsigned>(blocks)),
             dim3(static_cast<unsigned>(32 * warps)), static_cast<size_t>(warps * kWarpBytes),
             static_cast<const uint8_t*>(w.data), w.rows, w.row_bytes, w.cols / 32, xq, xd, xc,
             nbp, n, static_cast<int>(n_tiles), y);
}

template <GgmlType T>
void run_gemv(const DeviceMatrix& w, const int8_t* xq, const float* xd, const uint32_t* xc,
              int64_t nbp, int64_t n, float* y) {
  if (n == 1) return launch_gemv<T, 1, 1>(w, xq, xd, xc, nbp, n, y);
  if (n == 2) return launch_gemv<T, 1, 2>(w, xq, xd, xc, nbp, n, y);
  if (n <= 4) return launch_gemv<T, 1, 4>(w, xq, xd, xc, nbp, n, y);
  if (n <= 8) return launch_gemv<T, 2, 8>(w, xq, xd, xc, nbp, n, y);
  return launch_gemv<T, 4, 16>(w, xq, xd, xc, nbp, n, y);
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
               0, x, n, w.cols, nbp, Q32<T>::kMin, xq, xd, xc);
  }
  if (n <= gemv_max_n()) return run_gemv<T>(w, xq, xd, xc, nbp, n, y);
  // Tiles of 16 tokens, the rest in one tile of 8 or 16.
  const int64_t full = n / 16;
  if (full > 0) launch_g<T, 2>(w, xq, xd, xc, nbp, n, 0, full, y);
  const int64_t rest = n - full * 16;
  if (rest == 0) return;
  if (rest <= 8) {
    launch_g<T, 1>(w, xq, xd, xc, nbp, n, full * 16, 1, y);
  } else {
    launch_g<T, 2>(w, xq, xd, xc, nbp, n, full * 16, 1, y);
  }
}

}  // namespace

// For the tests (declared there): sets the largest n of the GEMV path (clamped to [0, 16]),
// returns the previous value.
int64_t q32_set_gemv_max_n(int64_t n) {
  return gemv_max_n_flag().exchange(std::min<int64_t>(std::max<int64_t>(n, 0), 16));
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
