// AVX-512 VNNI matmul over packed (row-interleaved) weights, packed_weights.h, for any n.
//
// One block of 16 weight rows is processed against up to 8 activation rows at a time:
//   for each sub-block b of 32 elements:
//     unpack its 8 code vectors (lane r = weight row r, 4 codes each) and the 16 scales once,
//     for each activation row i: 8 vpdpbusd, each with the row's 4 codes of one group
//       broadcast from memory by vpbroadcastd (a load-port uop, not a shuffle; measured ~10%
//       faster than an embedded {1to16} operand), then the float
//       epilogue of quant_kernels.h on 16 weight rows at once, into the chain of b's parity.
// A full pass of 8 rows runs the token-pair form instead (sub_block_pairs): each code vector
// is spread over two vectors whose lanes are (weight row, token of a pair), so one 8-byte
// broadcast feeds two dot products. The 8-row kernel issues one broadcast load per dot product
// otherwise, and 512-bit loads run ~1.2 per cycle on the test machine: the pair form trades 32
// of its 64 broadcasts for 16 in-lane unpacks and measures 0.93-0.95x the time in the hot loop
// (L2-resident weights, one thread), 0.96-0.98x of an 8-token forward pass and 0.92x of a
// 16-token one (paired A/B). For 2-6 rows the unpacks cost what the loads save (2 rows: 1.09x).
// The spreading is now done by duplicating loads (vmovsldup / vmovshdup, load-port uops) in
// place of the shuffles, a further 0.93-0.97x (8-bit codes) and 0.976x (nibbles) in the hot loop.
// No horizontal sums: the activation rows are quantized once per call
// (quantize_activations_avx512) and copied into tiles of 8 rows (Acts) so that every broadcast
// of a pass comes from one pointer at a constant offset (with 5 or more rows each thread prepares
// a share of the sub-blocks, then they meet at a flag inside the matmul's one job). The weights
// stay in registers across the activation rows, so k rows cost k x (8 dot products + 4 float
// ops) per 32 x 16 weights plus one unpack; with one row the kernel streams the weights at
// memory speed (software prefetch: the next block into L1, the fourth next into L2 below 8
// rows). The threads claim blocks one at a time (stealing_split.h): each walks its own stretch
// and then helps whichever is behind.
// Bit-identical to the scalar reference: the integer sums are exact and the float sequence per
// output is the documented one.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "backend/cpu/ops.h"  // swiglu
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_weights_avx512.h"  // <immintrin.h> and the vpdpbusd wrapper
#include "backend/cpu/stealing_split.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {
namespace detail {
namespace {

// acc += u8 codes x (the 4 signed bytes at p, broadcast to every lane).
inline __m512i dpbusd_bcast(__m512i acc, __m512i u8, const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return avx512::dpbusd(acc, u8, _mm512_set1_epi32(v));
}

// The layout facts of packed_weights.h plus the code offset of the sub-block view (the same
// as for the unpacked kernels).
template <GgmlType T>
struct Packed {
  static constexpr PackedFormat kFormat = packed_format(T);
  static_assert(kFormat.code_bytes != 0, "no packed layout for this type");
  static constexpr bool kMin = kFormat.has_min, kEightBit = kFormat.eight_bit;
  static constexpr bool kSix = kFormat.six_bit;    // Q6_K: two sub-blocks of 16 per 32
  static constexpr bool kFive = kFormat.five_bit;  // Q5_0 / Q5_1: a 5th bit per code
  static constexpr int kCodeBytes = static_cast<int>(kFormat.code_bytes);
  static constexpr int kOffset = avx512::Weights<T>::kOffset;
};

constexpr int64_t kMaxTile = 8;  // activation rows per pass over a block of weights

// Quantized activation rows, re-laid out in tiles of 8 rows so that every broadcast of a pass
// comes from one pointer at a constant offset (no per-row address registers):
//   qt [tiles, nsub, 8 groups, 8 rows, 4]  the 4 codes of (row, sub-block, group)
//   dt [tiles, nsub, 8 rows]               activation scale of the sub-block's 32-block
//   et [tiles, nsub, 8 rows]               min types: float(S32) * d; offset types: the int32
//                                          correction offset * S32 (bit pattern in a float slot);
//                                          Q6_K: offset * S16 of the first 16 elements
//   et2 [tiles, nsub, 8 rows]              Q6_K only: offset * S16 of the last 16
// Rows of the last tile beyond n are left unset: a pass over R < 8 rows reads only its R rows.
struct Acts {
  int64_t cols = 0;
  int64_t nsub = 0;
  int64_t tiles = 0;
  int8_t* q = nullptr;     // [n, cols] natural layout (quantize_activations_avx512)
  float* d = nullptr;      // [n, nsub]
  int32_t* s16 = nullptr;  // [n, 2 nsub]
  int8_t* qt = nullptr;
  float* dt = nullptr;
  float* et = nullptr;
  float* et2 = nullptr;
};

// The 8 x 8 transpose of 32-bit groups that turns 8 rows' codes of one sub-block
// (row r: 32 bytes at rows[r], nullptr: a zero row) into the tile layout [8 groups, 8 rows, 4].
inline void transpose_groups8(const int8_t* const rows[8], int8_t* qt) {
  __m512i pair[4];  // lanes 0-7: row 2k's 8 groups, lanes 8-15: row 2k + 1's
  for (int k = 0; k < 4; ++k) {
    auto row = [&](int r) {
      return rows[r] != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r]))
                                : _mm256_setzero_si256();
    };
    pair[k] = _mm512_inserti64x4(_mm512_castsi256_si512(row(2 * k)), row(2 * k + 1), 1);
  }
  // Step 1, lane 4 g + j = group g (0..3, or 4..7 for hi) of row j of the four rows in (a, b).
  const __m512i lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
  const __m512i t0 = _mm512_permutex2var_epi32(pair[0], lo, pair[1]);  // groups 0-3, rows 0-3
  const __m512i t1 = _mm512_permutex2var_epi32(pair[0], hi, pair[1]);  // groups 4-7, rows 0-3
  const __m512i u0 = _mm512_permutex2var_epi32(pair[2], lo, pair[3]);  // groups 0-3, rows 4-7
  const __m512i u1 = _mm512_permutex2var_epi32(pair[2], hi, pair[3]);  // groups 4-7, rows 4-7
  // Step 2: two whole groups (8 rows each) per vector.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  _mm512_storeu_si512(qt + 0, _mm512_permutex2var_epi32(t0, first, u0));
  _mm512_storeu_si512(qt + 64, _mm512_permutex2var_epi32(t0, second, u0));
  _mm512_storeu_si512(qt + 128, _mm512_permutex2var_epi32(t1, first, u1));
  _mm512_storeu_si512(qt + 192, _mm512_permutex2var_epi32(t1, second, u1));
}

// Sub-blocks [b0, b1) of all n activation rows (x: [n, cols], or with glu [n, 2 cols] whose
// row is swiglu(gate, up) of its halves, formed here segment by segment into thread scratch;
// swiglu is element-wise, so a segment gives the floats of a whole-row call): quantized (natural
// layout; every 32-block is quantized on its own, so a range gives the bytes of a whole-row
// call) and copied into the tiles: by an 8 x 8 transpose where a tile has 4 rows or more (rows
// beyond n zero), by 4-byte copies for the one or two rows of a decode step (rows beyond n unset).
template <GgmlType T>
void prepare_subblocks(const float* x, bool glu, int64_t n, Acts& a, int64_t b0, int64_t b1) {
  using P = Packed<T>;
  if (b0 >= b1) return;
  const int64_t len = 32 * (b1 - b0);
  float* act =
      glu ? static_cast<float*>(thread_scratch(kScratchExtra)
                                    .get(static_cast<size_t>(len) * sizeof(float)))  // [len]
          : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const float* src = x + i * (glu ? 2 : 1) * a.cols + 32 * b0;
    if (glu) {
      swiglu(src, src + a.cols, len, act);
      src = act;
    }
    quantize_activations_avx512(src, len, a.q + i * a.cols + 32 * b0, a.d + i * a.nsub + b0,
                                a.s16 + i * 2 * a.nsub + 2 * b0);
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
      } else {  // a decode step's row or two: 8 groups each, the rest of the tile unset
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

// One sub-block of 16 weight rows (codes at `codes`, scales dw / mw) against the first R rows
// of activation tile xt (its sub-block: 256 bytes of codes, 8 scales at dt / et), into facc.
// The R integer chains are interleaved group by group so that vpdpbusd's latency is hidden;
// each loaded nibble vector gives two groups, so only two weight vectors are live at a time.
template <GgmlType T, int R>
[[gnu::always_inline]] inline void sub_block_forced(const uint8_t* codes, __m512 dw, __m512 mw,
                                                    const int8_t* xt, const float* dt,
                                                    const float* et, __m512 facc[R]) {
  using P = Packed<T>;
  __m512i acc[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_si512();
  if constexpr (P::kEightBit) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i w = _mm512_load_si512(codes + 64 * g);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) acc[i] = dpbusd_bcast(acc[i], w, xt + 32 * g + 4 * i);
    }
  } else {
    const __m512i low = _mm512_set1_epi8(0x0f);
    [[maybe_unused]] const __m512i hb = P::kFive ? _mm512_load_si512(codes + 256) : low;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i raw = _mm512_load_si512(codes + 64 * v);
      __m512i lo = _mm512_and_si512(raw, low);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      if constexpr (P::kFive) avx512::fifth_bits(hb, v, &lo, &hi);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) acc[i] = dpbusd_bcast(acc[i], lo, xt + 32 * v + 4 * i);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) acc[i] = dpbusd_bcast(acc[i], hi, xt + 32 * (v + 4) + 4 * i);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    if constexpr (!P::kMin) {
      int32_t corr;
      std::memcpy(&corr, et + i, 4);
      acc[i] = _mm512_sub_epi32(acc[i], _mm512_set1_epi32(corr));
    }
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i]), _mm512_set1_ps(dt[i]));
    facc[i] = _mm512_fmadd_ps(t, dw, facc[i]);
    if constexpr (P::kMin) facc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(et[i]), facc[i]);
  }
}

// The same, inlined or not as GCC chooses (the kernels that keep its choice; see block_rows).
template <GgmlType T, int R, typename... A>
inline void sub_block(A... a) {
  sub_block_forced<T, R>(a...);
}

// Token-pair variant of sub_block for an even number of activation rows R = 2 NP: a lane holds
// (weight row, token) pairs, so that one 8-byte broadcast (the codes of tokens 2p and 2p + 1)
// feeds 16 lanes of two tokens and a pass needs half the broadcast loads. Each code vector is
// loaded twice, by vmovsldup (h = 0: rows {4k, 4k + 2} of every 128-bit lane k, each twice) and
// vmovshdup (h = 1: rows {4k + 1, 4k + 3}): both are plain load-port uops, where duplicating a
// vector already in a register (unpacklo / unpackhi) takes a shuffle-port uop from the one
// port the dot products share with it (hot loop, one thread: 8-bit codes 0.93-0.97x the time
// of the register unpacks, nibbles 0.976x; bit-identical). Nibble codes are split after the
// duplicating load (two masks and one shift per half). The even lane of a pair is token 2p, the
// odd one token 2p + 1. facc[h NP + p] follows the same lane order. Per (row, token) the
// integer sums and the float sequence are those of sub_block.
template <GgmlType T, int NP>
inline void sub_block_pairs(const uint8_t* codes, __m512 dw, __m512 mw, const int8_t* xt,
                            const float* dt, const float* et, __m512 facc[2 * NP]) {
  using P = Packed<T>;
  __m512i acc[2][NP];
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) acc[0][p] = acc[1][p] = _mm512_setzero_si512();
  auto pair = [](const void* src) {  // the 8 bytes at src in every 64-bit lane
    int64_t v;
    std::memcpy(&v, src, 8);
    return _mm512_set1_epi64(v);
  };
  // The even (h = 0) and odd (h = 1) dwords of the 64 bytes at src, each twice.
  auto dup = [](const uint8_t* src, int h) {
    const __m512 v = _mm512_load_ps(reinterpret_cast<const float*>(src));
    return _mm512_castps_si512(h == 0 ? _mm512_moveldup_ps(v) : _mm512_movehdup_ps(v));
  };
  // Halves w0 (h = 0) and w1 (h = 1) of a code vector against group g of every token pair.
  auto group = [&](__m512i w0, __m512i w1, int g) {
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512i x = pair(xt + 32 * g + 8 * p);
      acc[0][p] = avx512::dpbusd(acc[0][p], w0, x);
      acc[1][p] = avx512::dpbusd(acc[1][p], w1, x);
    }
  };
  if constexpr (P::kEightBit) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) group(dup(codes + 64 * g, 0), dup(codes + 64 * g, 1), g);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i d0 = dup(codes + 64 * v, 0);
      const __m512i d1 = dup(codes + 64 * v, 1);
      __m512i lo0 = _mm512_and_si512(d0, low), lo1 = _mm512_and_si512(d1, low);
      __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(d0, 4), low);
      __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(d1, 4), low);
      if constexpr (P::kFive) {
        avx512::fifth_bits(dup(codes + 256, 0), v, &lo0, &hi0);
        avx512::fifth_bits(dup(codes + 256, 1), v, &lo1, &hi1);
      }
      group(lo0, lo1, v);
      group(hi0, hi1, v + 4);
    }
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512 dh = h == 0 ? _mm512_moveldup_ps(dw) : _mm512_movehdup_ps(dw);
    const __m512 mh = h == 0 ? _mm512_moveldup_ps(mw) : _mm512_movehdup_ps(mw);
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      if constexpr (!P::kMin) acc[h][p] = _mm512_sub_epi32(acc[h][p], pair(et + 2 * p));
      const __m512 t =
          _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][p]), _mm512_castsi512_ps(pair(dt + 2 * p)));
      facc[h * NP + p] = _mm512_fmadd_ps(t, dh, facc[h * NP + p]);
      if constexpr (P::kMin) {
        facc[h * NP + p] =
            _mm512_fmadd_ps(mh, _mm512_castsi512_ps(pair(et + 2 * p)), facc[h * NP + p]);
      }
    }
  }
}

// The codes (0..63) of code vector v of a Q6_K sub-block (packed_weights.h) from its nibble
// vector `raw` and its high-bit vector `hb` (already shifted right by 4 for v >= 2): lo holds
// group v (first 16 elements), hi group v + 4 (last 16).
inline void six_bit_codes(__m512i raw, __m512i hb, __m512i* lo, __m512i* hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30);
  *lo = _mm512_or_si512(_mm512_and_si512(raw, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m2));
  *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m4),
                        _mm512_and_si512(_mm512_slli_epi16(hb, 2), m2));
}

// sub_block for Q6_K: the first 16 elements of the sub-block (GGML's even sub-block of 16,
// scale dwa, correction et) into the even chain fa, the last 16 (dwb, et2) into the odd one fb
// (quant_kernels.h: acc[b & 1] over sub-blocks of 16).
template <int R>
inline void sub_block_six(const uint8_t* codes, __m512 dwa, __m512 dwb, const int8_t* xt,
                          const float* dt, const float* et, const float* et2, __m512 fa[R],
                          __m512 fb[R]) {
  __m512i acc_a[R], acc_b[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) acc_a[i] = acc_b[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    __m512i hb = _mm512_load_si512(codes + 256 + 64 * (v % 2));
    if (v >= 2) hb = _mm512_srli_epi16(hb, 4);
    __m512i lo, hi;
    six_bit_codes(_mm512_load_si512(codes + 64 * v), hb, &lo, &hi);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) acc_a[i] = dpbusd_bcast(acc_a[i], lo, xt + 32 * v + 4 * i);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) acc_b[i] = dpbusd_bcast(acc_b[i], hi, xt + 32 * (v + 4) + 4 * i);
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    int32_t ca, cb;
    std::memcpy(&ca, et + i, 4);
    std::memcpy(&cb, et2 + i, 4);
    const __m512 dx = _mm512_set1_ps(dt[i]);
    const __m512 ta =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc_a[i], _mm512_set1_epi32(ca))), dx);
    const __m512 tb =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc_b[i], _mm512_set1_epi32(cb))), dx);
    fa[i] = _mm512_fmadd_ps(ta, dwa, fa[i]);
    fb[i] = _mm512_fmadd_ps(tb, dwb, fb[i]);
  }
}

// sub_block_pairs for Q6_K (R = 2 NP rows in token pairs, lanes as there): the first 16
// elements into fa, the last 16 into fb, as sub_block_six.
template <int NP>
inline void sub_block_six_pairs(const uint8_t* codes, __m512 dwa, __m512 dwb, const int8_t* xt,
                                const float* dt, const float* et, const float* et2,
                                __m512 fa[2 * NP], __m512 fb[2 * NP]) {
  __m512i acc_a[2][NP], acc_b[2][NP];
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    acc_a[0][p] = acc_a[1][p] = acc_b[0][p] = acc_b[1][p] = _mm512_setzero_si512();
  }
  auto pair = [](const void* src) {
    int64_t v;
    std::memcpy(&v, src, 8);
    return _mm512_set1_epi64(v);
  };
  auto dup = [](const uint8_t* src, int h) {
    const __m512 v = _mm512_load_ps(reinterpret_cast<const float*>(src));
    return _mm512_castps_si512(h == 0 ? _mm512_moveldup_ps(v) : _mm512_movehdup_ps(v));
  };
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    __m512i lo[2], hi[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512i hb = dup(codes + 256 + 64 * (v % 2), h);
      if (v >= 2) hb = _mm512_srli_epi16(hb, 4);
      six_bit_codes(dup(codes + 64 * v, h), hb, &lo[h], &hi[h]);
    }
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512i x = pair(xt + 32 * v + 8 * p);
      acc_a[0][p] = avx512::dpbusd(acc_a[0][p], lo[0], x);
      acc_a[1][p] = avx512::dpbusd(acc_a[1][p], lo[1], x);
    }
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512i x = pair(xt + 32 * (v + 4) + 8 * p);
      acc_b[0][p] = avx512::dpbusd(acc_b[0][p], hi[0], x);
      acc_b[1][p] = avx512::dpbusd(acc_b[1][p], hi[1], x);
    }
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512 da = h == 0 ? _mm512_moveldup_ps(dwa) : _mm512_movehdup_ps(dwa);
    const __m512 db = h == 0 ? _mm512_moveldup_ps(dwb) : _mm512_movehdup_ps(dwb);
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512 dx = _mm512_castsi512_ps(pair(dt + 2 * p));
      const __m512 ta =
          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc_a[h][p], pair(et + 2 * p))), dx);
      const __m512 tb =
          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc_b[h][p], pair(et2 + 2 * p))), dx);
      fa[h * NP + p] = _mm512_fmadd_ps(ta, da, fa[h * NP + p]);
      fb[h * NP + p] = _mm512_fmadd_ps(tb, db, fb[h * NP + p]);
    }
  }
}

// dw / mw of sub-block b of a packed block; Q6_K: the scales of its first and its last 16
// elements.
template <GgmlType T>
[[gnu::always_inline]] inline void sub_block_scales_forced(const uint8_t* blk, int64_t nsub,
                                                           int64_t b, __m512* dw, __m512* mw) {
  using P = Packed<T>;
  const uint8_t* scales = blk + nsub * P::kCodeBytes;
  if constexpr (P::kSix) {  // Q6_K: d * sc[2 j], d * sc[2 j + 1]
    const uint8_t* head = scales + (b / kSuperSubs) * P::kFormat.super_head_bytes;
    const int64_t j = b % kSuperSubs;
    auto bytes = [&](int64_t at) {
      return _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(head + at))));
    };
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(head)));
    *dw = _mm512_mul_ps(d, bytes(32 + 32 * j));
    *mw = _mm512_mul_ps(d, bytes(48 + 32 * j));
    return;
  }
  if constexpr (P::kFormat.super()) {  // Q4_K
    avx512::q4_k_packed_scales(scales + (b / kSuperSubs) * P::kFormat.super_head_bytes,
                               b % kSuperSubs, dw, mw);
    return;
  }
  *dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales + 32 * b)));
  if constexpr (P::kMin) {
    *mw = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(scales + 32 * (nsub + b))));
  } else {
    *mw = *dw;
  }
}

// The same, inlined or not as GCC chooses.
template <GgmlType T, typename... A>
inline void sub_block_scales(A... a) {
  sub_block_scales_forced<T>(a...);
}

// Whether block_rows inlines the step of one sub-block with all its callees (step_inline)
// or leaves the inlining to GCC. Left to GCC, most steps of the 32-element block types became
// calls whose accumulators went through memory at every sub-block. Inlined (one thread,
// L2-resident 1536 x 576, address randomization off, against GCC's choice): 1 / 2 / 4 rows of
// Q4_1 ran 2.7 / 1.5 / 1.2x faster, Q8_0 1.95 / 1.95 / 1.6x, Q4_0 1.0 / 1.8 / 1.4x, Q5_0
// 2.3 / 1.5 / 1.4x. The 8-row pair kernel (0.94-1.02x as a call) and the K-quant kernels keep
// GCC's choice.
template <GgmlType T, int R>
constexpr bool kInlineStep = !Packed<T>::kSix && !Packed<T>::kFormat.super() && R < kMaxTile;

template <GgmlType T, int R>
[[gnu::always_inline]] inline void step_inline(const uint8_t* blk, int64_t nsub, int64_t b,
                                               const int8_t* xt, const float* dt, const float* et,
                                               __m512* facc) {
  __m512 dw, mw;
  sub_block_scales_forced<T>(blk, nsub, b, &dw, &mw);
  sub_block_forced<T, R>(blk + b * Packed<T>::kCodeBytes, dw, mw, xt + b * 256, dt + b * kMaxTile,
                         et + b * kMaxTile, facc);
}

// Block `blk` of 16 weight rows (the first `valid` real) against activation rows
// [i0, i0 + R) (R <= 8, i0 a multiple of 8); y rows are ldy floats apart, this block's outputs
// start at column col0. While it runs, two later blocks are prefetched in step with it
// (~block_bytes / nsub lines each per sub-block): `near` into L1 and `far` into L2 (null: none).
// A pass of 8 rows runs in token pairs (sub_block_pairs), shorter ones row by row.
template <GgmlType T, int R>
void block_rows(const uint8_t* blk, int64_t block_bytes, const Acts& a, int64_t i0, float* y,
                int64_t ldy, int64_t col0, int64_t valid, const uint8_t* near, const uint8_t* far) {
  using P = Packed<T>;
  constexpr bool kPairs = R == kMaxTile;
  const int64_t nsub = a.nsub;
  const int64_t tile = i0 / kMaxTile;
  const int8_t* xt = a.qt + tile * nsub * 256;
  const float* dt = a.dt + tile * nsub * kMaxTile;
  const float* et = a.et + tile * nsub * kMaxTile;
  const float* et2 = P::kSix ? a.et2 + tile * nsub * kMaxTile : nullptr;
  // The two loops over R outside the steps are unrolled too: left rolled (R >= 6), GCC kept
  // copies of even / odd on the stack and zeroed them with two `rep stos` per block (8-token
  // pass 0.95-0.98x of the time without them, paired A/B).
  __m512 even[R], odd[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) even[i] = odd[i] = _mm512_setzero_ps();
  const int64_t pf_lines = (block_bytes / 64 + nsub - 1) / nsub;
  int64_t pf_at = 0;
  auto prefetch = [&] {
    if (near == nullptr && far == nullptr) return;
    for (int64_t l = 0; l < pf_lines && pf_at < block_bytes; ++l, pf_at += 64) {
      if (near != nullptr) _mm_prefetch(reinterpret_cast<const char*>(near + pf_at), _MM_HINT_T0);
      if (far != nullptr) _mm_prefetch(reinterpret_cast<const char*>(far + pf_at), _MM_HINT_T1);
    }
  };
  // The step as GCC compiles it (kernels without kInlineStep).
  auto step = [&](int64_t b, __m512* facc) {
    __m512 dw, mw;
    prefetch();
    sub_block_scales<T>(blk, nsub, b, &dw, &mw);
    if constexpr (kPairs) {
      sub_block_pairs<T, R / 2>(blk + b * P::kCodeBytes, dw, mw, xt + b * 256, dt + b * kMaxTile,
                                et + b * kMaxTile, facc);
    } else {
      sub_block<T, R>(blk + b * P::kCodeBytes, dw, mw, xt + b * 256, dt + b * kMaxTile,
                      et + b * kMaxTile, facc);
    }
  };
  if constexpr (P::kSix) {  // both chains in every sub-block (its two halves of 16)
    for (int64_t b = 0; b < nsub; ++b) {
      __m512 dwa, dwb;
      prefetch();
      sub_block_scales<T>(blk, nsub, b, &dwa, &dwb);
      const uint8_t* codes = blk + b * P::kCodeBytes;
      const int64_t at = b * kMaxTile;
      if constexpr (kPairs) {
        sub_block_six_pairs<R / 2>(codes, dwa, dwb, xt + b * 256, dt + at, et + at, et2 + at, even,
                                   odd);
      } else {
        sub_block_six<R>(codes, dwa, dwb, xt + b * 256, dt + at, et + at, et2 + at, even, odd);
      }
    }
  } else if constexpr (kInlineStep<T, R>) {
    // No lambda here: GCC does not always honour always_inline on a lambda.
    int64_t b = 0;
    for (; b + 2 <= nsub; b += 2) {
      prefetch();
      step_inline<T, R>(blk, nsub, b, xt, dt, et, even);
      prefetch();
      step_inline<T, R>(blk, nsub, b + 1, xt, dt, et, odd);
    }
    if (b < nsub) {
      prefetch();
      step_inline<T, R>(blk, nsub, b, xt, dt, et, even);
    }
  } else {
    int64_t b = 0;
    for (; b + 2 <= nsub; b += 2) {
      step(b, even);
      step(b + 1, odd);
    }
    if (b < nsub) step(b, even);
  }
  const auto mask = static_cast<__mmask16>((1u << valid) - 1);
  if constexpr (kPairs) {
    // Token pairs back into rows of 16 outputs: h = 0 holds rows 4k, 4k + 2 of 128-bit lane k,
    // h = 1 rows 4k + 1, 4k + 3, each as (token 2p, token 2p + 1).
#pragma GCC unroll 8
    for (int p = 0; p < R / 2; ++p) {
      const __m512 h0 = _mm512_add_ps(even[p], odd[p]);
      const __m512 h1 = _mm512_add_ps(even[R / 2 + p], odd[R / 2 + p]);
      float* row = y + (i0 + 2 * p) * ldy + col0;
      // A token's values picked from h0 and h1 lie in lane k as rows 4k, 4k + 2, 4k + 1, 4k + 3;
      // the in-lane permute puts them in order.
      const __m512 t0 = _mm512_shuffle_ps(h0, h1, 0x88);  // token 2p
      const __m512 t1 = _mm512_shuffle_ps(h0, h1, 0xdd);  // token 2p + 1
      _mm512_mask_storeu_ps(row, mask, _mm512_permute_ps(t0, 0xd8));
      _mm512_mask_storeu_ps(row + ldy, mask, _mm512_permute_ps(t1, 0xd8));
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      _mm512_mask_storeu_ps(y + (i0 + i) * ldy + col0, mask, _mm512_add_ps(even[i], odd[i]));
    }
  }
}

// Prefetch distances of the block stream, in blocks: one ahead into L1, four ahead into L2.
// Measured on the decode loop against one block two ahead into L1 (the first version):
// +2-6% tokens/s (interleaved A/B runs on the 2-vCPU test machine); without software prefetch
// at all decode is ~15% slower.
constexpr int kNearBlocks = 1;
constexpr int kFarBlocks = 4;

// The claimed block of 16 weight rows against all n activation rows.
template <GgmlType T>
void one_block(const WeightMatrix& w, const Acts& a, int64_t n, float* y,
               const StealingSplit::Claim& c) {
  const int64_t bb = w.packed_block_bytes;
  auto block = [&](int64_t k) { return k < 0 ? nullptr : w.packed + k * bb; };
  const uint8_t* blk = block(c.item);
  const uint8_t* near = block(c.after(kNearBlocks));
  // A pass over 8 rows takes long enough per block that the next block into L1 suffices; the
  // far prefetches would only add load uops to a kernel that is short of them (8-token pass
  // 0.985-0.990x without them, paired A/B; without the near ones too: 1.19x).
  const uint8_t* far = n >= kMaxTile ? nullptr : block(c.after(kFarBlocks));
  const int64_t col0 = c.item * kPackRows;
  const int64_t valid = std::min<int64_t>(kPackRows, w.rows - col0);
  int64_t i0 = 0;
  for (; i0 + kMaxTile <= n; i0 += kMaxTile) {
    block_rows<T, kMaxTile>(blk, bb, a, i0, y, w.rows, col0, valid, near, far);
    near = far = nullptr;  // the first pass brings the blocks in; later ones hit the cache
  }
  // The last 1..7 rows: the pass instantiated for their count.
  using Tail = void (*)(const uint8_t*, int64_t, const Acts&, int64_t, float*, int64_t, int64_t,
                        int64_t, const uint8_t*, const uint8_t*);
  static constexpr Tail kTails[kMaxTile] = {nullptr,          block_rows<T, 1>, block_rows<T, 2>,
                                            block_rows<T, 3>, block_rows<T, 4>, block_rows<T, 5>,
                                            block_rows<T, 6>, block_rows<T, 7>};
  if (i0 < n) kTails[n - i0](blk, bb, a, i0, y, w.rows, col0, valid, near, far);
}

// The lines of [p, p + bytes) (hint T0 into L1 or T1 into L2).
template <int kHint>
void prefetch_range(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + at), static_cast<_mm_hint>(kHint));
  }
}

// All lines of block k (none for k < 0).
template <int kHint>
void prefetch_block(const WeightMatrix& w, int64_t k) {
  if (k >= 0) prefetch_range<kHint>(w.packed + k * w.packed_block_bytes, w.packed_block_bytes);
}

// Thread ti's share of the blocks against all n activation rows, claimed one at a time.
template <GgmlType T>
void blocks_split(const WeightMatrix& w, const Acts& a, int64_t n, float* y, StealingSplit& split,
                  int ti) {
  bool first = true;
  for (StealingSplit::Claim c = split.next(ti); c.item >= 0; c = split.next(ti)) {
    if (first) {
      // A stream's start: the first block is demand-loaded right away; the blocks up to the
      // far distance would otherwise never be prefetched early.
      prefetch_block<_MM_HINT_T0>(w, c.after(kNearBlocks));
      for (int k = kNearBlocks + 1; k < kFarBlocks; ++k) prefetch_block<_MM_HINT_T1>(w, c.after(k));
      first = false;
    }
    one_block<T>(w, a, n, y, c);
  }
}

template <GgmlType T>
void packed_matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool,
                   bool glu) {
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
    prepare_subblocks<T>(x, glu, n, a, 0, a.nsub);
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
        prepare_subblocks<T>(x, glu, n, a, 0, a.nsub);
        ready.store(1, std::memory_order_release);
      } else {
        pool->wait_for_flag(ready, 0);
      }
      blocks_split<T>(w, a, n, y, split, ti);
    });
    return;
  }
  // More rows: every thread prepares a share of the sub-blocks of all rows, then all wait for
  // the last one (one job instead of a preparation job and a matmul job).
  std::atomic<int> arrived{0};
  pool->run([&](int ti, int nt) {
    prepare_subblocks<T>(x, glu, n, a, a.nsub * ti / nt, a.nsub * (ti + 1) / nt);
    pool->arrive_and_wait(arrived, ready, ti, nt);
    blocks_split<T>(w, a, n, y, split, ti);
  });
}

}  // namespace

void packed_matmul_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y,
                          ThreadPool* pool, bool glu) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      return packed_matmul<GgmlType::kQ4_0>(w, x, n, y, pool, glu);
    case GgmlType::kQ4_1:
      return packed_matmul<GgmlType::kQ4_1>(w, x, n, y, pool, glu);
    case GgmlType::kQ8_0:
      return packed_matmul<GgmlType::kQ8_0>(w, x, n, y, pool, glu);
    case GgmlType::kQ5_0:
      return packed_matmul<GgmlType::kQ5_0>(w, x, n, y, pool, glu);
    case GgmlType::kQ5_1:
      return packed_matmul<GgmlType::kQ5_1>(w, x, n, y, pool, glu);
    case GgmlType::kQ4_K:
      return packed_matmul<GgmlType::kQ4_K>(w, x, n, y, pool, glu);
    case GgmlType::kQ6_K:
      return packed_matmul<GgmlType::kQ6_K>(w, x, n, y, pool, glu);
    default:
      SPECDEC_CHECK(false, "packed_matmul_avx512: type has no packed layout");
  }
}

void packed_prefetch_avx512(const WeightMatrix& w, int ti, int nt, int64_t max_bytes) {
  const int64_t blocks = (w.rows + kPackRows - 1) / kPackRows;
  const int64_t first = StealingSplit::stretch_begin(blocks, ti, nt);
  const int64_t end = StealingSplit::stretch_begin(blocks, ti + 1, nt);
  prefetch_range<_MM_HINT_T1>(w.packed + first * w.packed_block_bytes,
                              std::min(max_bytes, (end - first) * w.packed_block_bytes));
}

}  // namespace detail
}  // namespace specdec
