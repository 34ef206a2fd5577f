// AVX2 (+FMA, F16C) matmul for quantized weights, and the AVX2 entry point. Same arithmetic as
// the reference (quant_kernels.h), bit for bit; the row and tile kernels of the AVX-512 file,
// narrower (no panel kernel: the tile kernel serves every n >= 2):
//
//  * row kernel (n == 1): 8 weight rows; per 32 elements vpmaddubsw + vpmaddwd give 8 partial
//    sums per row, a hadd tree turns the 8 x 8 partials into one vector with lane = weight row,
//    and the float epilogue keeps two accumulators (sub-block parity A / B) per lane.
//  * tile kernel (n >= 2): activations in tiles of 4 rows, lane 2 i + h = (row i, parity h);
//    each weight row is unpacked once into a scratch with the A/B codes interleaved per 4 bytes.
// Matrices with a packed copy (packed_weights.h: Q4_0 / Q4_1 / Q8_0 / Q4_K, as a model loads them
// on AVX2 machines) run matmul_packed_avx2.cpp instead below kPackedPanelMinRows rows (decode,
// verification, batching): no per-call unpacking, no hadd trees, weights kept in registers
// across up to 8 activation rows. Prefill keeps the tile kernel here.
//
// vpmaddubsw multiplies unsigned by signed bytes and saturates its pair sums to s16: codes are at
// most 63 (|pair| <= 2 * 63 * 127 = 16002), and Q8_0's signed codes use |w| x sign(x, w)
// (|pair| <= 2 * 128 * 127 = 32512), so nothing saturates; the s16 pair sums of several 4-byte
// groups are added before widening only while that stays below 32767.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace detail {

void matmul_float_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y,
                       ThreadPool* pool);

namespace {

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Activation quantization, bit-identical to quantize_activations_ref.

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

void quantize_row(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
    const __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                      _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    const float amax = hmax8(m);
    const bool nonzero = amax >= kMinActivationAmax;
    const float scale = nonzero ? amax / 127.0f : 0.0f;
    const float inv = nonzero ? 1.0f / scale : 0.0f;
    d[b] = scale;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vinv));
    s16[2 * b] = hsum8(_mm256_add_epi32(i[0], i[1]));
    s16[2 * b + 1] = hsum8(_mm256_add_epi32(i[2], i[3]));
    const __m256i p01 = _mm256_packs_epi32(i[0], i[1]);
    const __m256i p23 = _mm256_packs_epi32(i[2], i[3]);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), ordered);
  }
}

// ---------------------------------------------------------------------------------------------
// Weight types. unpack(row, s): the 32 codes of elements [32 s, 32 s + 32) in natural order
// (Q8_0: the signed values; every other type: unsigned codes). scales(): natural dw / mw.

inline __m256i nibbles_16(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
}

// 0x10 in byte j where bit j of `bits` is set.
inline __m256i high_bits_32(uint32_t bits) {
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                            0x0101010101010101, 0x0000000000000000);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuffle);
  v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

// dw (and mw) of blocks whose first 4 bytes are f16 d (and f16 m), 8 at a time.
inline __m128i low_halves(__m256i v) {  // the low 16 bits of 8 dwords, packed
  const __m256i shuffle =
      _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9,
                       12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i p =
      _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, shuffle), _MM_SHUFFLE(3, 1, 2, 0));
  return _mm256_castsi256_si128(p);
}

// dw (and mw) of blocks whose first 4 bytes are f16 d (and f16 m). Scalar F16C conversions:
// vpgather is slower than this on the machines we measured.
template <bool kMin>
void scales_from_block_heads(const uint8_t* row, int64_t block_bytes, int64_t nsub, float* dw,
                             float* mw) {
  for (int64_t b = 0; b < nsub; ++b) {
    const uint32_t head = load_u32(row + b * block_bytes);
    dw[b] = _cvtsh_ss(static_cast<uint16_t>(head));
    if (kMin) mw[b] = _cvtsh_ss(static_cast<uint16_t>(head >> 16));
  }
}

inline void k4_scales_mins(const uint8_t* scales, uint64_t* sc, uint64_t* mn) {
  constexpr uint32_t kMask1 = 0x3f3f3f3f, kMask2 = 0x0f0f0f0f, kMask3 = 0x03030303;
  const uint32_t u0 = load_u32(scales), u1 = load_u32(scales + 4), u2 = load_u32(scales + 8);
  *sc = (u0 & kMask1) | (static_cast<uint64_t>((u2 & kMask2) | (((u0 >> 6) & kMask3) << 4)) << 32);
  *mn = (u1 & kMask1) |
        (static_cast<uint64_t>(((u2 >> 4) & kMask2) | (((u1 >> 6) & kMask3) << 4)) << 32);
}

template <class Block>
void k4_scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
  for (int64_t sb = 0; sb < nsub / 8; ++sb) {
    const auto& blk =
        *reinterpret_cast<const Block*>(row + sb * static_cast<int64_t>(sizeof(Block)));
    uint64_t sc, mn;
    k4_scales_mins(blk.scales, &sc, &mn);
    const __m256 scf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const __m256 mnf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
    _mm256_storeu_ps(dw + 8 * sb, _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk.d)), scf));
    _mm256_storeu_ps(mw + 8 * sb, _mm256_mul_ps(_mm256_set1_ps(-fp16_to_fp32(blk.dmin)), mnf));
  }
}

template <GgmlType T>
struct Weights;

template <>
struct Weights<GgmlType::kQ4_0> {
  static constexpr int64_t kHeadBytes = 18;  // f16 d (and m) start every block
  static constexpr int kSub = 32, kOffset = 8, kS16Groups = 8;
  static constexpr bool kMin = false, kSigned = false;
  static __m256i unpack(const uint8_t* row, int64_t s) { return nibbles_16(row + s * 18 + 2); }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<false>(row, 18, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ4_1> {
  static constexpr int64_t kHeadBytes = 20;  // f16 d (and m) start every block
  static constexpr int kSub = 32, kOffset = 0, kS16Groups = 8;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i unpack(const uint8_t* row, int64_t s) { return nibbles_16(row + s * 20 + 4); }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<true>(row, 20, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_0> {
  static constexpr int64_t kHeadBytes = 22;  // f16 d (and m) start every block
  static constexpr int kSub = 32, kOffset = 16, kS16Groups = 4;
  static constexpr bool kMin = false, kSigned = false;
  static __m256i unpack(const uint8_t* row, int64_t s) {
    const uint8_t* b = row + s * 22;
    return _mm256_or_si256(nibbles_16(b + 6), high_bits_32(load_u32(b + 2)));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<false>(row, 22, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_1> {
  static constexpr int64_t kHeadBytes = 24;  // f16 d (and m) start every block
  static constexpr int kSub = 32, kOffset = 0, kS16Groups = 4;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i unpack(const uint8_t* row, int64_t s) {
    const uint8_t* b = row + s * 24;
    return _mm256_or_si256(nibbles_16(b + 8), high_bits_32(load_u32(b + 4)));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<true>(row, 24, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ8_0> {
  static constexpr int64_t kHeadBytes = 34;  // f16 d (and m) start every block
  static constexpr int kSub = 32, kOffset = 128, kS16Groups = 1;
  static constexpr bool kMin = false, kSigned = true;
  static __m256i unpack(const uint8_t* row, int64_t s) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + s * 34 + 2));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<false>(row, 34, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ4_K> {
  static constexpr int64_t kHeadBytes = 0;
  static constexpr int kSub = 32, kOffset = 0, kS16Groups = 8;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i unpack(const uint8_t* row, int64_t s) {  // sub-block s % 8 of super-block s / 8
    const int j = static_cast<int>(s % 8);
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(row + (s / 8) * 144 + 16 + 32 * (j / 2)));
    const __m256i z = (j & 1) ? _mm256_srli_epi16(v, 4) : v;
    return _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    k4_scales<BlockQ4_K>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_K> {
  static constexpr int64_t kHeadBytes = 0;
  static constexpr int kSub = 32, kOffset = 0, kS16Groups = 4;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i unpack(const uint8_t* row, int64_t s) {
    const uint8_t* blk = row + (s / 8) * 176;
    const int j = static_cast<int>(s % 8);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * (j / 2)));
    const __m256i low =
        _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
    const __m256i qh = _mm256_srl_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)), _mm_cvtsi32_si128(j));
    const __m256i high = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(1)), 4);
    return _mm256_or_si256(low, high);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    k4_scales<BlockQ5_K>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ6_K> {
  static constexpr int64_t kHeadBytes = 0;
  static constexpr int kSub = 16, kOffset = 32, kS16Groups = 2;
  static constexpr bool kMin = false, kSigned = false;
  // Unit s (32 elements: sub-blocks 2s, 2s+1): super-block s / 8, half h = (s % 8) / 4,
  // group g = s % 4: low bits from ql[64 h + 32 (g & 1) + l] (low nibble for g < 2), high bits
  // (qh[32 h + l] >> 2 g) & 3.
  static __m256i unpack(const uint8_t* row, int64_t s) {
    const uint8_t* blk = row + (s / 8) * 210;
    const int u = static_cast<int>(s % 8);
    const int h = u / 4, g = u % 4;
    const __m256i ql =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (g & 1)));
    const __m256i low =
        _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0f));
    const __m256i qh =
        _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)),
                         _mm_cvtsi32_si128(2 * g));
    const __m256i high = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4);
    return _mm256_or_si256(low, high);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float*) {
    for (int64_t sb = 0; sb < nsub / 16; ++sb) {
      const auto& blk = *reinterpret_cast<const BlockQ6_K*>(row + sb * 210);
      const __m256 d = _mm256_set1_ps(fp16_to_fp32(blk.d));
      for (int half = 0; half < 2; ++half) {
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.scales + 8 * half))));
        _mm256_storeu_ps(dw + 16 * sb + 8 * half, _mm256_mul_ps(d, sc));
      }
    }
  }
};

// u8 x s8 -> s16 pair sums of the codes w with the activations x (Q8_0: signed w).
template <class W>
inline __m256i maddubs(__m256i w, __m256i x) {
  if constexpr (W::kSigned) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  } else {
    return _mm256_maddubs_epi16(w, x);
  }
}

// ---------------------------------------------------------------------------------------------
// Activations of one call.

constexpr int64_t kTileRows = 4;

struct Activations {
  int64_t n = 0, n_pad = 0, cols = 0, units = 0, tiles = 0;
  int8_t* q = nullptr;     // [n_pad, cols] natural
  float* d = nullptr;      // [n_pad, cols / 32]
  int32_t* s16 = nullptr;  // [n_pad, cols / 16]
  // n == 1: per sub-block (natural); n >= 2: per (tile, unit), lanes 2 i + h.
  float* dx = nullptr;
  float* ex = nullptr;   // sx (min types) or int32 offset corrections (offset types)
  int8_t* qt = nullptr;  // n >= 2: [tiles, units, sub / 4, 32]
};

template <int kSub, bool kMin, int kOffset, bool kSigned>
inline void lane_values(const Activations& a, int64_t row, int64_t e, float* dx, float* ex) {
  const float d = a.d[row * (a.cols / 32) + e / 32];
  const int32_t* s16 = a.s16 + row * (a.cols / 16) + e / 16;
  *dx = d;
  if (kMin) {
    *ex = static_cast<float>(s16[0] + s16[1]) * d;
  } else {
    const int32_t corr = kSigned ? 0 : kOffset * (kSub == 32 ? s16[0] + s16[1] : s16[0]);
    std::memcpy(ex, &corr, 4);
  }
}

template <class W>
void build_row_vectors(Activations& a) {
  const int64_t nsub = a.cols / W::kSub;
  for (int64_t b = 0; b < nsub; ++b) {
    lane_values<W::kSub, W::kMin, W::kOffset, W::kSigned>(a, 0, b * W::kSub, &a.dx[b], &a.ex[b]);
  }
}

template <class W>
void build_tiles(Activations& a, int64_t t0, int64_t t1) {
  constexpr int64_t kGroups = W::kSub / 4;
  const int64_t unit = 2 * W::kSub;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t u = 0; u < a.units; ++u) {
      auto* dst = reinterpret_cast<int32_t*>(a.qt + (t * a.units + u) * kGroups * 32);
      for (int64_t g = 0; g < kGroups; ++g) {
        for (int l = 0; l < 8; ++l) {
          const int64_t row = t * kTileRows + (l >> 1);
          const int64_t e = u * unit + (l & 1) * W::kSub + 4 * g;
          int32_t v = 0;
          if (e < a.cols) std::memcpy(&v, a.q + row * a.cols + e, 4);
          dst[g * 8 + l] = v;
        }
      }
      for (int l = 0; l < 8; ++l) {
        const int64_t e = u * unit + (l & 1) * W::kSub;
        float* dx = a.dx + (t * a.units + u) * 8 + l;
        float* ex = a.ex + (t * a.units + u) * 8 + l;
        if (e < a.cols) {
          lane_values<W::kSub, W::kMin, W::kOffset, W::kSigned>(a, t * kTileRows + (l >> 1), e, dx,
                                                                ex);
        } else {
          *dx = 0.0f;
          *ex = 0.0f;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row kernel (n == 1).

// 8 vectors of 8 partial sums -> lane p = total of v[p].
inline __m256i hsum_rows(const __m256i v[8]) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                          _mm256_permute2x128_si256(a, b, 0x31));
}

// 8 vectors whose 128-bit lanes hold 4 partials of sub-block A (low) and B (high) -> lane p.
inline void hsum_rows_halves(const __m256i v[8], __m256i* ra, __m256i* rb) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
  *ra = _mm256_permute2x128_si256(a, b, 0x20);
  *rb = _mm256_permute2x128_si256(a, b, 0x31);
}

template <class W>
inline __m256 epilogue(__m256 acc, __m256i isum, const float* dx, const float* ex, __m256 dw,
                       __m256 mw) {
  if constexpr (!W::kMin && !W::kSigned) {
    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(ex)));
  }
  const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(dx));
  acc = _mm256_fmadd_ps(t, dw, acc);
  if constexpr (W::kMin) acc = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(ex), acc);
  return acc;
}

// 8 rows (stride rb from g) against the activation row. dwt / mwt: [nsub, 8] scales, transposed.
// prefetch / pf_step: a later group's bytes, pf_step of them per step.
template <GgmlType T>
void row_group(const uint8_t* g, int64_t rb, const Activations& a, const float* dwt,
               const float* mwt, const uint8_t* prefetch, int64_t pf_step, float* y,
               int64_t valid) {
  using W = Weights<T>;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t s = 0; s < a.cols / 32; ++s) {
    if (prefetch != nullptr) {
      for (int64_t off = s * pf_step; off < (s + 1) * pf_step; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + off), _MM_HINT_T0);
      }
    }
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 32 * s));
    __m256i v[8];
    for (int p = 0; p < 8; ++p) {
      v[p] = _mm256_madd_epi16(maddubs<W>(W::unpack(g + p * rb, s), xq), ones);
    }
    if constexpr (W::kSub == 32) {
      const __m256i r = hsum_rows(v);
      __m256 dw, mw;
      if constexpr (W::kHeadBytes > 0) {  // f16 d / m of block s of the 8 rows, lane = row
        const uint8_t* h = g + s * W::kHeadBytes;
        const __m256i heads = _mm256_setr_epi32(
            static_cast<int>(load_u32(h)), static_cast<int>(load_u32(h + rb)),
            static_cast<int>(load_u32(h + 2 * rb)), static_cast<int>(load_u32(h + 3 * rb)),
            static_cast<int>(load_u32(h + 4 * rb)), static_cast<int>(load_u32(h + 5 * rb)),
            static_cast<int>(load_u32(h + 6 * rb)), static_cast<int>(load_u32(h + 7 * rb)));
        dw = _mm256_cvtph_ps(low_halves(heads));
        mw = W::kMin ? _mm256_cvtph_ps(low_halves(_mm256_srli_epi32(heads, 16))) : dw;
      } else {
        dw = _mm256_loadu_ps(dwt + 8 * s);
        mw = _mm256_loadu_ps(mwt + 8 * s);
      }
      acc[s & 1] = epilogue<W>(acc[s & 1], r, a.dx + s, a.ex + s, dw, mw);
    } else {
      __m256i ra, rb2;
      hsum_rows_halves(v, &ra, &rb2);
      acc[0] = epilogue<W>(acc[0], ra, a.dx + 2 * s, a.ex + 2 * s, _mm256_loadu_ps(dwt + 16 * s),
                           _mm256_setzero_ps());
      acc[1] = epilogue<W>(acc[1], rb2, a.dx + 2 * s + 1, a.ex + 2 * s + 1,
                           _mm256_loadu_ps(dwt + 16 * s + 8), _mm256_setzero_ps());
    }
  }
  const __m256 sum = _mm256_add_ps(acc[0], acc[1]);
  if (valid == 8) {
    _mm256_storeu_ps(y, sum);
  } else {
    alignas(32) float out[8];
    _mm256_store_ps(out, sum);
    for (int64_t p = 0; p < valid; ++p) y[p] = out[p];
  }
}

// The row kernel prefetches the group of 8 rows this many groups ahead of the one it multiplies.
constexpr int64_t kPrefetchGroups = 3;

template <GgmlType T>
void row_kernel(const WeightMatrix& w, const Activations& a, float* y, int64_t r0, int64_t r1) {
  using W = Weights<T>;
  const int64_t pf_step = (8 * w.row_bytes / (w.cols / 32) + 63) / 64 * 64;
  const int64_t nsub = w.cols / W::kSub;
  const int64_t rb = w.row_bytes;
  // [8, rb] copy of a ragged group; [8, nsub] natural scales; [nsub, 8] transposed scales x 2
  auto* mem = static_cast<uint8_t*>(
      thread_scratch(kScratchWeights).get(static_cast<size_t>(8 * rb + 64 + 4 * nsub * 8 * 4)));
  uint8_t* tail = mem;
  auto* dwn = reinterpret_cast<float*>(mem + (8 * rb + 63) / 64 * 64);
  float* mwn = dwn + 8 * nsub;
  float* dwt = mwn + 8 * nsub;
  float* mwt = dwt + 8 * nsub;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = r0; g0 < r1; g0 += 8) {
    const int64_t valid = std::min<int64_t>(8, r1 - g0);
    const uint8_t* g = base + g0 * rb;
    if (valid < 8) {
      for (int64_t p = 0; p < 8; ++p) {
        std::memcpy(tail + p * rb, base + (g0 + std::min(p, valid - 1)) * rb,
                    static_cast<size_t>(rb));
      }
      g = tail;
    }
    if constexpr (W::kHeadBytes == 0) {  // K-quants: natural scales, then [nsub, 8]
      for (int p = 0; p < 8; ++p) W::scales(g + p * rb, nsub, dwn + p * nsub, mwn + p * nsub);
      for (int64_t b = 0; b < nsub; ++b) {
        for (int p = 0; p < 8; ++p) {
          dwt[8 * b + p] = dwn[p * nsub + b];
          mwt[8 * b + p] = W::kMin ? mwn[p * nsub + b] : 0.0f;
        }
      }
    }
    const uint8_t* next =
        g0 + 8 * (kPrefetchGroups + 1) <= r1 ? base + (g0 + 8 * kPrefetchGroups) * rb : nullptr;
    row_group<T>(g, rb, a, dwt, mwt, next, pf_step, y + g0, valid);
  }
}

// ---------------------------------------------------------------------------------------------
// Tile kernel (n >= 2).

template <GgmlType T, int P>
void tile_group(const Activations& a, const uint8_t* wq, int64_t wq_stride, const float* dwn,
                const float* mwn, int64_t nsub_pad, float* y, int64_t ldy, int64_t row0) {
  using W = Weights<T>;
  constexpr int kGroups = W::kSub / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < a.tiles; ++t) {
    __m256 acc[P];
    for (int p = 0; p < P; ++p) acc[p] = _mm256_setzero_ps();
    for (int64_t u = 0; u < a.units; ++u) {
      const int8_t* xt = a.qt + (t * a.units + u) * kGroups * 32;
      const __m256 dx = _mm256_loadu_ps(a.dx + (t * a.units + u) * 8);
      const __m256 ex = _mm256_loadu_ps(a.ex + (t * a.units + u) * 8);
      for (int p = 0; p < P; ++p) {
        const uint8_t* wu = wq + p * wq_stride + u * 8 * kGroups;
        __m256i isum = _mm256_setzero_si256();
        for (int g0 = 0; g0 < kGroups; g0 += W::kS16Groups) {
          __m256i s16 = _mm256_setzero_si256();
          for (int g = g0; g < g0 + W::kS16Groups; ++g) {
            int64_t pair;
            std::memcpy(&pair, wu + 8 * g, 8);
            const __m256i xg = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + 32 * g));
            s16 = _mm256_add_epi16(s16, maddubs<W>(_mm256_set1_epi64x(pair), xg));
          }
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, ones));
        }
        if constexpr (!W::kMin && !W::kSigned)
          isum = _mm256_sub_epi32(isum, _mm256_castps_si256(ex));
        double dpair;
        std::memcpy(&dpair, dwn + p * nsub_pad + 2 * u, 8);
        const __m256 t8 = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), dx);
        acc[p] = _mm256_fmadd_ps(t8, _mm256_castpd_ps(_mm256_set1_pd(dpair)), acc[p]);
        if constexpr (W::kMin) {
          double mpair;
          std::memcpy(&mpair, mwn + p * nsub_pad + 2 * u, 8);
          acc[p] = _mm256_fmadd_ps(_mm256_castpd_ps(_mm256_set1_pd(mpair)), ex, acc[p]);
        }
      }
    }
    alignas(32) float out[P][8];
    for (int p = 0; p < P; ++p) _mm256_store_ps(out[p], acc[p]);
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
  const int64_t stride = a.units * 2 * W::kSub;  // bytes of unpacked codes per row
  auto* wq = static_cast<uint8_t*>(
      thread_scratch(kScratchWeights).get(static_cast<size_t>(8 * stride + 16 * nsub_pad * 4)));
  auto* dwn = reinterpret_cast<float*>(wq + 8 * stride);
  float* mwn = dwn + 8 * nsub_pad;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = r0; g0 < r1; g0 += 8) {
    const int prows = static_cast<int>(std::min<int64_t>(8, r1 - g0));
    for (int p = 0; p < prows; ++p) {
      const uint8_t* row = base + (g0 + p) * w.row_bytes;
      uint8_t* dst = wq + p * stride;
      if constexpr (W::kSub == 32) {
        for (int64_t u = 0; u < a.units; ++u) {
          const __m256i va = W::unpack(row, 2 * u);
          const __m256i vb = 2 * u + 1 < nsub ? W::unpack(row, 2 * u + 1) : _mm256_setzero_si256();
          const __m256i lo = _mm256_unpacklo_epi32(va, vb), hi = _mm256_unpackhi_epi32(va, vb);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * u),
                              _mm256_permute2x128_si256(lo, hi, 0x20));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * u + 32),
                              _mm256_permute2x128_si256(lo, hi, 0x31));
        }
      } else {
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (int64_t u = 0; u < a.units; ++u) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * u),
                              _mm256_permutevar8x32_epi32(W::unpack(row, u), perm));
        }
      }
      W::scales(row, nsub, dwn + p * nsub_pad, mwn + p * nsub_pad);
      for (int64_t b = nsub; b < nsub_pad; ++b)
        dwn[p * nsub_pad + b] = mwn[p * nsub_pad + b] = 0.0f;
    }
    switch (prows) {
      case 8:
        tile_group<T, 8>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      case 7:
        tile_group<T, 7>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      case 6:
        tile_group<T, 6>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      case 5:
        tile_group<T, 5>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      case 4:
        tile_group<T, 4>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      case 3:
        tile_group<T, 3>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      case 2:
        tile_group<T, 2>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
      default:
        tile_group<T, 1>(a, wq, stride, dwn, mwn, nsub_pad, y, w.rows, g0);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Driver.

constexpr int64_t kParallelPrepareRows = 32;

template <GgmlType T>
void quantized_matmul(const WeightMatrix& w, const float* x, int64_t n, float* y,
                      ThreadPool* pool) {
  using W = Weights<T>;
  Activations a;
  a.n = n;
  a.n_pad = n == 1 ? 1 : round_up(n, kTileRows);
  a.cols = w.cols;
  a.units = round_up(w.cols, 2 * W::kSub) / (2 * W::kSub);
  a.tiles = n == 1 ? 0 : a.n_pad / kTileRows;
  const int64_t vec_floats = n == 1 ? w.cols / W::kSub : a.tiles * a.units * 8;
  auto round64 = [](size_t v) { return (v + 63) / 64 * 64; };
  const size_t q_bytes = round64(static_cast<size_t>(a.n_pad * a.cols));
  const size_t d_bytes = round64(static_cast<size_t>(a.n_pad * (a.cols / 32)) * 4);
  const size_t s_bytes = round64(static_cast<size_t>(a.n_pad * (a.cols / 16)) * 4);
  const size_t v_bytes = round64(static_cast<size_t>(vec_floats) * 4);
  const size_t qt_bytes =
      n == 1 ? 0 : static_cast<size_t>(a.tiles * a.units * 2 * W::kSub * kTileRows);
  auto* mem = static_cast<uint8_t*>(thread_scratch(kScratchActivations)
                                        .get(q_bytes + d_bytes + s_bytes + 2 * v_bytes + qt_bytes));
  a.q = reinterpret_cast<int8_t*>(mem);
  a.d = reinterpret_cast<float*>(mem + q_bytes);
  a.s16 = reinterpret_cast<int32_t*>(mem + q_bytes + d_bytes);
  a.dx = reinterpret_cast<float*>(mem + q_bytes + d_bytes + s_bytes);
  a.ex = reinterpret_cast<float*>(mem + q_bytes + d_bytes + s_bytes + v_bytes);
  a.qt = reinterpret_cast<int8_t*>(mem + q_bytes + d_bytes + s_bytes + 2 * v_bytes);

  auto quantize = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int8_t* q = a.q + i * a.cols;
      float* d = a.d + i * (a.cols / 32);
      int32_t* s16 = a.s16 + i * (a.cols / 16);
      if (i < n) {
        quantize_row(x + i * a.cols, a.cols, q, d, s16);
      } else {
        std::memset(q, 0, static_cast<size_t>(a.cols));
        std::memset(d, 0, static_cast<size_t>(a.cols / 32) * 4);
        std::memset(s16, 0, static_cast<size_t>(a.cols / 16) * 4);
      }
    }
  };
  if (n == 1) {
    quantize(0, 1);
    build_row_vectors<W>(a);
    auto body = [&](int64_t r0, int64_t r1) { row_kernel<T>(w, a, y, r0, r1); };
    if (pool) {
      pool->parallel_for(w.rows, 8, body);
    } else {
      body(0, w.rows);
    }
    return;
  }
  auto prepare = [&](int64_t t0, int64_t t1) {
    quantize(t0 * kTileRows, t1 * kTileRows);
    build_tiles<W>(a, t0, t1);
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

void quantize_activations_avx2(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  quantize_row(x, cols, q, d, s16);
}

void matmul_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      return quantized_matmul<GgmlType::kQ4_0>(w, x, n, y, pool);
    case GgmlType::kQ4_1:
      return quantized_matmul<GgmlType::kQ4_1>(w, x, n, y, pool);
    case GgmlType::kQ5_0:
      return quantized_matmul<GgmlType::kQ5_0>(w, x, n, y, pool);
    case GgmlType::kQ5_1:
      return quantized_matmul<GgmlType::kQ5_1>(w, x, n, y, pool);
    case GgmlType::kQ8_0:
      return quantized_matmul<GgmlType::kQ8_0>(w, x, n, y, pool);
    case GgmlType::kQ4_K:
      return quantized_matmul<GgmlType::kQ4_K>(w, x, n, y, pool);
    case GgmlType::kQ5_K:
      return quantized_matmul<GgmlType::kQ5_K>(w, x, n, y, pool);
    case GgmlType::kQ6_K:
      return quantized_matmul<GgmlType::kQ6_K>(w, x, n, y, pool);
    default:
      return matmul_float_avx2(w, x, n, y, pool);
  }
}

}  // namespace detail
}  // namespace specdec
