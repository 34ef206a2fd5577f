// AVX-512 building blocks of the quantized matmul: unpacking GGML blocks into unsigned byte
// codes, extracting their scales, and the re-layout helpers. Include only from *_avx512.cpp
// files (they are compiled with the AVX-512 flags).
//
// Nothing here uses vpgather: on the Ice Lake VMs we measured, a 16-lane gather costs more than
// the rest of a decode step's work on the same data, so scales are picked with vpermt2w out of
// 128-byte windows and re-laid out with 8 x 8 qword transposes.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "quant_weights_avx512.h needs the AVX-512 flags of a *_avx512.cpp file"
#endif

// GCC 12 warns about the intentionally undefined vectors inside its own AVX-512 intrinsics
// (_mm512_undefined_*) once they are inlined; the warning is a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "backend/cpu/quant_blocks.h"

namespace specdec {
namespace detail {
namespace avx512 {

// GCC 12 surrounds every _mm512_dpbusd_epi32 with two register copies: issue it through asm.
inline __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
  return acc;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Transposes an 8 x 8 matrix of 8-byte elements: row r = 64 bytes at src + r * src_stride;
// column c is written as 64 bytes at dst + 64 c.
inline void transpose8x8_qwords(const void* src, int64_t src_stride, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  __m512i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_si512(s + i * src_stride);
  __m512i a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm512_unpacklo_epi64(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi64(r[2 * i], r[2 * i + 1]);
  }
  // b[4 h + k]: rows 4 h .. 4 h + 3 (pairs), columns {0,4}, {2,6}, {1,5}, {3,7} for k = 0..3
  for (int h = 0; h < 2; ++h) {
    b[4 * h + 0] = _mm512_shuffle_i64x2(a[4 * h], a[4 * h + 2], _MM_SHUFFLE(2, 0, 2, 0));
    b[4 * h + 1] = _mm512_shuffle_i64x2(a[4 * h], a[4 * h + 2], _MM_SHUFFLE(3, 1, 3, 1));
    b[4 * h + 2] = _mm512_shuffle_i64x2(a[4 * h + 1], a[4 * h + 3], _MM_SHUFFLE(2, 0, 2, 0));
    b[4 * h + 3] = _mm512_shuffle_i64x2(a[4 * h + 1], a[4 * h + 3], _MM_SHUFFLE(3, 1, 3, 1));
  }
  auto* d = static_cast<uint8_t*>(dst);
  const int col_of_b[4][2] = {{0, 4}, {2, 6}, {1, 5}, {3, 7}};
  for (int k = 0; k < 4; ++k) {
    _mm512_storeu_si512(d + 64 * col_of_b[k][0],
                        _mm512_shuffle_i64x2(b[k], b[4 + k], _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(d + 64 * col_of_b[k][1],
                        _mm512_shuffle_i64x2(b[k], b[4 + k], _MM_SHUFFLE(3, 1, 3, 1)));
  }
}

// Codes of two 16-byte nibble blocks qa, qb in "nibble order": 128-bit lanes
// [A 0..15, B 0..15, A 16..31, B 16..31] (low nibbles are elements 0..15, high ones 16..31).
// In place: a[r] (16 elements of row r) becomes column r of the original 16 x 16 matrix of
// 32-bit elements.
inline void transpose16(__m512 a[16]) {
  __m512 b[16], c[16];
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    c[4 * i + 0] = _mm512_shuffle_ps(b[4 * i], b[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    c[4 * i + 1] = _mm512_shuffle_ps(b[4 * i], b[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    c[4 * i + 2] = _mm512_shuffle_ps(b[4 * i + 1], b[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    c[4 * i + 3] = _mm512_shuffle_ps(b[4 * i + 1], b[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // c[4 i + e], 128-bit lane L = rows 4 i .. 4 i + 3 at column 4 L + e.
  for (int e = 0; e < 4; ++e) {
    const __m512 d0 = _mm512_shuffle_f32x4(c[e], c[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 d1 = _mm512_shuffle_f32x4(c[e], c[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 f0 = _mm512_shuffle_f32x4(c[8 + e], c[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 f1 = _mm512_shuffle_f32x4(c[8 + e], c[12 + e], _MM_SHUFFLE(3, 1, 3, 1));
    a[e] = _mm512_shuffle_f32x4(d0, f0, _MM_SHUFFLE(2, 0, 2, 0));
    a[8 + e] = _mm512_shuffle_f32x4(d0, f0, _MM_SHUFFLE(3, 1, 3, 1));
    a[4 + e] = _mm512_shuffle_f32x4(d1, f1, _MM_SHUFFLE(2, 0, 2, 0));
    a[12 + e] = _mm512_shuffle_f32x4(d1, f1, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

inline __m512i nibbles_2x16(const uint8_t* qa, const uint8_t* qb) {
  const __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qa))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)), 1);
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

// The same codes in "pair order" - 4-byte groups of A and B interleaved, [A0 B0 A1 B1 .. A7 B7]
// - written as 64 bytes to dst; extra: 0x10 added to the bytes selected by the 64-bit mask.
inline void nibble_pairs_2x16(const uint8_t* qa, const uint8_t* qb, uint64_t extra, uint8_t* dst) {
  const __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qa))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)), 1);
  const __m256i p = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m256i m = _mm256_set1_epi8(0x0f);
  __m256i lo = _mm256_and_si256(p, m);
  __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), m);
  if (extra != 0) {
    const __m256i sixteen = _mm256_set1_epi8(16);
    lo = _mm256_mask_add_epi8(lo, static_cast<__mmask32>(extra), lo, sixteen);
    hi = _mm256_mask_add_epi8(hi, static_cast<__mmask32>(extra >> 32), hi, sixteen);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), hi);
}

// Pair order of two 32-code vectors given as 4-byte groups lo_g (A) and hi_g (B).
inline __m512i interleave_dwords(__m256i a, __m256i b) {
  const __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  return _mm512_permutex2var_epi32(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b));
}

inline __m512i nibbles_32(const uint8_t* q) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));  // [lo 32, hi 32]
}

// vpermt2w index tables for block_heads16: for 128-byte window c of 16 blocks of kBB bytes,
// lane l < 16 takes the f16 d of block l (word l * kBB / 2), lane 16 + l its f16 m (next word);
// take[c] marks the lanes whose word lies in window c.
template <int kBB>
struct HeadTables {
  static constexpr int kWindows = (16 * kBB + 127) / 128;
  struct Table {
    alignas(64) uint16_t idx[kWindows][32];
    uint32_t take[kWindows];
  };
  static constexpr Table make() {
    Table t{};
    for (int c = 0; c < kWindows; ++c) {
      t.take[c] = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int word = (lane % 16) * (kBB / 2) + lane / 16;
        t.idx[c][lane] = static_cast<uint16_t>((word - 64 * c) & 63);
        if (word >= 64 * c && word < 64 * c + 64) t.take[c] |= 1u << lane;
      }
    }
    return t;
  }
  static constexpr Table kTable = make();
};

// f16 d (word 0) and f16 m (word 1) of 16 consecutive blocks of kBB bytes at p, which must all
// be readable (nothing beyond them is read).
template <int kBB, bool kMin>
inline void block_heads16(const uint8_t* p, __m512* d, __m512* m) {
  using Tables = HeadTables<kBB>;
  constexpr int kBytes = 16 * kBB;
  __m512i out = _mm512_setzero_si512();
  for (int c = 0; c < Tables::kWindows; ++c) {
    const int valid = kBytes - 128 * c;  // bytes of this window inside the 16 blocks
    const uint64_t lo_mask = valid >= 64 ? ~0ull : (1ull << valid) - 1;
    const uint64_t hi_mask = valid >= 128 ? ~0ull : valid <= 64 ? 0ull : (1ull << (valid - 64)) - 1;
    const __m512i lo = _mm512_maskz_loadu_epi8(lo_mask, p + 128 * c);
    const __m512i hi = _mm512_maskz_loadu_epi8(hi_mask, p + 128 * c + 64);
    const __m512i t = _mm512_permutex2var_epi16(lo, _mm512_load_si512(Tables::kTable.idx[c]), hi);
    out = _mm512_mask_mov_epi16(out, Tables::kTable.take[c], t);
  }
  *d = _mm512_cvtph_ps(_mm512_castsi512_si256(out));
  if (kMin) *m = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(out, 1));
}

// vpermt2w index tables for step_heads8: with rows 2j, 2j+1 in the two halves of a zmm and two
// such zmm as sources, output word q < 16 (pair layout: q = 2 row + parity) takes the f16 d of
// (row, parity), word 16 + q its f16 m; for rows 0..3 (lo) or 4..7 (hi, same table).
template <int kBB>
struct StepHeadTable {
  alignas(64) uint16_t idx[32];
  static constexpr StepHeadTable make() {
    StepHeadTable t{};
    for (int q = 0; q < 32; ++q) {
      const int row = (q % 16) / 2 % 4, parity = q % 2, m = q / 16;
      t.idx[q] = static_cast<uint16_t>((row / 2) * 32 + (row % 2) * 16 + parity * (kBB / 2) + m);
    }
    return t;
  }
};
template <int kBB>
inline constexpr StepHeadTable<kBB> kStepHeads = StepHeadTable<kBB>::make();

// dw / mw of sub-blocks 2s, 2s+1 of 8 rows (stride rb from g) in pair layout, read from the
// block headers (kBB <= 28: both headers within 32 bytes of the first). kHasB == false: block
// 2s + 1 does not exist (zero scales, nothing read past block 2s).
template <int kBB, bool kMin, bool kHasB>
inline void step_heads8(const uint8_t* g, int64_t rb, int64_t s, __m512* dw, __m512* mw) {
  static_assert(kBB <= 28);
  const uint8_t* h = g + 2 * s * kBB;
  const __mmask32 bytes = kHasB ? ~0u : (1u << kBB) - 1;
  __m512i z[4];
  for (int j = 0; j < 4; ++j) {
    const __m256i lo = _mm256_maskz_loadu_epi8(bytes, h + 2 * j * rb);
    const __m256i hi = _mm256_maskz_loadu_epi8(bytes, h + (2 * j + 1) * rb);
    z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  const __m512i idx = _mm512_load_si512(kStepHeads<kBB>.idx);
  const __m512i rows03 = _mm512_permutex2var_epi16(z[0], idx, z[1]);
  const __m512i rows47 = _mm512_permutex2var_epi16(z[2], idx, z[3]);
  const __m512i words = _mm512_mask_mov_epi16(rows03, 0xff00ff00u, rows47);
  *dw = _mm512_cvtph_ps(_mm512_castsi512_si256(words));
  if (kMin) *mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(words, 1));
}

template <int kBB, bool kMin>
void scales_from_block_heads(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
  int64_t b = 0;
  for (; b + 16 <= nsub; b += 16) {
    __m512 d, m;
    block_heads16<kBB, kMin>(row + b * kBB, &d, &m);
    _mm512_storeu_ps(dw + b, d);
    if (kMin) _mm512_storeu_ps(mw + b, m);
  }
  for (; b < nsub; ++b) {
    uint16_t h;
    std::memcpy(&h, row + b * kBB, 2);
    dw[b] = fp16_to_fp32(h);
    if (kMin) {
      std::memcpy(&h, row + b * kBB + 2, 2);
      mw[b] = fp16_to_fp32(h);
    }
  }
}

// The 8 scales and 8 mins of a Q4_K / Q5_K super-block as bytes (get_scale_min_k4 for all j).
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

// The scales of sub-block j of a packed Q4_K super-block (its head at `head`, packed_weights.h),
// 16 rows: dw = d * sc[j], mw = -(dmin * mn[j]), the sub-block view's products (the sign by xor,
// so that a zero product is -0 as there).
inline void q4_k_packed_scales(const uint8_t* head, int64_t j, __m512* dw, __m512* mw) {
  auto bytes = [&](int64_t at) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(head + at))));
  };
  auto halves = [&](int64_t at) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(head + at)));
  };
  *dw = _mm512_mul_ps(halves(0), bytes(64 + 16 * j));
  *mw = _mm512_xor_ps(_mm512_mul_ps(halves(32), bytes(192 + 16 * j)), _mm512_set1_ps(-0.0f));
}

// Q5_0 / Q5_1: the 5th bits (vector hb of the packed layout, packed_weights.h, or its duplicated
// halves) of code vector v added to its low- and high-nibble codes as bit 4. Shifts within 16-bit
// lanes: bit 4 of either byte comes from the same byte for these distances.
[[gnu::always_inline]] inline void fifth_bits(__m512i hb, int v, __m512i* lo, __m512i* hi) {
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  // bit 2 v (the low nibble's code) and bit 2 v + 1 (the high nibble's) onto bit 4; v is a
  // constant in the unrolled callers, so these are immediate shifts
  const __m512i l = v <= 2 ? _mm512_slli_epi16(hb, 4 - 2 * v) : _mm512_srli_epi16(hb, 2 * v - 4);
  const __m512i h = v <= 1 ? _mm512_slli_epi16(hb, 3 - 2 * v) : _mm512_srli_epi16(hb, 2 * v - 3);
  *lo = _mm512_or_si512(*lo, _mm512_and_si512(l, bit4));
  *hi = _mm512_or_si512(*hi, _mm512_and_si512(h, bit4));
}

// Weight types. Each: kSub, kMin, kOffset (see quant_blocks.h);
//   kHeadBytes: block size when both headers of a step (f16 d, m at its two blocks' starts) lie
//     in 32 bytes - the row kernel then reads the scales per step - else 0;
//   kNibbleOrder: unpack() returns the codes in nibble order (see nibbles_2x16) instead of
//     natural order; the activation row is permuted the same way;
//   unpack<kHasB>(row, s): the 64 codes of elements [64 s, 64 s + 64); for the 32-element
//     types, kHasB == false (the last step of a row with an odd number of blocks) repeats block
//     2s in place of the missing block 2s + 1 - it meets zero activations;
//   store_pairs<kHasB>(row, s, dst): the same 64 codes in pair order (A and B interleaved per
//     4 bytes; for sub 16: two units, each 32 bytes) written to dst;
//   scales(row, nsub, dw, mw): dw / mw of sub-blocks [0, nsub) in natural order (nsub may
//     span several consecutive rows).
template <GgmlType T>
struct Weights;

template <>
struct Weights<GgmlType::kQ4_0> {
  static constexpr int kHeadBytes = 18;  // f16 d (and m) lead every 18-byte block
  static constexpr int kSub = 32, kOffset = 8;
  static constexpr bool kMin = false, kNibbleOrder = true;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * 18;
    return nibbles_2x16(a + 2, (kHasB ? a + 18 : a) + 2);
  }
  template <bool kHasB>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const auto* a = row + 2 * s * 18;
    nibble_pairs_2x16(a + 2, (kHasB ? a + 18 : a) + 2, 0, dst);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<18, false>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ4_1> {
  static constexpr int kHeadBytes = 20;  // f16 d (and m) lead every 20-byte block
  static constexpr int kSub = 32, kOffset = 0;
  static constexpr bool kMin = true, kNibbleOrder = true;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * 20;
    return nibbles_2x16(a + 4, (kHasB ? a + 20 : a) + 4);
  }
  template <bool kHasB>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const auto* a = row + 2 * s * 20;
    nibble_pairs_2x16(a + 4, (kHasB ? a + 20 : a) + 4, 0, dst);
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<20, true>(row, nsub, dw, mw);
  }
};

// Q5_0 / Q5_1: nibbles plus bit j of the little-endian qh word as bit 4 of element j.
template <int kBlockBytes, int kQhOffset>
struct Q5Blocks {
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * kBlockBytes;
    const auto* b = kHasB ? a + kBlockBytes : a;
    const __m512i z = nibbles_2x16(a + kQhOffset + 4, b + kQhOffset + 4);
    const uint64_t ha = load_u32(a + kQhOffset), hb = load_u32(b + kQhOffset);
    // nibble order: [A 0..15, B 0..15, A 16..31, B 16..31]
    const uint64_t bits =
        (ha & 0xffff) | ((hb & 0xffff) << 16) | ((ha >> 16) << 32) | ((hb >> 16) << 48);
    return _mm512_mask_add_epi8(z, _cvtu64_mask64(bits), z, _mm512_set1_epi8(16));
  }
  template <bool kHasB>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const auto* a = row + 2 * s * kBlockBytes;
    const auto* b = kHasB ? a + kBlockBytes : a;
    const uint64_t ha = load_u32(a + kQhOffset), hb = load_u32(b + kQhOffset);
    // pair order: 4-bit groups of A's and B's element bits interleaved
    const uint64_t lo =
        _pdep_u64(ha & 0xffff, 0x0f0f0f0full) | _pdep_u64(hb & 0xffff, 0xf0f0f0f0ull);
    const uint64_t hi = _pdep_u64(ha >> 16, 0x0f0f0f0full) | _pdep_u64(hb >> 16, 0xf0f0f0f0ull);
    nibble_pairs_2x16(a + kQhOffset + 4, b + kQhOffset + 4, lo | (hi << 32), dst);
  }
};

template <>
struct Weights<GgmlType::kQ5_0> : Q5Blocks<22, 2> {
  static constexpr int kHeadBytes = 22;  // f16 d (and m) lead every 22-byte block
  static constexpr int kSub = 32, kOffset = 16;
  static constexpr bool kMin = false, kNibbleOrder = true;
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<22, false>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_1> : Q5Blocks<24, 4> {
  static constexpr int kHeadBytes = 24;  // f16 d (and m) lead every 24-byte block
  static constexpr int kSub = 32, kOffset = 0;
  static constexpr bool kMin = true, kNibbleOrder = true;
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<24, true>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ8_0> {
  static constexpr int kHeadBytes = 0;
  static constexpr int kSub = 32, kOffset = 128;
  static constexpr bool kMin = false, kNibbleOrder = false;
  template <bool kHasB>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    const auto* a = row + 2 * s * 34;
    const auto* b = kHasB ? a + 34 : a;
    const __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));  // q + 128
  }
  template <bool kHasB>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const __m512i perm = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(perm, unpack<kHasB>(row, s)));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    scales_from_block_heads<34, false>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ4_K> {
  static constexpr int kHeadBytes = 0;
  static constexpr int kSub = 32, kOffset = 0;
  static constexpr bool kMin = true, kNibbleOrder = false;
  template <bool>
  static __m512i unpack(const uint8_t* row, int64_t s) {
    return nibbles_32(row + (s / 4) * 144 + 16 + 32 * (s % 4));
  }
  template <bool>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(row + (s / 4) * 144 + 16 + 32 * (s % 4)));
    const __m256i m = _mm256_set1_epi8(0x0f);
    _mm512_storeu_si512(dst, interleave_dwords(_mm256_and_si256(v, m),
                                               _mm256_and_si256(_mm256_srli_epi16(v, 4), m)));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    k4_scales<BlockQ4_K>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ5_K> {
  static constexpr int kHeadBytes = 0;
  static constexpr int kSub = 32, kOffset = 0;
  static constexpr bool kMin = true, kNibbleOrder = false;
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
  template <bool>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const uint8_t* blk = row + (s / 4) * 176;
    const int c = static_cast<int>(s % 4);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * c));
    const __m256i h = _mm256_srl_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)), _mm_cvtsi32_si128(2 * c));
    const uint64_t bits_a = _mm256_test_epi8_mask(h, _mm256_set1_epi8(1));
    const uint64_t bits_b = _mm256_test_epi8_mask(h, _mm256_set1_epi8(2));
    const uint64_t bits =
        _pdep_u64(bits_a, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(bits_b, 0xf0f0f0f0f0f0f0f0ull);
    const __m256i m = _mm256_set1_epi8(0x0f);
    const __m512i z =
        interleave_dwords(_mm256_and_si256(v, m), _mm256_and_si256(_mm256_srli_epi16(v, 4), m));
    _mm512_storeu_si512(dst,
                        _mm512_mask_add_epi8(z, _cvtu64_mask64(bits), z, _mm512_set1_epi8(16)));
  }
  static void scales(const uint8_t* row, int64_t nsub, float* dw, float* mw) {
    k4_scales<BlockQ5_K>(row, nsub, dw, mw);
  }
};

template <>
struct Weights<GgmlType::kQ6_K> {
  static constexpr int kHeadBytes = 0;
  static constexpr int kSub = 16, kOffset = 32;
  static constexpr bool kMin = false, kNibbleOrder = false;
  // Step s: elements 64 s' .. 64 s' + 63 of super-block s / 4 (s' = s % 4), i.e. half h = s' / 2,
  // groups 2 (s' & 1) and 2 (s' & 1) + 1: low bits are the low (s' even) or high (s' odd)
  // nibbles of ql[64 h .. 64 h + 64), high bits are (qh[32 h + l] >> 2 g) & 3.
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
  template <bool kHasB>
  static void store_pairs(const uint8_t* row, int64_t s, uint8_t* dst) {
    const __m512i perm = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(perm, unpack<kHasB>(row, s)));
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

}  // namespace avx512
}  // namespace detail
}  // namespace specdec
