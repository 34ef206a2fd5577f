// matmul (y = x·Wᵀ with W dequantized in the kernel) and get_rows (the embedding lookup) of the
// CUDA backend (cuda_ops.h), for every weight type the CPU multiplies.
//
// The unit of work is 32 consecutive elements of a weight row ("unit"): a block of the 32-element
// types, an eighth of a K-quant super-block, 32 elements of a float row (the last unit of a float
// row may be partial: its missing elements are zero). dequant_unit<T> turns unit u of a row into
// 32 floats with exactly the arithmetic of the CPU's dequantize_row (separately rounded products
// and sums, no FMA contraction), so get_rows gives the CPU's bits.
//
// matmul, designed for decode (n small, memory-bound): a thread block of kWarps warps computes
// kWarps output rows (one per warp) for one tile of up to NT tokens. The row's units are walked
// in chunks of 32 units (1024 columns): lane l takes unit 32c + l of chunk c, dequantizes it and
// accumulates its 32 products with each token's x (staged per chunk in shared memory) into the
// lane's accumulator of that token, fmaf after fmaf in element order. After the last chunk the
// 32 lane sums of a token are added by a fixed xor-shuffle tree.
//
// Batch invariance: the float operations that produce y[t, r] - which lane takes which unit, the
// fmaf chain inside a lane, the shuffle tree - depend only on the row, cols and token t's x, never
// on n, NT or the tile t falls in (tokens of a tile share nothing but the staged copy of x), so a
// token's result is bitwise the same whatever the batch.
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda {
namespace detail {
// The int8 tensor-core path of the 32-element-block types (cuda_matmul_q32.cu).
bool q32_matmul_supported(GgmlType type);
void q32_matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y);
}  // namespace detail

namespace {

// The legacy kernel (float dequantization for every type) instead of the fast paths: for A/B
// comparisons. Starts from the environment (SPECDEC_CUDA_MATMUL=legacy).
std::atomic<bool>& legacy_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv("SPECDEC_CUDA_MATMUL");
    return e != nullptr && std::strcmp(e, "legacy") == 0;
  }()};
  return f;
}

// #pragma unroll in the __host__ __device__ code below, for the device pass only (the host
// compiler would warn about an unknown pragma).
#ifdef __CUDA_ARCH__
#define SPECDEC_UNROLL _Pragma("unroll")
#else
#define SPECDEC_UNROLL
#endif

// ---- loads and conversions -------------------------------------------------------------------

__host__ __device__ __forceinline__ float h2f(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
}
__host__ __device__ __forceinline__ float bf2f(uint32_t h) {
  const uint32_t bits = (h & 0xffffu) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}
// Separately rounded float product and sum (never contracted into an FMA). The host versions
// exist only so that a host-side check can run the dequantization (x86-64 without -mfma).
__host__ __device__ __forceinline__ float fmul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ __forceinline__ float fadd_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
// p 2-byte aligned.
__host__ __device__ __forceinline__ uint32_t ld16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
// 32 bits from a 2-byte aligned address (two 16-bit loads).
__host__ __device__ __forceinline__ uint32_t ld32_a2(const uint8_t* p) {
  return ld16(p) | (ld16(p + 2) << 16);
}
// p 4-byte aligned.
__host__ __device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// p 16-byte aligned.
__host__ __device__ __forceinline__ uint4 ld128(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}
// Byte i of a little-endian word array (i a compile-time constant after unrolling).
template <int N>
__host__ __device__ __forceinline__ uint32_t byte_of(const uint32_t (&w)[N], int i) {
  return (w[i >> 2] >> (8 * (i & 3))) & 0xffu;
}
__host__ __device__ __forceinline__ void put4(uint32_t (&w)[8], int at, uint4 v) {
  w[at] = v.x;
  w[at + 1] = v.y;
  w[at + 2] = v.z;
  w[at + 3] = v.w;
}
// a * b + c with both roundings (never contracted into an FMA), as the CPU computes it.
__host__ __device__ __forceinline__ float mul_add_rn(float a, float b, float c) {
  return fadd_rn(fmul_rn(a, b), c);
}

// ggml's get_scale_min_k4 on the 12 scale bytes held in three words; j in [0, 8) at run time.
__host__ __device__ __forceinline__ uint32_t scale_byte(const uint32_t (&s)[3], int k) {
  const uint32_t word = k < 4 ? s[0] : (k < 8 ? s[1] : s[2]);
  return (word >> (8 * (k & 3))) & 0xffu;
}
__host__ __device__ __forceinline__ void get_scale_min_k4(int j, const uint32_t (&s)[3], uint32_t* sc,
                                                 uint32_t* m) {
  if (j < 4) {
    *sc = scale_byte(s, j) & 63u;
    *m = scale_byte(s, j + 4) & 63u;
  } else {
    *sc = (scale_byte(s, j + 4) & 0xfu) | ((scale_byte(s, j - 4) >> 6) << 4);
    *m = (scale_byte(s, j + 4) >> 4) | ((scale_byte(s, j) >> 6) << 4);
  }
}

// ---- dequantization of one unit of 32 elements -------------------------------------------------
//
// row: the weight row (its first byte); u: the unit; cols: the row's length (only the float
// types' partial last unit looks at it). kVec (float types): the row is 16-byte aligned and
// cols % 32 == 0, so the unit is read with 128-bit loads. Alignment of the quantized blocks: the
// row starts 16-byte aligned (checked on the host) and row_bytes is a multiple of the block
// bytes, so a block is aligned to gcd(16, block bytes): Q4_1 4, Q5_1 8, Q4_K / Q5_K 16, the
// others (Q8_0 34, Q4_0 18, Q5_0 22, Q6_K 210) only 2.

template <GgmlType T, bool kVec>
struct Dequant;

template <bool kVec>
struct Dequant<GgmlType::kF32, kVec> {
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t cols,
                                              float (&w)[32]) {
    const float* r = reinterpret_cast<const float*>(row);
    if constexpr (kVec) {
SPECDEC_UNROLL
      for (int i = 0; i < 8; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(r + u * 32 + 4 * i);
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
      }
    } else {
SPECDEC_UNROLL
      for (int j = 0; j < 32; ++j) {
        const int64_t c = u * 32 + j;
        w[j] = c < cols ? r[c] : 0.0f;
      }
    }
  }
};

template <GgmlType T, bool kVec>
struct Dequant16 {  // F16 / BF16
  static __host__ __device__ __forceinline__ float cvt(uint32_t h) {
    if constexpr (T == GgmlType::kF16) {
      return h2f(h);
    } else {
      return bf2f(h);
    }
  }
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t cols,
                                              float (&w)[32]) {
    if constexpr (kVec) {
      uint32_t q[16];
SPECDEC_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint4 v = ld128(row + u * 64 + 16 * i);
        q[4 * i] = v.x;
        q[4 * i + 1] = v.y;
        q[4 * i + 2] = v.z;
        q[4 * i + 3] = v.w;
      }
SPECDEC_UNROLL
      for (int j = 0; j < 16; ++j) {
        w[2 * j] = cvt(q[j]);
        w[2 * j + 1] = cvt(q[j] >> 16);
      }
    } else {
SPECDEC_UNROLL
      for (int j = 0; j < 32; ++j) {
        const int64_t c = u * 32 + j;
        w[j] = c < cols ? cvt(ld16(row + 2 * c)) : 0.0f;
      }
    }
  }
};
template <bool kVec>
struct Dequant<GgmlType::kF16, kVec> : Dequant16<GgmlType::kF16, kVec> {};
template <bool kVec>
struct Dequant<GgmlType::kBF16, kVec> : Dequant16<GgmlType::kBF16, kVec> {};

template <bool kVec>
struct Dequant<GgmlType::kQ8_0, kVec> {  // 34 bytes: d, qs[32] (int8)
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + u * 34;
    const float d = h2f(ld16(b));
    uint32_t q[8];
SPECDEC_UNROLL
    for (int i = 0; i < 8; ++i) q[i] = ld32_a2(b + 2 + 4 * i);
SPECDEC_UNROLL
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(static_cast<int8_t>(byte_of(q, j)));
      w[j] = fmul_rn(d, static_cast<float>(v));
    }
  }
};

template <bool kVec>
struct Dequant<GgmlType::kQ4_0, kVec> {  // 18 bytes: d, qs[16]
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + u * 18;
    const float d = h2f(ld16(b));
    uint32_t q[4];
SPECDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = ld32_a2(b + 2 + 4 * i);
SPECDEC_UNROLL
    for (int j = 0; j < 16; ++j) {
      const int v = static_cast<int>(byte_of(q, j));
      w[j] = fmul_rn(d, static_cast<float>((v & 0xf) - 8));
      w[j + 16] = fmul_rn(d, static_cast<float>((v >> 4) - 8));
    }
  }
};

template <bool kVec>
struct Dequant<GgmlType::kQ4_1, kVec> {  // 20 bytes: d, m, qs[16]
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + u * 20;
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    uint32_t q[4];
SPECDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = ld32(b + 4 + 4 * i);
SPECDEC_UNROLL
    for (int j = 0; j < 16; ++j) {
      const uint32_t v = byte_of(q, j);
      w[j] = mul_add_rn(d, static_cast<float>(v & 0xfu), m);
      w[j + 16] = mul_add_rn(d, static_cast<float>(v >> 4), m);
    }
  }
};

template <bool kVec>
struct Dequant<GgmlType::kQ5_0, kVec> {  // 22 bytes: d, qh[4], qs[16]
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + u * 22;
    const float d = h2f(ld16(b));
    const uint32_t qh = ld32_a2(b + 2);
    uint32_t q[4];
SPECDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = ld32_a2(b + 6 + 4 * i);
SPECDEC_UNROLL
    for (int j = 0; j < 16; ++j) {
      const uint32_t v = byte_of(q, j);
      const int lo = static_cast<int>((v & 0xfu) | (((qh >> j) & 1u) << 4));
      const int hi = static_cast<int>((v >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      w[j] = fmul_rn(d, static_cast<float>(lo - 16));
      w[j + 16] = fmul_rn(d, static_cast<float>(hi - 16));
    }
  }
};

template <bool kVec>
struct Dequant<GgmlType::kQ5_1, kVec> {  // 24 bytes: d, m, qh[4], qs[16]
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + u * 24;
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    const uint32_t qh = ld32(b + 4);
    uint32_t q[4];
SPECDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = ld32(b + 8 + 4 * i);
SPECDEC_UNROLL
    for (int j = 0; j < 16; ++j) {
      const uint32_t v = byte_of(q, j);
      const uint32_t lo = (v & 0xfu) | (((qh >> j) & 1u) << 4);
      const uint32_t hi = (v >> 4) | (((qh >> (j + 16)) & 1u) << 4);
      w[j] = mul_add_rn(d, static_cast<float>(lo), m);
      w[j + 16] = mul_add_rn(d, static_cast<float>(hi), m);
    }
  }
};

// Q4_K / Q5_K: 256-element super-blocks (144 / 176 bytes, 16-byte aligned):
//   d, dmin (f16) at 0, scales[12] at 4, [Q5_K: qh[32] at 16], qs[128] after.
// Unit u is sub-block s = u % 8 of super-block u / 8: its 32 codes are the low (s even) or high
// (s odd) nibbles of qs[32 (s / 2) .. + 32) [plus bit s of qh[l] as bit 4].
template <GgmlType T>
struct DequantK45 {
  static constexpr int kBytes = T == GgmlType::kQ4_K ? 144 : 176;
  static constexpr int kQs = T == GgmlType::kQ4_K ? 16 : 48;
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + (u >> 3) * kBytes;
    const int s = static_cast<int>(u & 7);
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), dmin = h2f(dm >> 16);
    const uint32_t sw[3] = {ld32(b + 4), ld32(b + 8), ld32(b + 12)};
    uint32_t sc, mn;
    get_scale_min_k4(s, sw, &sc, &mn);
    const float dw = fmul_rn(d, static_cast<float>(sc));
    const float mw = -fmul_rn(dmin, static_cast<float>(mn));
    uint32_t q[8];
    put4(q, 0, ld128(b + kQs + 32 * (s >> 1)));
    put4(q, 4, ld128(b + kQs + 32 * (s >> 1) + 16));
    const int shift = (s & 1) * 4;
    if constexpr (T == GgmlType::kQ4_K) {
SPECDEC_UNROLL
      for (int l = 0; l < 32; ++l) {
        const uint32_t code = (byte_of(q, l) >> shift) & 0xfu;
        w[l] = mul_add_rn(dw, static_cast<float>(code), mw);
      }
    } else {
      uint32_t h[8];
      put4(h, 0, ld128(b + 16));
      put4(h, 4, ld128(b + 32));
SPECDEC_UNROLL
      for (int l = 0; l < 32; ++l) {
        const uint32_t code = ((byte_of(q, l) >> shift) & 0xfu) | (((byte_of(h, l) >> s) & 1u) << 4);
        w[l] = mul_add_rn(dw, static_cast<float>(code), mw);
      }
    }
  }
};
template <bool kVec>
struct Dequant<GgmlType::kQ4_K, kVec> : DequantK45<GgmlType::kQ4_K> {};
template <bool kVec>
struct Dequant<GgmlType::kQ5_K, kVec> : DequantK45<GgmlType::kQ5_K> {};

// Q6_K: 210 bytes (2-byte aligned): ql[128] at 0, qh[64] at 128, scales[16] (int8) at 192,
// d (f16) at 208. Super-block element e = 128 h + 32 g + l (h: half, g: 0..3, l: 0..31):
//   low 4 bits: ql[64 h + 32 (g & 1) + l], low nibble for g < 2, high nibble for g >= 2;
//   high 2 bits: (qh[32 h + l] >> 2 g) & 3; scale: scales[e / 16]; value d * scale * (q - 32).
// Unit v = u % 8 of super-block u / 8 covers e = 32 v .. 32 v + 31: h = v / 4, g = v % 4, l = j,
// scales 2 v (j < 16) and 2 v + 1.
template <bool kVec>
struct Dequant<GgmlType::kQ6_K, kVec> {
  static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, int64_t,
                                              float (&w)[32]) {
    const uint8_t* b = row + (u >> 3) * 210;
    const int v = static_cast<int>(u & 7);
    const int h = v >> 2, g = v & 3;
    uint32_t ql[8], qh[8];
SPECDEC_UNROLL
    for (int i = 0; i < 8; ++i) {
      ql[i] = ld32_a2(b + 64 * h + 32 * (g & 1) + 4 * i);
      qh[i] = ld32_a2(b + 128 + 32 * h + 4 * i);
    }
    const uint32_t sc2 = ld16(b + 192 + 2 * v);
    const float d = h2f(ld16(b + 208));
    const float dw0 = fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc2 & 0xffu)));
    const float dw1 = fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc2 >> 8)));
    const int low_shift = g < 2 ? 0 : 4;
    const int high_shift = 2 * g;
SPECDEC_UNROLL
    for (int j = 0; j < 32; ++j) {
      const int lo = static_cast<int>((byte_of(ql, j) >> low_shift) & 0xfu);
      const int hi = static_cast<int>((byte_of(qh, j) >> high_shift) & 3u);
      const int code = lo | (hi << 4);
      w[j] = fmul_rn(j < 16 ? dw0 : dw1, static_cast<float>(code - 32));
    }
  }
};

// ---- matmul ------------------------------------------------------------------------------------

constexpr int kWarps = 8;                    // rows per thread block (one per warp)
constexpr int kThreads = kWarps * 32;
constexpr int kChunkUnits = 32;              // units per chunk: one per lane
constexpr int kChunkCols = kChunkUnits * 32;  // 1024
constexpr int kUnitStride = 36;  // floats per unit in shared memory: 32 + 4 of padding, so that
                                 // the lanes' float4 reads of 8 consecutive units hit 8 distinct
                                 // groups of 4 banks (no conflicts)
constexpr int kTokenStride = kChunkUnits * kUnitStride;  // 1152 floats per token
constexpr int kMaxTile = 8;

// Thread block b: rows kWarps * (b / n_tiles) .. + kWarps, tokens t_base + NT * (b % n_tiles) ..
// + NT (clipped to n_total). x: [n_total, cols], y: [n_total, rows].
template <GgmlType T, bool kVec, int NT>
__global__ void __launch_bounds__(kThreads)
    matmul_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t cols, int64_t row_bytes,
                  const float* __restrict__ x, int64_t n_total, int64_t t_base, int n_tiles,
                  float* __restrict__ y) {
  __shared__ __align__(16) float xs[NT * kTokenStride];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t row_block = static_cast<int64_t>(blockIdx.x) / n_tiles;
  const int tile = static_cast<int>(static_cast<int64_t>(blockIdx.x) % n_tiles);
  const int64_t t0 = t_base + static_cast<int64_t>(tile) * NT;
  const int64_t left = n_total - t0;
  const int nt = left < NT ? static_cast<int>(left) : NT;  // >= 1 by the launch
  const int64_t row = row_block * kWarps + warp;
  const bool active = row < rows;  // uniform over the warp
  const uint8_t* wrow = w + (active ? row : 0) * row_bytes;
  const int64_t units = (cols + 31) / 32;

  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  for (int64_t c0 = 0; c0 < units; c0 += kChunkUnits) {
    __syncthreads();  // every warp is done reading the previous chunk
    const int64_t col0 = c0 * 32;
    for (int i = static_cast<int>(threadIdx.x); i < NT * kChunkCols; i += kThreads) {
      const int t = i / kChunkCols;
      const int c = i % kChunkCols;
      const int64_t col = col0 + c;
      float v = 0.0f;
      if (t < nt && col < cols) v = x[(t0 + t) * cols + col];
      xs[t * kTokenStride + (c / 32) * kUnitStride + (c % 32)] = v;
    }
    __syncthreads();
    const int64_t u = c0 + lane;
    if (active && u < units) {
      float wv[32];
      Dequant<T, kVec>::unit(wrow, u, cols, wv);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(xs + t * kTokenStride + lane * kUnitStride);
        float a = acc[t];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float4 xv = xp[k];
          a = fmaf(wv[4 * k], xv.x, a);
          a = fmaf(wv[4 * k + 1], xv.y, a);
          a = fmaf(wv[4 * k + 2], xv.z, a);
          a = fmaf(wv[4 * k + 3], xv.w, a);
        }
        acc[t] = a;
      }
    }
  }

#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = acc[t];
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0 && active && t < nt) y[(t0 + t) * rows + row] = v;
  }
}

template <GgmlType T, bool kVec, int NT>
void launch_matmul(const DeviceMatrix& w, const float* x, int64_t n, int64_t t_base,
                   int64_t n_tiles, float* y) {
  const int64_t row_blocks = (w.rows + kWarps - 1) / kWarps;
  const int64_t blocks = row_blocks * n_tiles;
  if (blocks > 0x7fffffffLL || n_tiles > 0x7fffffffLL) {
    throw Error("cuda::matmul: too many thread blocks (" + std::to_string(blocks) + ")");
  }
  matmul_kernel<T, kVec, NT><<<static_cast<unsigned>(blocks), kThreads, 0, detail::stream()>>>(
      static_cast<const uint8_t*>(w.data), w.rows, w.cols, w.row_bytes, x, n, t_base,
      static_cast<int>(n_tiles), y);
  CUDA_CHECK_LAUNCH("matmul_kernel");
}

template <GgmlType T, bool kVec>
void matmul_typed(const DeviceMatrix& w, const float* x, int64_t n, float* y) {
  const int64_t full = n / kMaxTile;
  if (full > 0) launch_matmul<T, kVec, kMaxTile>(w, x, n, 0, full, y);
  const int64_t rest = n - full * kMaxTile;
  const int64_t t_base = full * kMaxTile;
  if (rest == 0) return;
  if (rest == 1) {
    launch_matmul<T, kVec, 1>(w, x, n, t_base, 1, y);
  } else if (rest == 2) {
    launch_matmul<T, kVec, 2>(w, x, n, t_base, 1, y);
  } else if (rest <= 4) {
    launch_matmul<T, kVec, 4>(w, x, n, t_base, 1, y);
  } else {
    launch_matmul<T, kVec, 8>(w, x, n, t_base, 1, y);
  }
}

// ---- get_rows ------------------------------------------------------------------------------------

// Thread i of the grid's x dimension dequantizes unit i of row ids[r] into out[r].
template <GgmlType T, bool kVec>
__global__ void __launch_bounds__(128)
    get_rows_kernel(const uint8_t* __restrict__ table, int64_t rows, int64_t cols,
                    int64_t row_bytes, const int32_t* __restrict__ ids, int64_t n,
                    float* __restrict__ out) {
  const int64_t units = (cols + 31) / 32;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    const int64_t id = ids[r];
    float* o = out + r * cols + u * 32;
    const int64_t valid = cols - u * 32 < 32 ? cols - u * 32 : 32;
    if (id < 0 || id >= rows) {  // out of range: zeros (never a read outside the table)
      for (int j = 0; j < valid; ++j) o[j] = 0.0f;
      continue;
    }
    float wv[32];
    Dequant<T, kVec>::unit(table + id * row_bytes, u, cols, wv);
    if (valid == 32) {
#pragma unroll
      for (int j = 0; j < 32; ++j) o[j] = wv[j];
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (j < valid) o[j] = wv[j];
      }
    }
  }
}

template <GgmlType T, bool kVec>
void get_rows_typed(const DeviceMatrix& t, const int32_t* ids, int64_t n, float* out) {
  const int64_t units = (t.cols + 31) / 32;
  const dim3 grid(static_cast<unsigned>((units + 127) / 128),
                  static_cast<unsigned>(n < 65535 ? n : 65535));
  get_rows_kernel<T, kVec><<<grid, 128, 0, detail::stream()>>>(
      static_cast<const uint8_t*>(t.data), t.rows, t.cols, t.row_bytes, ids, n, out);
  CUDA_CHECK_LAUNCH("get_rows_kernel");
}

// ---- dispatch ------------------------------------------------------------------------------------

bool is_float_type(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// Checks the matrix; returns whether the float types may take the 128-bit path.
bool check_matrix(const DeviceMatrix& w, const char* op) {
  const std::string name = std::string("cuda::") + op;
  if (!matmul_supported(w.type)) {
    throw Error(name + ": weight type " + ggml_type_traits(w.type).name + " not supported");
  }
  const GgmlTypeTraits& tr = ggml_type_traits(w.type);
  if (w.rows < 0 || w.cols <= 0 || w.cols % tr.block_size != 0) {
    throw Error(name + ": bad shape [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                "] for " + tr.name);
  }
  if (w.row_bytes != ggml_row_bytes(w.type, w.cols)) {
    throw Error(name + ": row_bytes " + std::to_string(w.row_bytes) + " != " +
                std::to_string(ggml_row_bytes(w.type, w.cols)) + " for " + tr.name);
  }
  const auto addr = reinterpret_cast<uintptr_t>(w.data);
  if (w.data == nullptr || addr % 16 != 0) {
    throw Error(name + ": weight data must be a 16-byte aligned device pointer");
  }
  return is_float_type(w.type) && w.cols % 32 == 0 && w.row_bytes % 16 == 0;
}

}  // namespace

bool matmul_supported(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void set_matmul_legacy(bool legacy) {
  legacy_flag().store(legacy);
}
bool matmul_legacy() {
  return legacy_flag().load();
}

void matmul(const DeviceMatrix& w, const float* x, int64_t n, float* y) {
  if (n < 0) throw Error("cuda::matmul: negative n");
  if (n == 0 || w.rows == 0) return;
  const bool vec = check_matrix(w, "matmul");
  const bool legacy = legacy_flag().load(std::memory_order_relaxed);
  if (!legacy && detail::q32_matmul_supported(w.type)) return detail::q32_matmul(w, x, n, y);
  switch (w.type) {
    case GgmlType::kF32:
      return vec ? matmul_typed<GgmlType::kF32, true>(w, x, n, y)
                 : matmul_typed<GgmlType::kF32, false>(w, x, n, y);
    case GgmlType::kF16:
      return vec ? matmul_typed<GgmlType::kF16, true>(w, x, n, y)
                 : matmul_typed<GgmlType::kF16, false>(w, x, n, y);
    case GgmlType::kBF16:
      return vec ? matmul_typed<GgmlType::kBF16, true>(w, x, n, y)
                 : matmul_typed<GgmlType::kBF16, false>(w, x, n, y);
    case GgmlType::kQ8_0:
      return matmul_typed<GgmlType::kQ8_0, true>(w, x, n, y);
    case GgmlType::kQ4_0:
      return matmul_typed<GgmlType::kQ4_0, true>(w, x, n, y);
    case GgmlType::kQ4_1:
      return matmul_typed<GgmlType::kQ4_1, true>(w, x, n, y);
    case GgmlType::kQ5_0:
      return matmul_typed<GgmlType::kQ5_0, true>(w, x, n, y);
    case GgmlType::kQ5_1:
      return matmul_typed<GgmlType::kQ5_1, true>(w, x, n, y);
    case GgmlType::kQ4_K:
      return matmul_typed<GgmlType::kQ4_K, true>(w, x, n, y);
    case GgmlType::kQ5_K:
      return matmul_typed<GgmlType::kQ5_K, true>(w, x, n, y);
    case GgmlType::kQ6_K:
      return matmul_typed<GgmlType::kQ6_K, true>(w, x, n, y);
    default:
      throw Error("cuda::matmul: unsupported type");
  }
}

void get_rows(const DeviceMatrix& table, const int32_t* ids, int64_t n, float* out) {
  if (n < 0) throw Error("cuda::get_rows: negative n");
  if (n == 0) return;
  const bool vec = check_matrix(table, "get_rows");
  switch (table.type) {
    case GgmlType::kF32:
      return vec ? get_rows_typed<GgmlType::kF32, true>(table, ids, n, out)
                 : get_rows_typed<GgmlType::kF32, false>(table, ids, n, out);
    case GgmlType::kF16:
      return vec ? get_rows_typed<GgmlType::kF16, true>(table, ids, n, out)
                 : get_rows_typed<GgmlType::kF16, false>(table, ids, n, out);
    case GgmlType::kBF16:
      return vec ? get_rows_typed<GgmlType::kBF16, true>(table, ids, n, out)
                 : get_rows_typed<GgmlType::kBF16, false>(table, ids, n, out);
    case GgmlType::kQ8_0:
      return get_rows_typed<GgmlType::kQ8_0, true>(table, ids, n, out);
    case GgmlType::kQ4_0:
      return get_rows_typed<GgmlType::kQ4_0, true>(table, ids, n, out);
    case GgmlType::kQ4_1:
      return get_rows_typed<GgmlType::kQ4_1, true>(table, ids, n, out);
    case GgmlType::kQ5_0:
      return get_rows_typed<GgmlType::kQ5_0, true>(table, ids, n, out);
    case GgmlType::kQ5_1:
      return get_rows_typed<GgmlType::kQ5_1, true>(table, ids, n, out);
    case GgmlType::kQ4_K:
      return get_rows_typed<GgmlType::kQ4_K, true>(table, ids, n, out);
    case GgmlType::kQ5_K:
      return get_rows_typed<GgmlType::kQ5_K, true>(table, ids, n, out);
    case GgmlType::kQ6_K:
      return get_rows_typed<GgmlType::kQ6_K, true>(table, ids, n, out);
    default:
      throw Error("cuda::get_rows: unsupported type");
  }
}

}  // namespace specdec::cuda
