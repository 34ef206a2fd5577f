// AVX-512 (F/BW/VL/DQ/VNNI) matmul for quantized weights, and the AVX-512 entry point.
//
// Activations are quantized once per call (see quant_kernels.h for the exact arithmetic, which
// this file reproduces bit for bit). Weight codes are unpacked to unsigned bytes and multiplied
// with vpdpbusd (u8 x s8 -> s32). Two kernels, both exact in the integer part and identical in
// the float part, so a row's result does not depend on n:
//
//  * row kernel (n == 1, decode): 8 weight rows at a time, 64 codes of each per step, dotted with
//    the activation row; a shuffle tree turns the 8 x 16 partial sums into one vector whose lanes
//    are (weight row, sub-block parity) - the "r-layout":
//        lane m = 4 L + j  <->  row j + 4 (L >> 1), parity L & 1          (j, L in 0..3)
//    and the float epilogue runs once per 8 rows.
//  * tile kernel (n >= 2, multi-token and prefill): activations re-laid out in tiles of 8 rows,
//    lane 2 i + h = (activation row i, sub-block parity h); each weight row is unpacked once into
//    a small scratch with codes of the A/B sub-blocks interleaved per 4 bytes, and a 4+4 byte
//    broadcast of them feeds vpdpbusd against 8 rows x 2 sub-blocks of activations at once.
//
// GCC 12 surrounds every _mm512_dpbusd_epi32 with two register copies, so vpdpbusd is issued
// through inline asm.
// GCC 12 warns about the intentionally undefined vectors inside its own AVX-512 intrinsics
// (_mm512_undefined_*) once they are inlined; the warning is a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {
namespace detail {

void matmul_float_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y,
                         ThreadPool* pool);

namespace {

inline __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
  return acc;
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// ---------------------------------------------------------------------------------------------
// Activation quantization (natural layout), bit-identical to quantize_activations_ref.

void quantize_row(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    const float amax = _mm512_reduce_max_ps(m);
    const bool nonzero = amax >= kMinActivationAmax;
    const float scale = nonzero ? amax / 127.0f : 0.0f;
    const float inv = nonzero ? 1.0f / scale : 0.0f;
    d[b] = scale;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vinv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
    s16[2 * b] = _mm512_reduce_add_epi32(q0);
    s16[2 * b + 1] = _mm512_reduce_add_epi32(q1);
  }
}

// ---------------------------------------------------------------------------------------------
// Weight types. unpack() returns the 64 codes of elements [64 s, 64 s + 64) of a row in natural
// order (for the 32-element types: block 2s in bytes 0..31, block 2s+1 in bytes 32..63; when the
// row has an odd number of blocks the last step repeats block 2s, multiplied by zero activations
// and zero scales). scales() writes dw / mw of sub-blocks [0, nsub) in natural order.

inline __m512i nibbles_2x16(const uint8_t* qa, const uint8_t* qb) {
  const __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qa))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)), 1);
  __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  z = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));  // [lo A, lo B, hi A, hi B]
  return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

inline __m512i nibbles_32(const uint8_t* q) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));  // [lo 32, hi 32]
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// dw (and mw) of 32-element blocks whose first 4 bytes are f16 d (and f16 m).
template <bool kMin>
void scales_from_block_heads(const uint8_t* row, int64_t block_bytes, int64_t nsub, float* dw,
                             float* mw) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(block_bytes)));
  for (int64_t b = 0; b < nsub; b += 16) {
    const int64_t left = std::min<int64_t>(16, nsub - b);
    const __mmask16 k = static_cast<__mmask16>((1u << left) - 1);
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx,
                                                  row + b * block_bytes, 1);
    _mm512_mask_storeu_ps(dw + b, k, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    if (kMin) {
      _mm512_mask_storeu_ps(mw + b, k,
                            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
  }
}

// The 8 scales and 8 mins of a Q4_K / Q5_K super-block, as bytes (ggml's get_scale_min_k4 for
// all j at once).
inline void k4_scales_mins(const uint8_t* scales, uint64_t* sc, uint64_t* mn) {
  constexpr uint32_t kMask1 = 0x3f3f3f3f, kMask2 = 0x0f0f0f0f, kMask3 = 0x03030303;
  const uint32_t u0 = load_u32(scales), u1 = load_u32(scales + 4), u2 = load_u32(scales + 8);
  const uint32_t s_lo = u0 & kMask1;
  const uint32_t s_hi = (u2 & kMask2) | (((u0 >> 6) & kMask3) << 4);
  const uint32_t m_lo = u1 & kMask1;
  const uint32_t m_hi = ((u2 >> 4) & kMask2) | (((u1 >> 6) & kMask3) << 4);
  *sc = s_lo | (static_cast<uint64_t>(s_hi) << 32);
  *mn = m_lo | (static_cast<uint64_t>(m_hi) << 32);
}

template <class Block>
void k4_scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
  for (int64_t sb = 0; sb < nsub / 8; ++sb) {
    const auto& blk = *reinterpret_cast<const Block*>(row + sb * static_cast<int64_t>(sizeof(Block)));
    uint64_t sc, mn;
    k4_scales_mins(blk.scales, &sc, &mn);
    const __m256 d = _mm256_set1_ps(fp16_to_fp32(blk.d));
    const __m256 neg_dmin = _mm256_set1_ps(-fp16_to_fp32(blk.dmin));
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
    _mm256_storeu_ps(dw + 8 * sb, _mm256_mul_ps(d, scf));
    _mm256_storeu_ps(mw + 8 * sb, _mm256_mul_ps(neg_dmin, mnf));
  }
}

template <GgmlType T>
struct Weights;
// Each specialization: kSub, kMin, kOffset; kHeadBytes = block bytes when every 32-element block
// starts with f16 d (and f16 m) - then the r-layout scales are gathered straight from the
// blocks - or 0; unpack<kHasB>(row, s); scales(row, nsub, dw, mw) in natural order.

template <>
struct Weights<GgmlType::kQ4_0> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 8;
  static constexpr int64_t kHeadBytes = 18;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * 18;
    return nibbles_2x16(a + 2, (kHasB ? a + 18 : a) + 2);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<false>(row, 18, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ4_1> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static constexpr int64_t kHeadBytes = 20;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * 20;
    return nibbles_2x16(a + 4, (kHasB ? a + 20 : a) + 4);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<true>(row, 20, nsub, dw, mw);
  }
};

template <int kBlockBytes, int kQhOffset, bool kHasB>
inline __m512i unpack_q5(const uint8_t* row, int64_t s) {
  const auto* a = row + 2 * s * kBlockBytes;
  const auto* b = kHasB ? a + kBlockBytes : a;
  const __m512i z = nibbles_2x16(a + kQhOffset + 4, b + kQhOffset + 4);
  const uint64_t bits = load_u32(a + kQhOffset) | (static_cast<uint64_t>(load_u32(b + kQhOffset)) << 32);
  return _mm512_mask_add_epi8(z, _cvtu64_mask64(bits), z, _mm512_set1_epi8(16));
}

template <>
struct Weights<GgmlType::kQ5_0> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 16;
  static constexpr int64_t kHeadBytes = 22;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    return unpack_q5<22, 2, kHasB>(row, s);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<false>(row, 22, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_1> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static constexpr int64_t kHeadBytes = 24;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    return unpack_q5<24, 4, kHasB>(row, s);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<true>(row, 24, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ8_0> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 128;
  static constexpr int64_t kHeadBytes = 34;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * 34;
    const auto* b = kHasB ? a + 34 : a;
    const __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<false>(row, 34, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ4_K> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static constexpr int64_t kHeadBytes = 0;
  template <bool>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    return nibbles_32(row + (s / 4) * 144 + 16 + 32 * (s % 4));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    k4_scales<BlockQ4_K>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_K> {
  static constexpr int kSub = 32;
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static constexpr int64_t kHeadBytes = 0;
  template <bool>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const uint8_t* blk = row + (s / 4) * 176;
    const int c = static_cast<int>(s % 4);
    const __m512i z = nibbles_32(blk + 48 + 32 * c);
    const __m256i h = _mm256_srl_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)), _mm_cvtsi32_si128(2 * c));
    const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
    const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8(1), _mm256_set1_epi8(2), 1);
    return _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(hz, sel), z, _mm512_set1_epi8(16));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    k4_scales<BlockQ5_K>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ6_K> {
  static constexpr int kSub = 16;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 32;
  // Step s = elements 64 s' .. of super-block s / 4 (s' = s % 4): half h = s' / 2; groups
  // 2 (s' & 1) and 2 (s' & 1) + 1, whose low bits are the low (s' even) or high (s' odd) nibbles
  // of ql[64 h .. 64 h + 64) and whose high bits are qh[32 h + l] >> 2 g.
  static constexpr int64_t kHeadBytes = 0;
  template <bool>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const uint8_t* blk = row + (s / 4) * 210;
    const int sp = static_cast<int>(s % 4);
    const int h = sp / 2;
    const __m128i shift = _mm_cvtsi32_si128(4 * (sp & 1));
    const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    const __m512i low = _mm512_and_si512(_mm512_srl_epi16(ql, shift), _mm512_set1_epi8(0x0f));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    hz = _mm512_and_si512(_mm512_srl_epi16(hz, shift), _mm512_set1_epi8(0x03));
    return _mm512_or_si512(low, _mm512_slli_epi16(hz, 4));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float*) {
    for (int64_t sb = 0; sb < nsub / 16; ++sb) {
      const auto& blk = *reinterpret_cast<const BlockQ6_K*>(row + sb * 210);
      const __m512 sc = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales))));
      _mm512_storeu_ps(dw + 16 * sb, _mm512_mul_ps(_mm512_set1_ps(fp16_to_fp32(blk.d)), sc));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Activations of one call in the layouts the kernels read.

struct Activations {
  int64_t n = 0;
  int64_t n_pad = 0;     // n rounded up to the tile height (8)
  int64_t cols = 0;
  int64_t cols_pad = 0;  // cols rounded up to 64
  int64_t units = 0;     // cols_pad / unit, unit = 2 sub elements (an A and a B sub-block)
  int64_t tiles = 0;     // n_pad / 8
  int8_t* q = nullptr;        // [n_pad, cols_pad] natural
  float* d = nullptr;         // [n_pad, cols_pad / 32]
  int32_t* s16 = nullptr;     // [n_pad, cols_pad / 16]
  // n == 1: per unit, 16 lanes in r-layout. n >= 2: per (tile, unit), lanes 2 i + h.
  float* dx = nullptr;        // [tiles or 1, units, 16]
  float* ex = nullptr;        // [tiles or 1, units, 16] sx (min types) or int32 corrections
  int8_t* qt = nullptr;       // n >= 2: [tiles, units, sub / 4, 64] tile layout of q
};

constexpr int64_t kTileRows = 8;

// Per-lane quantities of one (activation row, element offset e of a sub-block).
template <int kSub, bool kMin, int kOffset>
inline void lane_values(const Activations& a, int64_t row, int64_t e, float* dx, float* ex) {
  const int64_t nb32 = a.cols_pad / 32;
  const float d = a.d[row * nb32 + e / 32];
  const int32_t* s16 = a.s16 + row * (a.cols_pad / 16) + e / 16;
  *dx = d;
  if (kMin) {
    *ex = static_cast<float>(s16[0] + s16[1]) * d;
  } else {
    const int32_t sum = kSub == 32 ? s16[0] + s16[1] : s16[0];
    const int32_t corr = kOffset * sum;
    std::memcpy(ex, &corr, 4);
  }
}

// Quantizes rows [i0, i1) (natural layout, padding rows zeroed).
void quantize_rows(const float* x, Activations& a, int64_t i0, int64_t i1) {
  const int64_t nb32 = a.cols_pad / 32;
  for (int64_t i = i0; i < i1; ++i) {
    int8_t* q = a.q + i * a.cols_pad;
    float* d = a.d + i * nb32;
    int32_t* s16 = a.s16 + i * (a.cols_pad / 16);
    if (i < a.n) {
      quantize_row(x + i * a.cols, a.cols, q, d, s16);
    } else {
      std::memset(q, 0, static_cast<size_t>(a.cols));
      std::memset(d, 0, static_cast<size_t>(a.cols / 32) * 4);
      std::memset(s16, 0, static_cast<size_t>(a.cols / 16) * 4);
    }
    std::memset(q + a.cols, 0, static_cast<size_t>(a.cols_pad - a.cols));
    std::memset(d + a.cols / 32, 0, static_cast<size_t>(nb32 - a.cols / 32) * 4);
    std::memset(s16 + a.cols / 16, 0, static_cast<size_t>(a.cols_pad / 16 - a.cols / 16) * 4);
  }
}

// r-layout lane m -> (row, parity).
inline int r_row(int m) { return (m & 3) + 4 * ((m >> 3) & 1); }
inline int r_parity(int m) { return (m >> 2) & 1; }

template <int kSub, bool kMin, int kOffset>
void build_row_layout(Activations& a) {
  const int64_t unit = 2 * kSub;
  for (int64_t u = 0; u < a.units; ++u) {
    for (int m = 0; m < 16; ++m) {
      lane_values<kSub, kMin, kOffset>(a, 0, u * unit + kSub * r_parity(m), &a.dx[u * 16 + m],
                                       &a.ex[u * 16 + m]);
    }
  }
}

template <int kSub, bool kMin, int kOffset>
void build_tiles(Activations& a, int64_t t0, int64_t t1) {
  constexpr int64_t kGroups = kSub / 4;
  const int64_t unit = 2 * kSub;
  // lane 2 i + h: 4 bytes of row i at element offset h * sub (+ unit base + 4 g)
  alignas(64) int32_t offs[16];
  for (int l = 0; l < 16; ++l) offs[l] = static_cast<int32_t>((l >> 1) * a.cols_pad + (l & 1) * kSub);
  const __m512i idx = _mm512_load_si512(offs);
  for (int64_t t = t0; t < t1; ++t) {
    const int8_t* base = a.q + t * kTileRows * a.cols_pad;
    for (int64_t u = 0; u < a.units; ++u) {
      int8_t* dst = a.qt + (t * a.units + u) * kGroups * 64;
      for (int64_t g = 0; g < kGroups; ++g) {
        const __m512i v = _mm512_i32gather_epi32(idx, base + u * unit + 4 * g, 1);
        _mm512_storeu_si512(dst + 64 * g, v);
      }
      float* dx = a.dx + (t * a.units + u) * 16;
      float* ex = a.ex + (t * a.units + u) * 16;
      for (int l = 0; l < 16; ++l) {
        lane_values<kSub, kMin, kOffset>(a, t * kTileRows + (l >> 1), u * unit + kSub * (l & 1),
                                         &dx[l], &ex[l]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row kernel (n == 1).

// 4 vectors whose 128-bit lanes hold 4 partial sums each -> lane 4 L + j = sum of lane L of v[j].
inline __m512i transpose_sum4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// Rows j and j + 4, 64 codes each ([A 32 | B 32]) -> 128-bit lanes [j A, j B, j+4 A, j+4 B].
inline __m512i pair_rows(__m512i lo, __m512i hi) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
}

template <bool kMin>
inline __m512 epilogue(__m512 acc, __m512i isum, const float* dx, const float* ex, __m512 dw,
                       __m512 mw) {
  if (!kMin) isum = _mm512_sub_epi32(isum, _mm512_loadu_si512(ex));
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_loadu_ps(dx));
  acc = _mm512_fmadd_ps(t, dw, acc);
  if (kMin) acc = _mm512_fmadd_ps(mw, _mm512_loadu_ps(ex), acc);
  return acc;
}

// 8 consecutive rows (stride rb, starting at g) against the activation row; y[0..valid).
// dwn / mwn: [8, nsub_pad] natural scales of these rows (used when W::kHeadBytes == 0).
template <GgmlType T>
void row_group(const uint8_t* g, int64_t rb, const Activations& a, int64_t nsub_pad,
               const float* dwn, const float* mwn, const uint8_t* prefetch, int64_t pf_step,
               float* y, int64_t valid) {
  using W = Weights<T>;
  const int64_t steps = a.cols_pad / 64;
  const bool odd_blocks = W::kSub == 32 && (a.cols / 32) % 2 == 1;
  alignas(64) int32_t offs[16];
  for (int m = 0; m < 16; ++m) {
    offs[m] = W::kHeadBytes > 0
                  ? static_cast<int32_t>(r_row(m) * rb + r_parity(m) * W::kHeadBytes)
                  : static_cast<int32_t>(r_row(m) * nsub_pad + r_parity(m));
  }
  const __m512i sidx = _mm512_load_si512(offs);
  __m512 acc = _mm512_setzero_ps();
  auto step = [&](int64_t s, auto has_b) {
    constexpr bool kHasB = decltype(has_b)::value;
    if (prefetch != nullptr) {
      for (int64_t off = s * pf_step; off < (s + 1) * pf_step; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + off), _MM_HINT_T0);
      }
    }
    const __m512i xq = _mm512_loadu_si512(a.q + 64 * s);
    __m512i i[8];
    for (int p = 0; p < 8; ++p) {
      i[p] = dpbusd(_mm512_setzero_si512(), W::template unpack<kHasB>(g + p * rb, s), xq);
    }
    if constexpr (W::kSub == 32) {
      const __m512i r = transpose_sum4(pair_rows(i[0], i[4]), pair_rows(i[1], i[5]),
                                       pair_rows(i[2], i[6]), pair_rows(i[3], i[7]));
      __m512 dw, mw;
      if constexpr (W::kHeadBytes > 0) {
        // f16 d (and m) of sub-blocks 2s (+ 2s+1) of the 8 rows, straight from the blocks
        const auto k = static_cast<__mmask16>(kHasB ? 0xffff : 0x0f0f);
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, sidx,
                                                      g + 2 * s * W::kHeadBytes, 1);
        dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
        mw = W::kMin ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))) : dw;
      } else {
        const __m512i gidx = _mm512_add_epi32(sidx, _mm512_set1_epi32(static_cast<int>(2 * s)));
        dw = _mm512_i32gather_ps(gidx, dwn, 4);
        mw = W::kMin ? _mm512_i32gather_ps(gidx, mwn, 4) : dw;
      }
      acc = epilogue<W::kMin>(acc, r, a.dx + 16 * s, a.ex + 16 * s, dw, mw);
    } else {  // sub-blocks of 16: two units per step
      const __m512i lo = transpose_sum4(i[0], i[1], i[2], i[3]);
      const __m512i hi = transpose_sum4(i[4], i[5], i[6], i[7]);
      for (int half = 0; half < 2; ++half) {
        const int64_t u = 2 * s + half;
        const __m512i r = half == 0 ? _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0))
                                    : _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i gidx = _mm512_add_epi32(sidx, _mm512_set1_epi32(static_cast<int>(2 * u)));
        const __m512 dw = _mm512_i32gather_ps(gidx, dwn, 4);
        acc = epilogue<false>(acc, r, a.dx + 16 * u, a.ex + 16 * u, dw, dw);
      }
    }
  };
  const int64_t full_steps = odd_blocks ? steps - 1 : steps;
  for (int64_t s = 0; s < full_steps; ++s) step(s, std::true_type{});
  if (odd_blocks) step(steps - 1, std::false_type{});
  // y[row] = acc[row, A] + acc[row, B]: rows 0..3 in lanes 0..3, rows 4..7 in lanes 8..11.
  const __m512 sum = _mm512_add_ps(acc, _mm512_shuffle_f32x4(acc, acc, _MM_SHUFFLE(2, 3, 0, 1)));
  const auto mlo = static_cast<__mmask8>(valid >= 4 ? 0xf : (1u << valid) - 1);
  const auto mhi = static_cast<__mmask8>(valid <= 4 ? 0 : (1u << (valid - 4)) - 1);
  _mm_mask_storeu_ps(y, mlo, _mm512_castps512_ps128(sum));
  _mm_mask_storeu_ps(y + 4, mhi, _mm512_extractf32x4_ps(sum, 2));
}

template <GgmlType T>
void row_kernel(const WeightMatrix& w, const Activations& a, float* y, int64_t r0, int64_t r1) {
  using W = Weights<T>;
  const int64_t nsub = w.cols / W::kSub;
  const int64_t nsub_pad = a.units * 2;
  const int64_t rb = w.row_bytes;
  const int64_t steps = a.cols_pad / 64;
  // [8, rb] copy of a ragged last group, then [8, nsub_pad] dw and mw (K-quants)
  auto* mem = static_cast<uint8_t*>(thread_scratch(kScratchWeights).get(
      static_cast<size_t>(8 * rb + 64 + 16 * nsub_pad * 4)));
  uint8_t* tail = mem;
  auto* dwn = reinterpret_cast<float*>(mem + (8 * rb + 63) / 64 * 64);
  float* mwn = dwn + 8 * nsub_pad;
  const auto* base = static_cast<const uint8_t*>(w.data);
  // Prefetch the next group of 8 rows, spread over this group's steps.
  const int64_t pf_step = (8 * rb / steps + 63) / 64 * 64;
  for (int64_t g0 = r0; g0 < r1; g0 += 8) {
    const int64_t valid = std::min<int64_t>(8, r1 - g0);
    const uint8_t* g = base + g0 * rb;
    if (valid < 8) {  // copy the rows, repeating the last, so that the stride stays rb
      for (int64_t p = 0; p < 8; ++p) {
        std::memcpy(tail + p * rb, base + (g0 + std::min(p, valid - 1)) * rb, static_cast<size_t>(rb));
      }
      g = tail;
    }
    if constexpr (W::kHeadBytes == 0) {
      for (int p = 0; p < 8; ++p) {
        W::scales(g + p * rb, nsub, dwn + p * nsub_pad, mwn + p * nsub_pad);
        for (int64_t b = nsub; b < nsub_pad; ++b) dwn[p * nsub_pad + b] = mwn[p * nsub_pad + b] = 0.0f;
      }
    }
    const uint8_t* next = g0 + 16 <= r1 ? base + (g0 + 8) * rb : nullptr;
    row_group<T>(g, rb, a, nsub_pad, dwn, mwn, next, pf_step, y + g0, valid);
  }
}

// ---------------------------------------------------------------------------------------------
// Tile kernel (n >= 2).

// One group of P weight rows (already unpacked into `wq`, scales in dwn / mwn) against every
// activation tile.
template <GgmlType T, int P>
void tile_group(const Activations& a, const uint8_t* wq, const float* dwn, const float* mwn,
                int64_t nsub_pad, float* y, int64_t ldy, int64_t row0) {
  using W = Weights<T>;
  constexpr int kGroups = W::kSub / 4;
  const int64_t unit = 2 * W::kSub;
  for (int64_t t = 0; t < a.tiles; ++t) {
    __m512 acc[P];
    for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t u = 0; u < a.units; ++u) {
      const int8_t* xt = a.qt + (t * a.units + u) * kGroups * 64;
      __m512i xg[kGroups];
      for (int g = 0; g < kGroups; ++g) xg[g] = _mm512_loadu_si512(xt + 64 * g);
      const float* dx = a.dx + (t * a.units + u) * 16;
      const float* ex = a.ex + (t * a.units + u) * 16;
      // P independent vpdpbusd chains, interleaved so that their latency overlaps.
      __m512i isums[P];
      for (int p = 0; p < P; ++p) isums[p] = _mm512_setzero_si512();
      for (int g = 0; g < kGroups; ++g) {
        for (int p = 0; p < P; ++p) {
          int64_t pair;
          std::memcpy(&pair, wq + p * a.cols_pad + u * unit + 8 * g, 8);
          isums[p] = dpbusd(isums[p], _mm512_set1_epi64(pair), xg[g]);
        }
      }
      for (int p = 0; p < P; ++p) {
        const __m512i isum = isums[p];
        double dpair, mpair;
        std::memcpy(&dpair, dwn + p * nsub_pad + 2 * u, 8);
        const __m512 dw = _mm512_castpd_ps(_mm512_set1_pd(dpair));
        __m512 mw = dw;
        if (W::kMin) {
          std::memcpy(&mpair, mwn + p * nsub_pad + 2 * u, 8);
          mw = _mm512_castpd_ps(_mm512_set1_pd(mpair));
        }
        acc[p] = epilogue<W::kMin>(acc[p], isum, dx, ex, dw, mw);
      }
    }
    alignas(64) float out[P][16];
    for (int p = 0; p < P; ++p) _mm512_store_ps(out[p], acc[p]);
    const int64_t rows_here = std::min<int64_t>(kTileRows, a.n - t * kTileRows);
    for (int64_t i = 0; i < rows_here; ++i) {
      float* yi = y + (t * kTileRows + i) * ldy + row0;
      for (int p = 0; p < P; ++p) yi[p] = out[p][2 * i] + out[p][2 * i + 1];
    }
  }
}

template <GgmlType T>
void tile_kernel(const WeightMatrix& w, const Activations& a, float* y, int64_t r0, int64_t r1) {
  using W = Weights<T>;
  const int64_t nsub = w.cols / W::kSub;
  const int64_t nsub_pad = a.units * 2;
  const int64_t steps = a.cols_pad / 64;
  const bool odd_blocks = W::kSub == 32 && (w.cols / 32) % 2 == 1;
  // [8, cols_pad] interleaved codes, then [8, nsub_pad] dw and mw
  auto* wq = static_cast<uint8_t*>(thread_scratch(kScratchWeights).get(
      static_cast<size_t>(8 * a.cols_pad + 16 * nsub_pad * 4)));
  auto* dwn = reinterpret_cast<float*>(wq + 8 * a.cols_pad);
  float* mwn = dwn + 8 * nsub_pad;
  // Interleave the 4-byte groups of the A and B sub-blocks: [A0 B0 A1 B1 ...] per unit.
  const __m512i perm = W::kSub == 32
      ? _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)
      : _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = r0; g0 < r1; g0 += 8) {
    const int prows = static_cast<int>(std::min<int64_t>(8, r1 - g0));
    for (int p = 0; p < prows; ++p) {
      const uint8_t* row = base + (g0 + p) * w.row_bytes;
      for (int64_t s = 0; s < steps; ++s) {
        const __m512i u8 = (odd_blocks && s == steps - 1) ? W::template unpack<false>(row, s)
                                                          : W::template unpack<true>(row, s);
        const __m512i v = _mm512_permutexvar_epi32(perm, u8);
        _mm512_storeu_si512(wq + p * a.cols_pad + 64 * s, v);
      }
      W::scales(row, nsub, dwn + p * nsub_pad, mwn + p * nsub_pad);
      for (int64_t b = nsub; b < nsub_pad; ++b) dwn[p * nsub_pad + b] = mwn[p * nsub_pad + b] = 0.0f;
    }
    switch (prows) {
      case 8: tile_group<T, 8>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      case 7: tile_group<T, 7>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      case 6: tile_group<T, 6>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      case 5: tile_group<T, 5>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      case 4: tile_group<T, 4>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      case 3: tile_group<T, 3>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      case 2: tile_group<T, 2>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
      default: tile_group<T, 1>(a, wq, dwn, mwn, nsub_pad, y, w.rows, g0); break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Driver.

// Above this many activation rows the quantization / re-layout runs on the pool too.
constexpr int64_t kParallelPrepareRows = 32;

template <GgmlType T>
void quantized_matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  using W = Weights<T>;
  constexpr bool kMin = W::kMin;
  constexpr int kSub = W::kSub;
  constexpr int kOffset = W::kOffset;
  Activations a;
  a.n = n;
  a.n_pad = n == 1 ? 1 : round_up(n, kTileRows);
  a.cols = w.cols;
  a.cols_pad = round_up(w.cols, 64);
  a.units = a.cols_pad / (2 * kSub);
  a.tiles = n == 1 ? 0 : a.n_pad / kTileRows;
  const int64_t vec_sets = n == 1 ? 1 : a.tiles;
  const size_t q_bytes = static_cast<size_t>(a.n_pad * a.cols_pad);
  const size_t d_bytes = static_cast<size_t>(a.n_pad * (a.cols_pad / 32)) * 4;
  const size_t s_bytes = static_cast<size_t>(a.n_pad * (a.cols_pad / 16)) * 4;
  const size_t v_bytes = static_cast<size_t>(vec_sets * a.units * 16) * 4;
  const size_t qt_bytes = n == 1 ? 0 : q_bytes;
  auto round64 = [](size_t v) { return (v + 63) / 64 * 64; };
  auto* mem = static_cast<uint8_t*>(thread_scratch(kScratchActivations).get(
      round64(q_bytes) + round64(d_bytes) + round64(s_bytes) + 2 * round64(v_bytes) + qt_bytes));
  a.q = reinterpret_cast<int8_t*>(mem);
  mem += round64(q_bytes);
  a.d = reinterpret_cast<float*>(mem);
  mem += round64(d_bytes);
  a.s16 = reinterpret_cast<int32_t*>(mem);
  mem += round64(s_bytes);
  a.dx = reinterpret_cast<float*>(mem);
  mem += round64(v_bytes);
  a.ex = reinterpret_cast<float*>(mem);
  mem += round64(v_bytes);
  a.qt = reinterpret_cast<int8_t*>(mem);

  if (n == 1) {
    quantize_rows(x, a, 0, 1);
    build_row_layout<kSub, kMin, kOffset>(a);
    auto body = [&](int64_t r0, int64_t r1) { row_kernel<T>(w, a, y, r0, r1); };
    if (pool) {
      pool->parallel_for(w.rows, 8, body);
    } else {
      body(0, w.rows);
    }
    return;
  }
  auto prepare = [&](int64_t t0, int64_t t1) {
    quantize_rows(x, a, t0 * kTileRows, t1 * kTileRows);
    build_tiles<kSub, kMin, kOffset>(a, t0, t1);
  };
  if (pool && n >= kParallelPrepareRows) {
    pool->parallel_for(a.tiles, 1, prepare);
  } else {
    prepare(0, a.tiles);
  }
  auto body = [&](int64_t r0, int64_t r1) { tile_kernel<T>(w, a, y, r0, r1); };
  if (pool) {
    pool->parallel_for(w.rows, 8, body);
  } else {
    body(0, w.rows);
  }
}

}  // namespace

void quantize_activations_avx512(const float* x, int64_t cols, int8_t* q, float* d,
                                 int32_t* s16) {
  quantize_row(x, cols, q, d, s16);
}

void matmul_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  switch (w.type) {
    case GgmlType::kQ4_0: return quantized_matmul<GgmlType::kQ4_0>(w, x, n, y, pool);
    case GgmlType::kQ4_1: return quantized_matmul<GgmlType::kQ4_1>(w, x, n, y, pool);
    case GgmlType::kQ5_0: return quantized_matmul<GgmlType::kQ5_0>(w, x, n, y, pool);
    case GgmlType::kQ5_1: return quantized_matmul<GgmlType::kQ5_1>(w, x, n, y, pool);
    case GgmlType::kQ8_0: return quantized_matmul<GgmlType::kQ8_0>(w, x, n, y, pool);
    case GgmlType::kQ4_K: return quantized_matmul<GgmlType::kQ4_K>(w, x, n, y, pool);
    case GgmlType::kQ5_K: return quantized_matmul<GgmlType::kQ5_K>(w, x, n, y, pool);
    case GgmlType::kQ6_K: return quantized_matmul<GgmlType::kQ6_K>(w, x, n, y, pool);
    default: return matmul_float_avx512(w, x, n, y, pool);
  }
}

}  // namespace detail
}  // namespace specdec
