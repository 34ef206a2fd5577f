// AVX2 matmul over packed (row-interleaved) weights, packed_weights.h, for any n (used below
// kPackedPanelMinRows rows; prefill keeps the tile kernel of matmul_avx2.cpp on the file's rows).
//
// The layout is the one the AVX-512 kernels read: blocks of 16 weight rows whose code vectors
// hold 4 bytes per row, row r at bytes 4r .. 4r+3 of a 64-byte vector. A 256-bit vector is one
// half of it: bytes [32 h, 32 h + 32) are the codes of rows 8h .. 8h+7. So a half block of 8
// rows is multiplied with one vector load per 4-element group (lane = weight row), each
// activation row's 4 codes of that group broadcast from memory (vpbroadcastd, a load uop), and
// no horizontal sums:
//   for each half h, sub-block b of 32 elements:
//     load / split its code vectors once, and the 8 scales (F16C),
//     for each activation row i (up to 8): 8 vpmaddubsw into s16 pair sums, one vpmaddwd to s32
//       (Q4_0 / Q4_1 / Q4_K: codes <= 15, |pair| <= 2 * 15 * 127, the 8 groups of a sub-block
//       add up in s16 without saturating; Q5_0 / Q5_1: codes <= 31 (nibble | 5th bit << 4),
//       widened after 4 groups; Q8_0: signed codes, |w| x sign(x, w) per group, |pair| <=
//       2 * 128 * 127, widened per group; Q6_K: codes <= 63 (nibble | 2 high bits << 4), two
//       groups per s16 sum, the first and the last 16 elements apart), then the float epilogue
//       of quant_kernels.h on 8 weight rows at once into the chain of b's parity (Q6_K: its
//       first 16 elements into the even chain, its last 16 into the odd one, with a scale and
//       an offset correction each, as GGML's two sub-blocks of 16).
// The weights are loaded once per sub-block for up to 8 activation rows; with one row the
// kernel streams the weights (software prefetch of the next block into L1, the fourth next into
// L2) and needs about half the instructions per weight of the row kernel (no unpacking of 8
// separate rows, no hadd tree, no scale gathering).
// Activations: quantized once per call (quantize_activations_avx2) and copied into tiles of 8 rows
// (qt [tiles, nsub, 8 groups, 8 rows, 4], as in the AVX-512 packed kernel); the threads claim
// blocks of 16 rows with StealingSplit.
// Bit-identical to the scalar reference: the integer sums are exact and the float sequence per
// output is the documented one.
//
// AVX-VNNI: this source is compiled a second time by matmul_packed_avxvnni.cpp with
// SPECDEC_PACKED_VNNI = 1 (and -mavxvnni) into packed_matmul_avxvnni. There each 4-byte group's
// u8 x s8 dot product and its add into the s32 sum are one vpdpbusd (no s16 pair sums, no
// vpmaddwd widening, no saturation limits), and Q8_0 multiplies its stored codes q + 128
// directly, taking 128 times the activations' sum off in the epilogue (as Q4_0's offset 8)
// instead of the |w| x sign(x, w) trick. The integer sums are the same, so are the results.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/stealing_split.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"

#ifndef SPECDEC_PACKED_VNNI
#define SPECDEC_PACKED_VNNI 0
#endif

namespace specdec {
namespace detail {
namespace {

constexpr bool kVnni = SPECDEC_PACKED_VNNI != 0;

// acc + the four-byte dot products of u8 lanes with s8 lanes (vpdpbusd); used only where kVnni.
#if SPECDEC_PACKED_VNNI
[[gnu::always_inline]] inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_dpbusd_avx_epi32(acc, u8, s8);
}
#else
[[noreturn]] inline __m256i dpbusd(__m256i, __m256i, __m256i) {
  __builtin_trap();
}
#endif

template <GgmlType T>
struct Packed {
  static constexpr PackedFormat kFormat = packed_format(T);
  static_assert(kFormat.code_bytes != 0, "no packed layout for this type");
  static constexpr bool kMin = kFormat.has_min, kEightBit = kFormat.eight_bit;
  static constexpr bool kFiveBit = kFormat.five_bit;
  static constexpr bool kSix = kFormat.six_bit;  // Q6_K: two sub-blocks of 16 per 32
  static constexpr int kCodeBytes = static_cast<int>(kFormat.code_bytes);
  // The code offset of the sub-block view (Q8_0 runs on signed codes on AVX2: no offset
  // correction; on AVX-VNNI on its stored codes q + 128).
  static constexpr int kOffset = T == GgmlType::kQ4_0            ? 8
                                 : T == GgmlType::kQ5_0          ? 16
                                 : T == GgmlType::kQ6_K          ? 32
                                 : T == GgmlType::kQ8_0 && kVnni ? 128
                                                                 : 0;
};

constexpr int64_t kMaxTile = 8;  // activation rows per pass over a half block

struct Acts {
  int64_t cols = 0;
  int64_t nsub = 0;
  int64_t tiles = 0;
  int8_t* q = nullptr;     // [n, cols] natural layout
  float* d = nullptr;      // [n, nsub]
  int32_t* s16 = nullptr;  // [n, 2 nsub]
  int8_t* qt = nullptr;    // [tiles, nsub, 8 groups, 8 rows, 4]
  float* dt = nullptr;     // [tiles, nsub, 8 rows]
  float* et = nullptr;     // [tiles, nsub, 8 rows]: float(S32) * d, or the int32 offset * S32
                           // (Q6_K: offset * S16 of the first 16 elements)
  float* et2 = nullptr;    // [tiles, nsub, 8 rows]: Q6_K only, offset * S16 of the last 16
};

// The 8 x 8 transpose of 32-bit groups: 8 rows' 32 codes of one sub-block (rows[r] == nullptr:
// a zero row) into [8 groups, 8 rows, 4].
inline void transpose_groups8(const int8_t* const rows[8], int8_t* qt) {
  __m256i r[8];
  for (int k = 0; k < 8; ++k) {
    r[k] = rows[k] != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k]))
                              : _mm256_setzero_si256();
  }
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  // u0: groups 0 (low lane) / 4 (high lane) of rows 0-3; u4 the same of rows 4-7; u1: 1 / 5 ...
  auto store = [&](int g, __m256i v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + 32 * g), v);
  };
  store(0, _mm256_permute2x128_si256(u0, u4, 0x20));
  store(4, _mm256_permute2x128_si256(u0, u4, 0x31));
  store(1, _mm256_permute2x128_si256(u1, u5, 0x20));
  store(5, _mm256_permute2x128_si256(u1, u5, 0x31));
  store(2, _mm256_permute2x128_si256(u2, u6, 0x20));
  store(6, _mm256_permute2x128_si256(u2, u6, 0x31));
  store(3, _mm256_permute2x128_si256(u3, u7, 0x20));
  store(7, _mm256_permute2x128_si256(u3, u7, 0x31));
}

// Sub-blocks [b0, b1) of all n activation rows: quantized (every 32-block on its own, so a
// range gives the bytes of a whole-row call) and copied into the tiles: by the 8 x 8 transpose
// where a tile has 4 rows or more (rows beyond n zero), by 4-byte copies otherwise (rows beyond
// n unset: a pass over R rows reads only its R rows).
template <GgmlType T>
void prepare_subblocks(const float* x, int64_t n, Acts& a, int64_t b0, int64_t b1) {
  using P = Packed<T>;
  if (b0 >= b1) return;
  const int64_t len = 32 * (b1 - b0);
  for (int64_t i = 0; i < n; ++i) {
    quantize_activations_avx2(x + i * a.cols + 32 * b0, len, a.q + i * a.cols + 32 * b0,
                              a.d + i * a.nsub + b0, a.s16 + i * 2 * a.nsub + 2 * b0);
  }
  for (int64_t t = 0; t * kMaxTile < n; ++t) {
    const int64_t rows = std::min<int64_t>(kMaxTile, n - t * kMaxTile);
    for (int64_t b = b0; b < b1; ++b) {
      int8_t* qt = a.qt + (t * a.nsub + b) * 256;
      if (rows >= 4) {
        const int8_t* src[kMaxTile];
        for (int64_t r = 0; r < kMaxTile; ++r) {
          src[r] = r < rows ? a.q + (t * kMaxTile + r) * a.cols + 32 * b : nullptr;
        }
        transpose_groups8(src, qt);
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          const int8_t* q = a.q + (t * kMaxTile + r) * a.cols + 32 * b;
          for (int64_t g = 0; g < 8; ++g) std::memcpy(qt + 32 * g + 4 * r, q + 4 * g, 4);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = t * kMaxTile + r;
        const int64_t at = (t * a.nsub + b) * kMaxTile + r;
        const float d = a.d[i * a.nsub + b];
        const int32_t s32 = a.s16[i * 2 * a.nsub + 2 * b] + a.s16[i * 2 * a.nsub + 2 * b + 1];
        a.dt[at] = d;
        if constexpr (P::kMin) {
          a.et[at] = static_cast<float>(s32) * d;
        } else if constexpr (P::kSix) {
          const int32_t corr_a = a.s16[i * 2 * a.nsub + 2 * b] * P::kOffset;
          const int32_t corr_b = a.s16[i * 2 * a.nsub + 2 * b + 1] * P::kOffset;
          std::memcpy(a.et + at, &corr_a, 4);
          std::memcpy(a.et2 + at, &corr_b, 4);
        } else {
          const int32_t corr = s32 * P::kOffset;
          std::memcpy(a.et + at, &corr, 4);
        }
      }
    }
  }
}

inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Q5_0 / Q5_1: the 5th bits (this half's 32 bytes of the vector hb, packed_weights.h) of code
// vector v added to its low- and high-nibble codes as bit 4, as avx512::fifth_bits: bit 2 v / 2 v
// + 1 of each byte, moved by immediate shifts within 16-bit lanes (bit 4 of either byte comes
// from the same byte for these distances).
[[gnu::always_inline]] inline void fifth_bits(__m256i hb, int v, __m256i* lo, __m256i* hi) {
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const __m256i l = v <= 2 ? _mm256_slli_epi16(hb, 4 - 2 * v) : _mm256_srli_epi16(hb, 2 * v - 4);
  const __m256i h = v <= 1 ? _mm256_slli_epi16(hb, 3 - 2 * v) : _mm256_srli_epi16(hb, 2 * v - 3);
  *lo = _mm256_or_si256(*lo, _mm256_and_si256(l, bit4));
  *hi = _mm256_or_si256(*hi, _mm256_and_si256(h, bit4));
}

// The float epilogue of one activation row: isum of 8 weight rows into facc.
template <GgmlType T>
inline __m256 epilogue(__m256i isum, __m256 dw, __m256 mw, const float* dt, const float* et,
                       __m256 facc) {
  using P = Packed<T>;
  if constexpr (!P::kMin && P::kOffset != 0) {
    int32_t corr;
    std::memcpy(&corr, et, 4);
    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(corr));
  }
  const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(dt));
  facc = _mm256_fmadd_ps(t, dw, facc);
  if constexpr (P::kMin) facc = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(et), facc);
  return facc;
}

// One sub-block of 8 weight rows (codes: this half's 32 bytes of the first code vector; code
// vectors are 64 bytes apart) against the first R rows of activation tile xt, into facc. The
// weights are split once and stay in registers (8 vectors) while the rows pass one by one; with
// 16 ymm registers that leaves room for one row's chain (rows interleaved by the compiler
// spilled every partial sum to the stack).
template <GgmlType T, int R>
[[gnu::always_inline]] inline void sub_block_forced(const uint8_t* codes, __m256 dw, __m256 mw,
                                                    const int8_t* xt, const float* dt,
                                                    const float* et, __m256* facc) {
  using P = Packed<T>;
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (P::kEightBit && kVnni) {
    // The stored codes q + 128 against x, the offset taken off in the epilogue. Groups in two
    // halves of 4, as below.
    __m256i part[R];
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      __m256i w[4];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        w[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 64 * (4 * half + k)));
      }
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        __m256i acc = half == 0 ? _mm256_setzero_si256() : part[i];
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k)
          acc = dpbusd(acc, w[k], bcast32(xt + 32 * (4 * half + k) + 4 * i));
        if (half == 0) {
          part[i] = acc;
        } else {
          facc[i] = epilogue<T>(acc, dw, mw, dt + i, et + i, facc[i]);
        }
      }
    }
  } else if constexpr (P::kEightBit) {
    // Codes are q + 128: back to signed q, then |q| x sign(x, q), widened per group. Groups in
    // two halves of 4 (8 registers of weights); the first half's sums wait in `part`.
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256i part[R];
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      __m256i w[4], aw[4];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        w[k] = _mm256_xor_si256(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 64 * (4 * half + k))), flip);
        aw[k] = _mm256_sign_epi8(w[k], w[k]);
      }
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        __m256i acc = half == 0 ? _mm256_setzero_si256() : part[i];
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m256i x = bcast32(xt + 32 * (4 * half + k) + 4 * i);
          acc = _mm256_add_epi32(
              acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[k], _mm256_sign_epi8(x, w[k])), ones));
        }
        if (half == 0) {
          part[i] = acc;
        } else {
          facc[i] = epilogue<T>(acc, dw, mw, dt + i, et + i, facc[i]);
        }
      }
    }
  } else {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i lo[4], hi[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 64 * v));
      lo[v] = _mm256_and_si256(raw, low);
      hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    }
    if constexpr (P::kFiveBit) {
      const __m256i hb = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 256));
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) fifth_bits(hb, v, &lo[v], &hi[v]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      if constexpr (kVnni) {  // two chains of 4 (4- and 5-bit codes alike: s32 sums)
        auto x = [&](int g) { return bcast32(xt + 32 * g + 4 * i); };
        const __m256i zero = _mm256_setzero_si256();
        const __m256i c0 = dpbusd(
            dpbusd(dpbusd(dpbusd(zero, lo[0], x(0)), hi[0], x(4)), lo[1], x(1)), hi[1], x(5));
        const __m256i c1 = dpbusd(
            dpbusd(dpbusd(dpbusd(zero, lo[2], x(2)), hi[2], x(6)), lo[3], x(3)), hi[3], x(7));
        facc[i] = epilogue<T>(_mm256_add_epi32(c0, c1), dw, mw, dt + i, et + i, facc[i]);
        continue;
      }
      __m256i s[4];
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        s[v] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[v], bcast32(xt + 32 * v + 4 * i)),
                                _mm256_maddubs_epi16(hi[v], bcast32(xt + 32 * (v + 4) + 4 * i)));
      }
      __m256i isum;
      if constexpr (P::kFiveBit) {
        // 5-bit codes: |one s[v]| <= 4 * 31 * 127, two add up in s16 (31,496), four would not:
        // widened in two halves.
        isum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(s[0], s[1]), ones),
                                _mm256_madd_epi16(_mm256_add_epi16(s[2], s[3]), ones));
      } else {
        isum = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_add_epi16(s[0], s[1]), _mm256_add_epi16(s[2], s[3])), ones);
      }
      facc[i] = epilogue<T>(isum, dw, mw, dt + i, et + i, facc[i]);
    }
  }
}

// The same, inlined or not as GCC chooses (the kernels that keep its choice; see block_rows).
template <GgmlType T, int R, typename... A>
inline void sub_block(A... a) {
  sub_block_forced<T, R>(a...);
}

// The codes (0..63) of code vector v of a Q6_K sub-block (packed_weights.h) from this half's
// 32 bytes of its nibble vector `raw` and of its high-bit vector `hb` (vector v % 2), as
// avx512::six_bit_codes: lo holds group v (the first 16 elements), hi group v + 4 (the last
// 16). The high bits of v are bits 0-1 / 2-3 (v < 2) or 4-5 / 6-7 (v >= 2) of each byte, moved
// to bits 4-5 by immediate shifts within 16-bit lanes (the bits that cross into the other byte
// are masked off).
template <int V>
[[gnu::always_inline]] inline void six_bit_codes(__m256i raw, __m256i hb, __m256i* lo,
                                                 __m256i* hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
  const __m256i hl = V < 2 ? _mm256_slli_epi16(hb, 4) : hb;
  const __m256i hh = V < 2 ? _mm256_slli_epi16(hb, 2) : _mm256_srli_epi16(hb, 2);
  *lo = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_and_si256(hl, m2));
  *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), _mm256_and_si256(hh, m2));
}

// sub_block for Q6_K (8 weight rows, codes: this half's 32 bytes of the first code vector): the
// first 16 elements of the sub-block (GGML's even sub-block of 16, scale dwa, correction et)
// into the even chain fa, the last 16 (dwb, et2) into the odd one fb, as avx512's
// sub_block_six (quant_kernels.h: acc[b & 1] over sub-blocks of 16). 6-bit codes: |one
// vpmaddubsw lane| <= 2 * 63 * 128 = 16,128, so two of them add up in s16 (32,256) and each
// half of 16 elements is widened as two pairs of groups.
template <int R>
inline void sub_block_six(const uint8_t* codes, __m256 dwa, __m256 dwb, const int8_t* xt,
                          const float* dt, const float* et, const float* et2, __m256* fa,
                          __m256* fb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo[4], hi[4];
  {
    const __m256i hb0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 256));
    const __m256i hb1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 320));
    auto raw = [&](int v) {
      return _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 64 * v));
    };
    six_bit_codes<0>(raw(0), hb0, &lo[0], &hi[0]);
    six_bit_codes<1>(raw(1), hb1, &lo[1], &hi[1]);
    six_bit_codes<2>(raw(2), hb0, &lo[2], &hi[2]);
    six_bit_codes<3>(raw(3), hb1, &lo[3], &hi[3]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    auto pair = [&](const __m256i* w, int g) {  // groups g, g + 1 against w[0], w[1], to s32
      if constexpr (kVnni) {
        return dpbusd(dpbusd(_mm256_setzero_si256(), w[0], bcast32(xt + 32 * g + 4 * i)), w[1],
                      bcast32(xt + 32 * (g + 1) + 4 * i));
      }
      return _mm256_madd_epi16(
          _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast32(xt + 32 * g + 4 * i)),
                           _mm256_maddubs_epi16(w[1], bcast32(xt + 32 * (g + 1) + 4 * i))),
          ones);
    };
    const __m256i acc_a = _mm256_add_epi32(pair(lo, 0), pair(lo + 2, 2));
    const __m256i acc_b = _mm256_add_epi32(pair(hi, 4), pair(hi + 2, 6));
    int32_t ca, cb;
    std::memcpy(&ca, et + i, 4);
    std::memcpy(&cb, et2 + i, 4);
    const __m256 dx = _mm256_broadcast_ss(dt + i);
    const __m256 ta =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc_a, _mm256_set1_epi32(ca))), dx);
    const __m256 tb =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc_b, _mm256_set1_epi32(cb))), dx);
    fa[i] = _mm256_fmadd_ps(ta, dwa, fa[i]);
    fb[i] = _mm256_fmadd_ps(tb, dwb, fb[i]);
  }
}

// dw / mw of sub-block b for rows 8h .. 8h+7; Q6_K: the scales of its first and its last 16
// elements.
template <GgmlType T>
[[gnu::always_inline]] inline void sub_block_scales_forced(const uint8_t* blk, int64_t nsub,
                                                           int64_t b, int h, __m256* dw,
                                                           __m256* mw) {
  using P = Packed<T>;
  const uint8_t* scales = blk + nsub * P::kCodeBytes;
  if constexpr (P::kSix) {  // Q6_K: d * sc[2 j], d * sc[2 j + 1], as avx512's
    const uint8_t* head = scales + (b / kSuperSubs) * P::kFormat.super_head_bytes;
    const int64_t j = b % kSuperSubs;
    auto bytes = [&](int64_t at) {
      return _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(head + at))));
    };
    const __m256 d =
        _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(head + 16 * h)));
    *dw = _mm256_mul_ps(d, bytes(32 + 32 * j + 8 * h));
    *mw = _mm256_mul_ps(d, bytes(48 + 32 * j + 8 * h));
    return;
  }
  if constexpr (P::kFormat.super()) {  // Q4_K: dw = d * sc[j], mw = -(dmin * mn[j]), rows 8h..
    const uint8_t* head = scales + (b / kSuperSubs) * P::kFormat.super_head_bytes;
    const int64_t j = b % kSuperSubs;
    auto bytes = [&](int64_t at) {
      return _mm256_cvtepi32_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(head + at))));
    };
    const __m256 d =
        _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(head + 16 * h)));
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(head + 32 + 16 * h)));
    *dw = _mm256_mul_ps(d, bytes(64 + 16 * j + 8 * h));
    *mw = _mm256_xor_ps(_mm256_mul_ps(dmin, bytes(192 + 16 * j + 8 * h)), _mm256_set1_ps(-0.0f));
    return;
  }
  *dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + 32 * b + 16 * h)));
  if constexpr (P::kMin) {
    *mw = _mm256_cvtph_ps(
        _mm_load_si128(reinterpret_cast<const __m128i*>(scales + 32 * (nsub + b) + 16 * h)));
  } else {
    *mw = *dw;
  }
}

// The same, inlined or not as GCC chooses.
template <GgmlType T, typename... A>
inline void sub_block_scales(A... a) {
  sub_block_scales_forced<T>(a...);
}

// The kernels whose step block_rows inlines with all its callees (step_inline); the others
// keep GCC's choice of inlining: Q5_0 / Q5_1 (their 5th-bit planes need more registers;
// 0.9x inlined in a first try) and one row of Q4_K (0.86x).
template <GgmlType T, int R>
constexpr bool kInlineStep = !Packed<T>::kFiveBit && !(T == GgmlType::kQ4_K && R == 1);

// Sub-block b of one half (h) of a block: its scales and its products with R activation rows
// into facc, everything inlined.
template <GgmlType T, int R>
[[gnu::always_inline]] inline void step_inline(const uint8_t* blk, int64_t nsub, int64_t b, int h,
                                               const int8_t* xt, const float* dt, const float* et,
                                               __m256* facc) {
  __m256 dw, mw;
  sub_block_scales_forced<T>(blk, nsub, b, h, &dw, &mw);
  sub_block_forced<T, R>(blk + b * Packed<T>::kCodeBytes + 32 * h, dw, mw, xt + b * 256,
                         dt + b * kMaxTile, et + b * kMaxTile, facc);
}

// Block `blk` of 16 weight rows (the first `valid` real) against activation rows [i0, i0 + R)
// (R <= 8, i0 a multiple of 8), one half of 8 rows after the other; y rows are ldy floats apart,
// this block's outputs start at column col0. While the first half runs, two later blocks are
// prefetched in step with it: `near` into L1 and `far` into L2 (null: none).
template <GgmlType T, int R>
void block_rows(const uint8_t* blk, int64_t block_bytes, const Acts& a, int64_t i0, float* y,
                int64_t ldy, int64_t col0, int64_t valid, const uint8_t* near, const uint8_t* far) {
  using P = Packed<T>;
  const int64_t nsub = a.nsub;
  const int64_t tile = i0 / kMaxTile;
  const int8_t* xt = a.qt + tile * nsub * 256;
  const float* dt = a.dt + tile * nsub * kMaxTile;
  const float* et = a.et + tile * nsub * kMaxTile;
  const float* et2 = P::kSix ? a.et2 + tile * nsub * kMaxTile : nullptr;
  // The prefetches are spread over the sub-block steps of both halves: a steady stream of
  // requests. Issued in the first half only (a burst, then nothing while the second half runs),
  // AVX2 decode of Qwen2.5-0.5B (weights from DRAM; Emerald Rapids, 10 alternated pairs) reached
  // 0.65 of the measured bandwidth instead of 0.73.
  const int64_t pf_steps = valid > 8 ? 2 * nsub : nsub;
  const int64_t pf_lines = (block_bytes / 64 + pf_steps - 1) / pf_steps;
  int64_t pf_at = 0;
  auto prefetch = [&] {
    if (near == nullptr && far == nullptr) return;
    for (int64_t l = 0; l < pf_lines && pf_at < block_bytes; ++l, pf_at += 64) {
      if (near != nullptr) _mm_prefetch(reinterpret_cast<const char*>(near + pf_at), _MM_HINT_T0);
      if (far != nullptr) _mm_prefetch(reinterpret_cast<const char*>(far + pf_at), _MM_HINT_T1);
    }
  };
  for (int h = 0; h < 2; ++h) {
    if (8 * h >= valid) break;
    __m256 even[R], odd[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) even[i] = odd[i] = _mm256_setzero_ps();
    if constexpr (P::kSix) {  // both chains in every sub-block (its two halves of 16)
      for (int64_t b = 0; b < nsub; ++b) {
        __m256 dwa, dwb;
        prefetch();
        sub_block_scales<T>(blk, nsub, b, h, &dwa, &dwb);
        const int64_t at = b * kMaxTile;
        sub_block_six<R>(blk + b * P::kCodeBytes + 32 * h, dwa, dwb, xt + b * 256, dt + at, et + at,
                         et2 + at, even, odd);
      }
    } else {
      // How a step is compiled (kInlineStep). Left to GCC, the steps became calls whose
      // accumulators went through memory at every sub-block. Inlined with its callees
      // (step_inline; one thread, L2-resident 1536 x 576, address randomization off, against
      // GCC's choice), 1 / 2 / 4 / 8 rows of Q4_1 ran 1.55 / 1.40 / 1.26 / 1.16x faster, Q8_0
      // 1.62 / 1.34 / 1.21 / 1.16x, Q4_K (2-8 rows) 1.2-1.6x.
      if constexpr (kInlineStep<T, R>) {
        int64_t b = 0;
        for (; b + 2 <= nsub; b += 2) {
          prefetch();
          step_inline<T, R>(blk, nsub, b, h, xt, dt, et, even);
          prefetch();
          step_inline<T, R>(blk, nsub, b + 1, h, xt, dt, et, odd);
        }
        if (b < nsub) {
          prefetch();
          step_inline<T, R>(blk, nsub, b, h, xt, dt, et, even);
        }
      } else {
        auto step = [&](int64_t b, __m256* facc) {
          __m256 dw, mw;
          prefetch();
          sub_block_scales<T>(blk, nsub, b, h, &dw, &mw);
          sub_block<T, R>(blk + b * P::kCodeBytes + 32 * h, dw, mw, xt + b * 256,
                          dt + b * kMaxTile, et + b * kMaxTile, facc);
        };
        int64_t b = 0;
        for (; b + 2 <= nsub; b += 2) {
          step(b, even);
          step(b + 1, odd);
        }
        if (b < nsub) step(b, even);
      }
    }
    const int64_t here = std::min<int64_t>(8, valid - 8 * h);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m256 sum = _mm256_add_ps(even[i], odd[i]);
      float* row = y + (i0 + i) * ldy + col0 + 8 * h;
      if (here == 8) {
        _mm256_storeu_ps(row, sum);
      } else {
        alignas(32) float out[8];
        _mm256_store_ps(out, sum);
        for (int64_t p = 0; p < here; ++p) row[p] = out[p];
      }
    }
  }
}

// Prefetch distances of the block stream, in blocks: one ahead into L1, four ahead into L2 (as
// in the AVX-512 kernel). On the 2-vCPU EPYC (paired A/B in one process, model-shaped pass):
// 2 / 8 blocks ahead into L2, 2 into L1, or the L2 prefetch for 8-row passes as well all
// measured within +-2% of this.
constexpr int kNearBlocks = 1;
constexpr int kFarBlocks = 4;

template <GgmlType T>
void one_block(const WeightMatrix& w, const Acts& a, int64_t n, float* y,
               const StealingSplit::Claim& c) {
  const int64_t bb = w.packed_block_bytes;
  auto block = [&](int64_t k) { return k < 0 ? nullptr : w.packed + k * bb; };
  const uint8_t* blk = block(c.item);
  const uint8_t* near = block(c.after(kNearBlocks));
  const uint8_t* far = n >= kMaxTile ? nullptr : block(c.after(kFarBlocks));
  const int64_t col0 = c.item * kPackRows;
  const int64_t valid = std::min<int64_t>(kPackRows, w.rows - col0);
  int64_t i0 = 0;
  for (; i0 + kMaxTile <= n; i0 += kMaxTile) {
    block_rows<T, kMaxTile>(blk, bb, a, i0, y, w.rows, col0, valid, near, far);
    near = far = nullptr;
  }
  using Tail = void (*)(const uint8_t*, int64_t, const Acts&, int64_t, float*, int64_t, int64_t,
                        int64_t, const uint8_t*, const uint8_t*);
  static constexpr Tail kTails[kMaxTile] = {nullptr,          block_rows<T, 1>, block_rows<T, 2>,
                                            block_rows<T, 3>, block_rows<T, 4>, block_rows<T, 5>,
                                            block_rows<T, 6>, block_rows<T, 7>};
  if (i0 < n) kTails[n - i0](blk, bb, a, i0, y, w.rows, col0, valid, near, far);
}

template <int kHint>
void prefetch_range(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + at), static_cast<_mm_hint>(kHint));
  }
}

template <int kHint>
void prefetch_block(const WeightMatrix& w, int64_t k) {
  if (k >= 0) prefetch_range<kHint>(w.packed + k * w.packed_block_bytes, w.packed_block_bytes);
}

template <GgmlType T>
void blocks_split(const WeightMatrix& w, const Acts& a, int64_t n, float* y, StealingSplit& split,
                  int ti) {
  bool first = true;
  for (StealingSplit::Claim c = split.next(ti); c.item >= 0; c = split.next(ti)) {
    if (first) {
      prefetch_block<_MM_HINT_T0>(w, c.after(kNearBlocks));
      for (int k = kNearBlocks + 1; k < kFarBlocks; ++k) prefetch_block<_MM_HINT_T1>(w, c.after(k));
      first = false;
    }
    one_block<T>(w, a, n, y, c);
  }
}

template <GgmlType T>
void packed_matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  Acts a;
  a.cols = w.cols;
  a.nsub = w.cols / 32;
  a.tiles = (n + kMaxTile - 1) / kMaxTile;
  auto r64 = [](int64_t v) { return static_cast<size_t>((v + 63) / 64 * 64); };
  const size_t q_bytes = r64(n * a.cols);
  const size_t d_bytes = r64(n * a.nsub * 4);
  const size_t qt_bytes = r64(a.tiles * a.nsub * 256);
  const size_t t_bytes = r64(a.tiles * a.nsub * kMaxTile * 4);
  auto* mem = static_cast<uint8_t*>(
      thread_scratch(kScratchActivations).get(q_bytes + 3 * d_bytes + qt_bytes + 3 * t_bytes));
  a.q = reinterpret_cast<int8_t*>(mem);
  a.d = reinterpret_cast<float*>(mem += q_bytes);
  a.s16 = reinterpret_cast<int32_t*>(mem += d_bytes);  // 2 d_bytes
  a.qt = reinterpret_cast<int8_t*>(mem += 2 * d_bytes);
  a.dt = reinterpret_cast<float*>(mem += qt_bytes);
  a.et = reinterpret_cast<float*>(mem += t_bytes);
  a.et2 = reinterpret_cast<float*>(mem += t_bytes);

  const int64_t blocks = (w.rows + kPackRows - 1) / kPackRows;
  if (pool == nullptr || pool->size() == 1) {
    prepare_subblocks<T>(x, n, a, 0, a.nsub);
    StealingSplit split(blocks, 1);
    blocks_split<T>(w, a, n, y, split, 0);
    return;
  }
  StealingSplit split(blocks, pool->size());
  std::atomic<int> ready{0};
  if (n <= 4) {
    // Few rows: thread 0 quantizes them while the others wake up; they wait for its flag.
    pool->run([&](int ti, int) {
      if (ti == 0) {
        prepare_subblocks<T>(x, n, a, 0, a.nsub);
        ready.store(1, std::memory_order_release);
      } else {
        pool->wait_for_flag(ready, 0);
      }
      blocks_split<T>(w, a, n, y, split, ti);
    });
    return;
  }
  // More rows: every thread prepares a share of the sub-blocks of all rows, then all wait for
  // the last one.
  std::atomic<int> arrived{0};
  pool->run([&](int ti, int nt) {
    prepare_subblocks<T>(x, n, a, a.nsub * ti / nt, a.nsub * (ti + 1) / nt);
    pool->arrive_and_wait(arrived, ready, ti, nt);
    blocks_split<T>(w, a, n, y, split, ti);
  });
}

}  // namespace

#if SPECDEC_PACKED_VNNI
void packed_matmul_avxvnni(const WeightMatrix& w, const float* x, int64_t n, float* y,
                           ThreadPool* pool) {
#else
void packed_matmul_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y,
                        ThreadPool* pool) {
#endif
  switch (w.type) {
    case GgmlType::kQ4_0:
      return packed_matmul<GgmlType::kQ4_0>(w, x, n, y, pool);
    case GgmlType::kQ4_1:
      return packed_matmul<GgmlType::kQ4_1>(w, x, n, y, pool);
    case GgmlType::kQ8_0:
      return packed_matmul<GgmlType::kQ8_0>(w, x, n, y, pool);
    case GgmlType::kQ4_K:
      return packed_matmul<GgmlType::kQ4_K>(w, x, n, y, pool);
    case GgmlType::kQ5_0:
      return packed_matmul<GgmlType::kQ5_0>(w, x, n, y, pool);
    case GgmlType::kQ5_1:
      return packed_matmul<GgmlType::kQ5_1>(w, x, n, y, pool);
    case GgmlType::kQ6_K:
      return packed_matmul<GgmlType::kQ6_K>(w, x, n, y, pool);
    default:
      SPECDEC_CHECK(false, "packed_matmul_avx2: type has no packed layout it reads");
  }
}

#if !SPECDEC_PACKED_VNNI  // one prefetch for both levels
void packed_prefetch_avx2(const WeightMatrix& w, int ti, int nt, int64_t max_bytes) {
  const int64_t blocks = (w.rows + kPackRows - 1) / kPackRows;
  const int64_t first = StealingSplit::stretch_begin(blocks, ti, nt);
  const int64_t end = StealingSplit::stretch_begin(blocks, ti + 1, nt);
  prefetch_range<_MM_HINT_T1>(w.packed + first * w.packed_block_bytes,
                              std::min(max_bytes, (end - first) * w.packed_block_bytes));
}
#endif

}  // namespace detail
}  // namespace specdec
