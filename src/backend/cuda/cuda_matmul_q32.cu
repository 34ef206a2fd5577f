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
// Batch invariance: the integer dot products are exact, and the float operations of (row, token)
// - its slices, their block order, the tree - depend only on cols, never on n, the tile or G, so
// a token's result is bitwise the same in any batch.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda::detail {

// Declared (and called) in cuda_matmul.cu.
bool q32_matmul_supported(GgmlType type);
void q32_matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y);

namespace {

constexpr int kSlices = 16;      // float partial sums per (row, token); blocks per step
constexpr int kStages = 3;       // cp.async pipeline depth
constexpr int kXqPitch = 528;    // bytes per token of a step's q in shared memory (512 + 16: the
                                 // 8 tokens of an mma hit distinct banks)
constexpr float kMinAmax = 1e-30f;  // detail::kMinActivationAmax of the CPU

// ---- activation quantization ---------------------------------------------------------------

// One warp per (token, block of 32); lane j takes element j.
__global__ void __launch_bounds__(256)
    quantize_kernel(const float* __restrict__ x, int64_t n, int64_t cols, int64_t nbp,
                    bool min_type, int8_t* __restrict__ xq, float* __restrict__ xd,
                    uint32_t* __restrict__ xc) {
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
    quantize_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream()>>>(
        x, n, w.cols, nbp, Q32<T>::kMin, xq, xd, xc);
    CUDA_CHECK_LAUNCH("quantize_kernel");
  }
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
