// AVX-512 (F/BW/VL/DQ/VNNI) matmul for quantized weights, and the AVX-512 entry point.
//
// Activations are quantized once per call (quant_kernels.h specifies the arithmetic, which this
// file reproduces bit for bit). Weight codes are unpacked to unsigned bytes and multiplied with
// vpdpbusd (u8 x s8 -> s32). Three kernels, exact in the integer part and running the same float
// sequence per output, so results equal the scalar reference and do not depend on n:
//
//  * row kernel (n == 1, decode): 8 weight rows at a time, 64 codes of each per step, dotted with
//    the activation row; a shuffle tree and one permute turn the 8 x 16 partial sums into one
//    vector in "pair layout" - lane 2 p + h = (weight row p, sub-block parity h) - and the float
//    epilogue runs once per 8 rows with the rows' scales in the same layout. Prefetches run a
//    few groups of rows ahead: this kernel streams the weights at DRAM speed.
//  * tile kernel (2 <= n < 32, speculative verification): activations re-laid out in tiles of
//    8 rows (2 or 4 when n is that small), lane 2 i + h = (activation row i, sub-block parity
//    h); each weight row is unpacked once into a small scratch with the codes of its A/B
//    sub-blocks interleaved per 4 bytes, and an 8-byte broadcast of them feeds vpdpbusd against
//    8 rows x 2 sub-blocks at once (16 / 32-byte broadcasts against 4 / 2 rows, see TileShape).
//  * panel kernel (n >= 32, prefill): 48 weight rows transposed so that lanes are weight rows,
//    a 4 x 3 register tile of int32 accumulators fed by register-only vpdpbusd.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/quant_weights_avx512.h"
#include "backend/cpu/stealing_split.h"
#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace detail {

void matmul_float_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y,
                         ThreadPool* pool);

namespace {

using avx512::dpbusd;
using avx512::transpose8x8_qwords;
using avx512::Weights;

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

constexpr int64_t kTileRows = 8;

// ---------------------------------------------------------------------------------------------
// Activations.

// 4 vectors whose 128-bit lanes hold 4 partial sums each -> lane 4 L + j = sum of lane L of v[j].
inline __m512i transpose_sum4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  const __m512i s01 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
  const __m512i s23 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// Quantizes one row (natural layout), bit-identical to quantize_activations_ref: 16 blocks of 32
// at a time - block maxima through a 16 x 16 transpose, one division for all scales, the 16-value
// sums from vpdpbusd with ones.
void quantize_row(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  const int64_t nb = cols / kActBlock;
  const __m512i ones = _mm512_set1_epi8(1);
  // transpose_sum4 leaves the sum of 16-byte chunk L of vector j in lane 4 L + j
  const __m512i chunk_order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t blocks = std::min<int64_t>(16, nb - b0);
    const float* xb = x + 32 * b0;
    __m512 m[16];
    for (int j = 0; j < 16; ++j) {
      m[j] = j < blocks ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j)),
                                        _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j + 16)))
                        : _mm512_setzero_ps();
    }
    avx512::transpose16(m);  // m[k] lane j: element k of block j's partial maxima
    __m512 amax = m[0];
    for (int k = 1; k < 16; ++k) amax = _mm512_max_ps(amax, m[k]);
    const __mmask16 nonzero =
        _mm512_cmp_ps_mask(amax, _mm512_set1_ps(kMinActivationAmax), _CMP_GE_OQ);
    const __m512 scale = _mm512_maskz_div_ps(nonzero, amax, _mm512_set1_ps(127.0f));
    const __m512 inv = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0f), scale);
    const auto live = static_cast<__mmask16>((1u << blocks) - 1);
    _mm512_mask_storeu_ps(d + b0, live, scale);
    alignas(64) float invs[16];
    _mm512_store_ps(invs, inv);
    int8_t* qb = q + 32 * b0;
    for (int j = 0; j < blocks; ++j) {
      const __m512 vinv = _mm512_set1_ps(invs[j]);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * j), vinv));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * j + 16), vinv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 32 * j), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 32 * j + 16), _mm512_cvtsepi32_epi8(q1));
    }
    // Sums of 16 codes: vpdpbusd with ones gives sums of 4, transpose_sum4 sums of 16.
    for (int j = 0; j < blocks; j += 8) {
      __m512i part[4];
      for (int v = 0; v < 4; ++v) {
        const int64_t first = j + 2 * v;  // blocks first, first + 1 in vector v
        const __mmask64 mask = first >= blocks ? 0 : first + 1 >= blocks ? 0xffffffffull : ~0ull;
        part[v] = avx512::dpbusd(_mm512_setzero_si512(), ones,
                                 _mm512_maskz_loadu_epi8(mask, qb + 32 * first));
      }
      const __m512i sums =
          _mm512_permutexvar_epi32(chunk_order, transpose_sum4(part[0], part[1], part[2], part[3]));
      const int64_t count = std::min<int64_t>(16, 2 * (blocks - j));
      _mm512_mask_storeu_epi32(s16 + 2 * (b0 + j), static_cast<__mmask16>((1u << count) - 1), sums);
    }
  }
}

struct Activations {
  int64_t n = 0;
  int64_t n_pad = 0;  // n rounded up to the tile height (1 when n == 1)
  int64_t cols = 0;
  int64_t cols_pad = 0;    // cols rounded up to 64
  int64_t units = 0;       // unit = an A and a B sub-block = 2 sub elements
  int64_t units_pad = 0;   // units rounded up to 8 (whole 8 x 8 transposes)
  int64_t nsub_pad = 0;    // 2 units_pad
  int64_t tiles = 0;       // tiles of H rows (TileShape), set by the tile path
  int8_t* q = nullptr;     // [n_pad, cols_pad] natural (tile builds permute it in place)
  float* d = nullptr;      // [n_pad, cols_pad / 32]
  int32_t* s16 = nullptr;  // [n_pad, cols_pad / 16]
  float* dxs = nullptr;    // [n_pad, nsub_pad] activation scale of each sub-block
  float* exs = nullptr;    // [n_pad, nsub_pad] sx (min types) or int32 offset correction
  int8_t* qt = nullptr;    // n >= 2: [tiles, units, 2 sub / (64 / H), 64] see build_tiles
  float* dxt = nullptr;    // n >= 2: [tiles, units_pad, 16] see build_tiles
  float* ext = nullptr;    // n >= 2: [tiles, units_pad, 16]
};

// Quantizes row i (zeros beyond n) and fills its per-sub-block dxs / exs.
template <int kSub, bool kMin, int kOffset>
void prepare_row(const float* x, Activations& a, int64_t i) {
  const int64_t nb32 = a.cols_pad / 32;
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
  float* dxs = a.dxs + i * a.nsub_pad;
  float* exs = a.exs + i * a.nsub_pad;
  const int64_t nsub = a.cols / kSub;
  auto first_bits = [](int64_t k) {
    return static_cast<__mmask16>((1u << std::clamp<int64_t>(k, 0, 16)) - 1);
  };
  for (int64_t b = 0; b < nsub; b += 16) {  // 16 sub-blocks per iteration
    const int64_t count = std::min<int64_t>(16, nsub - b);
    const __mmask16 live = first_bits(count);
    __m512 dx;
    __m512i sum;                 // code sum of each sub-block
    if constexpr (kSub == 32) {  // two s16 per sub-block
      dx = _mm512_maskz_loadu_ps(live, d + b);
      const __m512i lo = _mm512_maskz_loadu_epi32(first_bits(2 * count), s16 + 2 * b);
      const __m512i hi = _mm512_maskz_loadu_epi32(first_bits(2 * count - 16), s16 + 2 * b + 16);
      const __m512i even =
          _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
      sum = _mm512_add_epi32(_mm512_permutex2var_epi32(lo, even, hi),
                             _mm512_permutex2var_epi32(lo, odd, hi));
    } else {  // sub-blocks of 16: one s16 each, two per activation block
      const __m512i half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
      dx = _mm512_permutexvar_ps(half,
                                 _mm512_maskz_loadu_ps(first_bits((count + 1) / 2), d + b / 2));
      sum = _mm512_maskz_loadu_epi32(live, s16 + b);
    }
    _mm512_mask_storeu_ps(dxs + b, live, dx);
    if (kMin) {
      _mm512_mask_storeu_ps(exs + b, live, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), dx));
    } else {
      _mm512_mask_storeu_epi32(exs + b, live, _mm512_mullo_epi32(sum, _mm512_set1_epi32(kOffset)));
    }
  }
  std::memset(dxs + nsub, 0, static_cast<size_t>(a.nsub_pad - nsub) * 4);
  std::memset(exs + nsub, 0, static_cast<size_t>(a.nsub_pad - nsub) * 4);
}

// Interleaves the 4-byte groups of a unit's A and B sub-blocks: [A0 B0 A1 B1 ...] per unit (one
// unit per 64 bytes for sub 32, two for sub 16).
template <int kSub>
inline __m512i pair_interleave(__m512i v) {
  const __m512i perm =
      kSub == 32 ? _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)
                 : _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  return _mm512_permutexvar_epi32(perm, v);
}

// Tile shapes: a tile is H = 8, 4 or 2 activation rows (8 for n >= 5, else the fewest that hold
// n), each in 16 / H lanes of the activation vectors: lane (16 / H) i + 2 j + h = (row i,
// sub-block parity h, part j of the unit's 4-byte groups), met by a broadcast of 64 / H weight
// bytes (the pair-order codes of 8 / H groups). Fewer rows per tile for small n keep vpdpbusd
// busy with real rows instead of padding (see small_tile_group for H < 8).
template <int H>
struct TileShape {
  static_assert(H == 8 || H == 4 || H == 2);
  static constexpr int kChunkBytes = 64 / H;  // weight bytes per broadcast
  // H < 8: the activation row of lane l of the sums small_tile_group merges (parity l & 1).
  static constexpr int64_t row(int lane) { return H == 2 ? (lane / 4) % 2 : lane / 4; }
};

// Builds the tiles from the prepared rows: a.qt [tiles, units, chunks, 64] (row i at bytes
// kChunkBytes i of each chunk), a.dxt / a.ext [tiles, units_pad, 16] (H = 8: lane 2 i + h;
// H < 8: lane l holds TileShape::row(l), parity l & 1).
template <int kSub, int H>
void build_tiles(Activations& a) {
  using Shape = TileShape<H>;
  constexpr int64_t kUnitBytes = 2 * kSub;
  constexpr int64_t kCB = Shape::kChunkBytes;
  constexpr int64_t kChunks = kUnitBytes / kCB;
  const int64_t steps = a.cols_pad / 64;
  for (int64_t t = 0; t < a.tiles; ++t) {
    int8_t* rows = a.q + t * H * a.cols_pad;
    for (int64_t i = 0; i < H; ++i) {
      for (int64_t s = 0; s < steps; ++s) {
        int8_t* p = rows + i * a.cols_pad + 64 * s;
        _mm512_storeu_si512(p, pair_interleave<kSub>(_mm512_loadu_si512(p)));
      }
    }
    if constexpr (H == 8) {
      // qword g of each row's step -> vector (step, g) with lane pair i = row i
      for (int64_t s = 0; s < steps; ++s) {
        transpose8x8_qwords(rows + 64 * s, a.cols_pad, a.qt + (t * (a.cols_pad / 8) + 8 * s) * 64);
      }
      for (int64_t u0 = 0; u0 < a.units_pad; u0 += 8) {
        const int64_t row0 = t * kTileRows;
        transpose8x8_qwords(a.dxs + row0 * a.nsub_pad + 2 * u0, a.nsub_pad * 4,
                            a.dxt + (t * a.units_pad + u0) * 16);
        transpose8x8_qwords(a.exs + row0 * a.nsub_pad + 2 * u0, a.nsub_pad * 4,
                            a.ext + (t * a.units_pad + u0) * 16);
      }
    } else {  // one tile of at most 4 rows: plain copies
      for (int64_t u = 0; u < a.units; ++u) {
        int8_t* dst = a.qt + (t * a.units + u) * kChunks * 64;
        for (int64_t c = 0; c < kChunks; ++c) {
          for (int64_t i = 0; i < H; ++i) {
            std::memcpy(dst + c * 64 + i * kCB, rows + i * a.cols_pad + u * kUnitBytes + c * kCB,
                        kCB);
          }
        }
      }
      for (int64_t u = 0; u < a.units_pad; ++u) {
        for (int lane = 0; lane < 16; ++lane) {
          const int64_t row = t * H + Shape::row(lane);
          const int64_t src = row * a.nsub_pad + 2 * u + (lane & 1);
          const int64_t dst = (t * a.units_pad + u) * 16 + lane;
          std::memcpy(a.dxt + dst, a.dxs + src, 4);  // bit copies: exs may hold int32
          std::memcpy(a.ext + dst, a.exs + src, 4);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row kernel (n == 1).

// Partial sums of rows j and j + 4 -> 128-bit lanes [j A, j B, j+4 A, j+4 B]. Natural order:
// lanes of a row are [A, A, B, B]; nibble order: [A, B, A, B].
template <bool kNibbleOrder>
inline __m512i pair_rows(__m512i lo, __m512i hi) {
  if constexpr (kNibbleOrder) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
  } else {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
  }
}

// The tree leaves (row j + 4 (L >> 1), parity L & 1) in lane 4 L + j; this permutation moves it
// to the pair layout, lane 2 row + parity.
inline __m512i tree_to_pairs(__m512i r) {
  const __m512i idx = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  return _mm512_permutexvar_epi32(idx, r);
}

inline __m512 bcast_pair_ps(const float* p) {
  double v;
  std::memcpy(&v, p, 8);
  return _mm512_castpd_ps(_mm512_set1_pd(v));
}

template <bool kMin>
inline __m512 epilogue(__m512 acc, __m512i isum, __m512 dx, __m512 ex, __m512 dw, __m512 mw) {
  if (!kMin) isum = _mm512_sub_epi32(isum, _mm512_castps_si512(ex));
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), dx);
  acc = _mm512_fmadd_ps(t, dw, acc);
  if (kMin) acc = _mm512_fmadd_ps(mw, ex, acc);
  return acc;
}

// 8 rows (stride rb from g) against the activation row. tdw / tmw: [units_pad, 16] scales in
// pair layout. Writes y[0 .. valid).
template <GgmlType T>
void row_group(const uint8_t* g, int64_t rb, const Activations& a, const float* tdw,
               const float* tmw, const uint8_t* prefetch, int64_t pf_step, float* y,
               int64_t valid) {
  using W = Weights<T>;
  const int64_t steps = a.cols_pad / 64;
  const bool odd_blocks = W::kSub == 32 && (a.cols / 32) % 2 == 1;
  __m512 acc = _mm512_setzero_ps();
  auto unit_epilogue = [&](__m512i r, int64_t u, __m512 dw, __m512 mw) {
    acc = epilogue<W::kMin>(acc, tree_to_pairs(r), bcast_pair_ps(a.dxs + 2 * u),
                            bcast_pair_ps(a.exs + 2 * u), dw, mw);
  };
  auto table_scales = [&](int64_t u, __m512* dw, __m512* mw) {
    *dw = _mm512_loadu_ps(tdw + 16 * u);
    *mw = W::kMin ? _mm512_loadu_ps(tmw + 16 * u) : *dw;
  };
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
    __m512 dw, mw;
    if constexpr (W::kSub == 32) {
      constexpr bool kNib = W::kNibbleOrder;
      if constexpr (W::kHeadBytes > 0) {
        avx512::step_heads8<W::kHeadBytes, W::kMin, kHasB>(g, rb, s, &dw, &mw);
      } else {
        table_scales(s, &dw, &mw);
      }
      unit_epilogue(transpose_sum4(pair_rows<kNib>(i[0], i[4]), pair_rows<kNib>(i[1], i[5]),
                                   pair_rows<kNib>(i[2], i[6]), pair_rows<kNib>(i[3], i[7])),
                    s, dw, mw);
    } else {  // sub-blocks of 16: two units per step
      const __m512i lo = transpose_sum4(i[0], i[1], i[2], i[3]);
      const __m512i hi = transpose_sum4(i[4], i[5], i[6], i[7]);
      table_scales(2 * s, &dw, &mw);
      unit_epilogue(_mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)), 2 * s, dw, mw);
      table_scales(2 * s + 1, &dw, &mw);
      unit_epilogue(_mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)), 2 * s + 1, dw, mw);
    }
  };
  const int64_t full_steps = odd_blocks ? steps - 1 : steps;
  for (int64_t s = 0; s < full_steps; ++s) step(s, std::true_type{});
  if (odd_blocks) step(steps - 1, std::false_type{});
  // y[p] = acc[p, A] + acc[p, B], lanes 2 p and 2 p + 1
  const __m512 sum = _mm512_add_ps(acc, _mm512_permute_ps(acc, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 even = _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), sum);
  _mm256_mask_storeu_ps(y, static_cast<__mmask8>((1u << valid) - 1), _mm512_castps512_ps256(even));
}

// Natural scales of `rows` consecutive rows starting at g into dwn / mwn, row p at p * stride.
// With an even number of 32-element blocks (or sub 16), a row is a whole number of units and
// consecutive rows are one run of blocks: one pass, stride nsub. Otherwise row by row, stride
// nsub_pad, with the missing B sub-block of the last unit zeroed. Returns the stride.
template <class W>
int64_t group_scales(const uint8_t* g, int64_t rb, int64_t rows, int64_t nsub, int64_t nsub_pad,
                     float* dwn, float* mwn) {
  if (W::kSub == 16 || nsub % 2 == 0) {
    W::scales(g, rows * nsub, dwn, mwn);
    std::memset(dwn + rows * nsub, 0, 16 * 4);
    if (W::kMin) std::memset(mwn + rows * nsub, 0, 16 * 4);
    return nsub;
  }
  for (int64_t p = 0; p < rows; ++p) {
    float* dp = dwn + p * nsub_pad;
    float* mp = mwn + p * nsub_pad;
    W::scales(g + p * rb, nsub, dp, mp);
    std::memset(dp + nsub, 0, static_cast<size_t>(nsub_pad - nsub) * 4);
    if (W::kMin) std::memset(mp + nsub, 0, static_cast<size_t>(nsub_pad - nsub) * 4);
  }
  return nsub_pad;
}

// The row kernel prefetches the group of 8 rows this many groups ahead of the one it multiplies,
// the tile kernel kTilePrefetchGroups ahead.
constexpr int64_t kPrefetchGroups = 3;
constexpr int64_t kTilePrefetchGroups = 2;

// Rows [r0, r1). If ready is not null, the activation row is still being prepared by thread 0 of
// pool: the first group's scale tables (for types that need them) are built meanwhile, and the
// multiplication waits for the flag.
template <GgmlType T>
void row_kernel(const WeightMatrix& w, const Activations& a, float* y, int64_t r0, int64_t r1,
                const std::atomic<int>* ready, const ThreadPool* pool) {
  using W = Weights<T>;
  const int64_t nsub = w.cols / W::kSub;
  const int64_t rb = w.row_bytes;
  const int64_t steps = a.cols_pad / 64;
  // [8, rb] copy of a ragged last group; [8, nsub_pad] + 16 natural dw, mw; [units_pad, 16]
  // tdw, tmw
  const size_t tail_bytes = static_cast<size_t>(round_up(8 * rb, 64));
  const int64_t nat = 8 * a.nsub_pad + 16;
  auto* mem = static_cast<uint8_t*>(
      thread_scratch(kScratchWeights)
          .get(tail_bytes + static_cast<size_t>(2 * nat + 16 * a.nsub_pad) * sizeof(float)));
  uint8_t* tail = mem;
  auto* dwn = reinterpret_cast<float*>(mem + tail_bytes);
  float* mwn = dwn + nat;
  float* tdw = mwn + nat;
  float* tmw = tdw + 8 * a.nsub_pad;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t pf_step = round_up(8 * rb / steps, 64);  // prefetch of a later group per step
  // The first groups are not covered by that: request them now, before the first one stalls.
  const int64_t head_bytes = std::min<int64_t>(r1 - r0, 8 * kPrefetchGroups) * rb;
  for (int64_t off = 8 * rb; off < head_bytes; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(base + r0 * rb + off), _MM_HINT_T0);
  }
  for (int64_t g0 = r0; g0 < r1; g0 += 8) {
    const int64_t valid = std::min<int64_t>(8, r1 - g0);
    const uint8_t* g = base + g0 * rb;
    if (valid < 8) {  // copy the rows, repeating the last, so that the stride stays rb
      for (int64_t p = 0; p < 8; ++p) {
        std::memcpy(tail + p * rb, base + (g0 + std::min(p, valid - 1)) * rb,
                    static_cast<size_t>(rb));
      }
      g = tail;
    }
    if constexpr (W::kHeadBytes == 0) {  // scales for row_group's tables
      const int64_t stride = group_scales<W>(g, rb, 8, nsub, a.nsub_pad, dwn, mwn);
      for (int64_t u0 = 0; u0 < a.units_pad; u0 += 8) {
        transpose8x8_qwords(dwn + 2 * u0, stride * 4, tdw + 16 * u0);
        if (W::kMin) transpose8x8_qwords(mwn + 2 * u0, stride * 4, tmw + 16 * u0);
      }
    }
    const uint8_t* next =
        g0 + 8 * (kPrefetchGroups + 1) <= r1 ? base + (g0 + 8 * kPrefetchGroups) * rb : nullptr;
    if (ready != nullptr) {
      pool->wait_for_flag(*ready, 0);
      ready = nullptr;
    }
    row_group<T>(g, rb, a, tdw, tmw, next, pf_step, y + g0, valid);
  }
}

// ---------------------------------------------------------------------------------------------
// Tile kernel (2 <= n < kPanelMinRows).

// Broadcast of kBytes (16 or 32) bytes at p to all of a vector.
template <int kBytes>
inline __m512i broadcast_bytes(const uint8_t* p) {
  static_assert(kBytes == 16 || kBytes == 32);
  if constexpr (kBytes == 16) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// One group of P weight rows (pair-order codes in wq, natural scales in dwn / mwn with row
// stride sstride) against every activation tile.
// prefetch / pf_bytes: weights of a later group, prefetched a slice per unit of the first tile
// (the multiplication of a group is too long for out-of-order execution to overlap it with the
// next group's loads, so the loads are requested here).
template <GgmlType T, int P>
void tile_group(const Activations& a, const uint8_t* wq, const float* dwn, const float* mwn,
                int64_t sstride, float* y, int64_t ldy, int64_t row0, const uint8_t* prefetch,
                int64_t pf_bytes) {
  using W = Weights<T>;
  constexpr int kGroups = W::kSub / 4;
  const int64_t unit = 2 * W::kSub;
  const int64_t pf_unit = round_up((pf_bytes + a.units - 1) / a.units, 64);
  for (int64_t t = 0; t < a.tiles; ++t) {
    __m512 acc[P];
    for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t u = 0; u < a.units; ++u) {
      if (t == 0 && prefetch != nullptr) {
        for (int64_t off = u * pf_unit; off < std::min((u + 1) * pf_unit, pf_bytes); off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(prefetch + off), _MM_HINT_T0);
        }
      }
      const int8_t* xt = a.qt + (t * a.units + u) * kGroups * 64;
      __m512i xg[kGroups];
      for (int g = 0; g < kGroups; ++g) xg[g] = _mm512_loadu_si512(xt + 64 * g);
      const __m512 dx = _mm512_loadu_ps(a.dxt + (t * a.units_pad + u) * 16);
      const __m512 ex = _mm512_loadu_ps(a.ext + (t * a.units_pad + u) * 16);
      // P independent vpdpbusd chains, interleaved so that their latencies overlap.
      __m512i isum[P];
      for (int p = 0; p < P; ++p) isum[p] = _mm512_setzero_si512();
      for (int g = 0; g < kGroups; ++g) {
        for (int p = 0; p < P; ++p) {
          int64_t pair;
          std::memcpy(&pair, wq + p * a.cols_pad + u * unit + 8 * g, 8);
          isum[p] = dpbusd(isum[p], _mm512_set1_epi64(pair), xg[g]);
        }
      }
      for (int p = 0; p < P; ++p) {
        acc[p] = epilogue<W::kMin>(
            acc[p], isum[p], dx, ex, bcast_pair_ps(dwn + p * sstride + 2 * u),
            W::kMin ? bcast_pair_ps(mwn + p * sstride + 2 * u) : _mm512_setzero_ps());
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

// The same for one tile of H = 2 or 4 rows (n <= 4), always all 8 rows of the group (rows
// [prows, 8) of wq and the scales hold finite leftovers; their results are dropped). With few
// activation rows, a vector of sums has room for several weight rows: after the vpdpbusd
// chains, the parts j of kQ = 8 / H weight rows are summed into one vector by a transpose-add,
// so that the float epilogue runs once per kQ weight rows. Merged lanes: H = 4: 4 i + 2 q + h
// (weight row 2 m + q of vector m); H = 2: 4 (2 s + i) + 2 q + h (weight row 4 k + 2 s + q of
// vector k). tdw / tmw: [units_pad, 16] scales of the group, lane 2 p + h.
template <GgmlType T, int H>
void small_tile_group(const Activations& a, const uint8_t* wq, const float* tdw, const float* tmw,
                      int prows, float* y, int64_t ldy, int64_t row0, const uint8_t* prefetch,
                      int64_t pf_bytes) {
  static_assert(H == 2 || H == 4);
  using W = Weights<T>;
  using Shape = TileShape<H>;
  constexpr int kUnitBytes = 2 * W::kSub;
  constexpr int kCB = Shape::kChunkBytes;
  constexpr int kChunks = kUnitBytes / kCB;
  constexpr int kVecs = H;  // merged vectors per group of 8 weight rows
  const int64_t pf_unit = round_up((pf_bytes + a.units - 1) / a.units, 64);
  __m512 acc[kVecs];
  for (int m = 0; m < kVecs; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t u = 0; u < a.units; ++u) {
    if (prefetch != nullptr) {
      for (int64_t off = u * pf_unit; off < std::min((u + 1) * pf_unit, pf_bytes); off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + off), _MM_HINT_T0);
      }
    }
    const int8_t* xt = a.qt + u * kChunks * 64;
    __m512i xv[kChunks];
    for (int c = 0; c < kChunks; ++c) xv[c] = _mm512_loadu_si512(xt + c * 64);
    const __m512 dx = _mm512_loadu_ps(a.dxt + u * 16);
    const __m512 ex = _mm512_loadu_ps(a.ext + u * 16);
    __m512i isum[8];
    for (int p = 0; p < 8; ++p) isum[p] = _mm512_setzero_si512();
    for (int c = 0; c < kChunks; ++c) {
      for (int p = 0; p < 8; ++p) {
        const uint8_t* wp = wq + p * a.cols_pad + u * kUnitBytes + c * kCB;
        isum[p] = dpbusd(isum[p], broadcast_bytes<kCB>(wp), xv[c]);
      }
    }
    // rows p, p + 1: per 128-bit lane [p, parts 2l + {0, 1} summed; p + 1, the same]
    __m512i pairs[4];
    for (int m = 0; m < 4; ++m) {
      pairs[m] = _mm512_add_epi32(_mm512_unpacklo_epi64(isum[2 * m], isum[2 * m + 1]),
                                  _mm512_unpackhi_epi64(isum[2 * m], isum[2 * m + 1]));
    }
    for (int m = 0; m < kVecs; ++m) {
      __m512i sums;
      __m512 dw, mw;
      if constexpr (H == 4) {
        sums = pairs[m];
        dw = _mm512_broadcast_f32x4(_mm_loadu_ps(tdw + 16 * u + 4 * m));
        mw = W::kMin ? _mm512_broadcast_f32x4(_mm_loadu_ps(tmw + 16 * u + 4 * m)) : dw;
      } else {  // sum the two 128-bit lanes of each row: lanes [pairs 2m: i 0, i 1; 2m+1: ...]
        const __m512i lo = pairs[2 * m], hi = pairs[2 * m + 1];
        sums = _mm512_add_epi32(_mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512 d = _mm512_castps256_ps512(_mm256_loadu_ps(tdw + 16 * u + 8 * m));
        dw = _mm512_shuffle_f32x4(d, d, _MM_SHUFFLE(1, 1, 0, 0));
        if (W::kMin) {
          const __m512 v = _mm512_castps256_ps512(_mm256_loadu_ps(tmw + 16 * u + 8 * m));
          mw = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 1, 0, 0));
        } else {
          mw = dw;
        }
      }
      acc[m] = epilogue<W::kMin>(acc[m], sums, dx, ex, dw, mw);
    }
  }
  alignas(64) float out[kVecs][16];
  for (int m = 0; m < kVecs; ++m) _mm512_store_ps(out[m], acc[m]);
  const int64_t rows_here = std::min<int64_t>(H, a.n);
  for (int64_t i = 0; i < rows_here; ++i) {
    float* yi = y + i * ldy + row0;
    for (int p = 0; p < prows; ++p) {
      const int l = H == 4 ? 4 * static_cast<int>(i) + 2 * (p % 2)
                           : 4 * (2 * ((p / 2) % 2) + static_cast<int>(i)) + 2 * (p % 2);
      const float* o = out[H == 4 ? p / 2 : p / 4];
      yi[p] = o[l] + o[l + 1];
    }
  }
}

// tile_group for a group of prows (1..8) weight rows.
template <GgmlType T>
void tile_group_rows(int prows, const Activations& a, const uint8_t* wq, const float* dwn,
                     const float* mwn, int64_t sstride, float* y, int64_t ldy, int64_t g0,
                     const uint8_t* ahead, int64_t ahead_bytes) {
  auto group = [&](auto p) {
    tile_group<T, decltype(p)::value>(a, wq, dwn, mwn, sstride, y, ldy, g0, ahead, ahead_bytes);
  };
  switch (prows) {
    case 8:
      group(std::integral_constant<int, 8>{});
      break;
    case 7:
      group(std::integral_constant<int, 7>{});
      break;
    case 6:
      group(std::integral_constant<int, 6>{});
      break;
    case 5:
      group(std::integral_constant<int, 5>{});
      break;
    case 4:
      group(std::integral_constant<int, 4>{});
      break;
    case 3:
      group(std::integral_constant<int, 3>{});
      break;
    case 2:
      group(std::integral_constant<int, 2>{});
      break;
    default:
      group(std::integral_constant<int, 1>{});
      break;
  }
}

// Rows [r0, r1) against all activation tiles. If ready is not null, the activations are still
// being prepared by another thread: weights of the first group are unpacked meanwhile, and the
// multiplication waits until *ready is set.
template <GgmlType T, int H>
void tile_kernel(const WeightMatrix& w, const Activations& a, float* y, int64_t r0, int64_t r1,
                 const std::atomic<int>* ready, const ThreadPool* pool) {
  using W = Weights<T>;
  const int64_t nsub = w.cols / W::kSub;
  const int64_t steps = a.cols_pad / 64;
  const bool odd_blocks = W::kSub == 32 && (w.cols / 32) % 2 == 1;
  // [8, cols_pad] pair-order codes, then [8, nsub_pad] + 16 natural dw and mw
  // (H < 8: then [units_pad, 16] tdw and tmw, scales in pairs)
  const int64_t nat = 8 * a.nsub_pad + 16;
  const int64_t table = H < 8 ? 16 * a.units_pad : 0;
  const size_t bytes = static_cast<size_t>(8 * a.cols_pad + (2 * nat + 2 * table) * 4);
  auto* wq = static_cast<uint8_t*>(thread_scratch(kScratchWeights).get(bytes));
  auto* dwn = reinterpret_cast<float*>(wq + 8 * a.cols_pad);
  float* mwn = dwn + nat;
  float* tdw = mwn + nat;
  float* tmw = tdw + table;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t g0 = r0; g0 < r1; g0 += 8) {
    const int prows = static_cast<int>(std::min<int64_t>(8, r1 - g0));
    const uint8_t* g = base + g0 * w.row_bytes;
    if (H < 8 && prows < 8) {  // small_tile_group reads all 8 rows: give the missing ones zeros
      std::memset(wq + prows * a.cols_pad, 0, static_cast<size_t>((8 - prows) * a.cols_pad));
      std::memset(dwn, 0, static_cast<size_t>(2 * nat) * sizeof(float));
    }
    for (int p = 0; p < prows; ++p) {
      const uint8_t* row = g + p * w.row_bytes;
      uint8_t* dst = wq + p * a.cols_pad;
      const int64_t full = odd_blocks ? steps - 1 : steps;
      for (int64_t s = 0; s < full; ++s) W::template store_pairs<true>(row, s, dst + 64 * s);
      if (odd_blocks) W::template store_pairs<false>(row, steps - 1, dst + 64 * (steps - 1));
    }
    const int64_t sstride = group_scales<W>(g, w.row_bytes, prows, nsub, a.nsub_pad, dwn, mwn);
    if constexpr (H < 8) {
      for (int64_t u0 = 0; u0 < a.units_pad; u0 += 8) {
        transpose8x8_qwords(dwn + 2 * u0, sstride * 4, tdw + 16 * u0);
        if (W::kMin) transpose8x8_qwords(mwn + 2 * u0, sstride * 4, tmw + 16 * u0);
      }
    }
    if (ready != nullptr) {
      pool->wait_for_flag(*ready, 0);
      ready = nullptr;
    }
    const uint8_t* ahead = nullptr;
    int64_t ahead_bytes = 0;
    if (g0 + 8 * kTilePrefetchGroups < r1) {
      ahead = g + 8 * kTilePrefetchGroups * w.row_bytes;
      ahead_bytes = std::min<int64_t>(8, r1 - g0 - 8 * kTilePrefetchGroups) * w.row_bytes;
    }
    if constexpr (H < 8) {
      small_tile_group<T, H>(a, wq, tdw, tmw, prows, y, w.rows, g0, ahead, ahead_bytes);
    } else {
      tile_group_rows<T>(prows, a, wq, dwn, mwn, sstride, y, w.rows, g0, ahead, ahead_bytes);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Panel kernel (large n, prefill). A panel of 48 weight rows is transposed once so that a vector
// holds one 4-byte group of 16 rows (lane = weight row); a register tile of 4 activation rows x
// 3 such vectors then runs vpdpbusd on registers only - each loaded weight vector serves 4
// activation rows, each broadcast activation group serves 48 weight rows. The float epilogue is
// the same sequence per (activation row, weight row) as everywhere else; the two parity chains
// are independent, so all even sub-blocks are done first, then all odd ones, which keeps one
// chain's 12 float accumulators in registers. (48 rows also split 192, 576 and 1536 evenly.)

constexpr int kPanelVecs = 3;                    // vectors of 16 weight rows per panel
constexpr int64_t kPanelRows = 16 * kPanelVecs;  // 48
constexpr int kPanelTile = 4;                    // activation rows per register tile
// From this many activation rows on, the panel kernel replaces the tile kernel.
constexpr int64_t kPanelMinRows = 32;
static_assert(kPanelMinRows == kPackedPanelMinRows, "packed matrices switch kernels here too");

// Position of dword k of an unpacked 64-code step: its sub-block within the step and its group.
template <class W>
constexpr int step_sub(int k) {
  if (W::kSub == 16) return k / 4;
  if (W::kNibbleOrder) return (k / 4) % 2;
  return k / 8;
}
template <class W>
constexpr int step_group(int k) {
  if (W::kSub == 16) return k % 4;
  if (W::kNibbleOrder) return (k % 4) + 4 * (k / 8);
  return k % 8;
}

struct Panel {
  uint8_t* w = nullptr;  // [nsub_pad, groups, kPanelVecs, 64] transposed codes
  float* dw = nullptr;   // [nsub_pad, 64]
  float* mw = nullptr;   // [nsub_pad, 64]
};

// Transposes rows [row0, row0 + valid) (valid <= kPanelRows; missing rows are zero) into p.
// nat: scratch of 2 (kPanelRows nsub_pad + 16) floats for the natural scales.
template <GgmlType T>
void build_panel(const WeightMatrix& w, int64_t row0, int64_t valid, const Activations& a, Panel& p,
                 float* nat) {
  using W = Weights<T>;
  constexpr int kGroups = W::kSub / 4;
  constexpr int kSubsPerStep = 64 / W::kSub;
  const int64_t nsub = w.cols / W::kSub;
  const int64_t steps = a.cols_pad / 64;
  const bool odd_blocks = W::kSub == 32 && (w.cols / 32) % 2 == 1;
  const auto* base = static_cast<const uint8_t*>(w.data) + row0 * w.row_bytes;
  for (int64_t s = 0; s < steps; ++s) {
    const bool has_b = !(odd_blocks && s == steps - 1);
    for (int c = 0; c < kPanelVecs; ++c) {
      __m512 v[16];
      for (int r = 0; r < 16; ++r) {
        const int64_t row = 16 * c + r;
        const uint8_t* rp = base + row * w.row_bytes;
        v[r] = row >= valid ? _mm512_setzero_ps()
               : has_b      ? _mm512_castsi512_ps(W::template unpack<true>(rp, s))
                            : _mm512_castsi512_ps(W::template unpack<false>(rp, s));
      }
      avx512::transpose16(v);
      for (int k = 0; k < 16; ++k) {
        const int64_t b = kSubsPerStep * s + step_sub<W>(k);
        uint8_t* dst = p.w + ((b * kGroups + step_group<W>(k)) * kPanelVecs + c) * 64;
        _mm512_store_ps(reinterpret_cast<float*>(dst), v[k]);
      }
    }
  }
  float* dwn = nat;
  float* mwn = nat + kPanelRows * a.nsub_pad + 16;
  const int64_t stride = group_scales<W>(base, w.row_bytes, valid, nsub, a.nsub_pad, dwn, mwn);
  for (int64_t b0 = 0; b0 < nsub; b0 += 16) {
    for (int which = 0; which < (W::kMin ? 2 : 1); ++which) {
      const float* src = which == 0 ? dwn : mwn;
      float* dst = which == 0 ? p.dw : p.mw;
      for (int c = 0; c < kPanelVecs; ++c) {
        __m512 v[16];
        for (int r = 0; r < 16; ++r) {
          const int64_t row = 16 * c + r;
          v[r] = row < valid ? _mm512_loadu_ps(src + row * stride + b0) : _mm512_setzero_ps();
        }
        avx512::transpose16(v);
        for (int64_t k = 0; k < std::min<int64_t>(16, nsub - b0); ++k) {
          _mm512_store_ps(dst + (b0 + k) * kPanelRows + 16 * c, v[k]);
        }
      }
    }
  }
}

// The same panel from packed weights (packed_weights.h): rows [row0, row0 + valid), row0 a
// multiple of 16. A packed block already has lane = weight row, so building is unpacking.
template <GgmlType T>
void build_panel_packed(const WeightMatrix& w, int64_t row0, int64_t valid, const Activations& a,
                        Panel& p) {
  constexpr PackedFormat kFormat = packed_format(T);
  constexpr bool kEightBit = kFormat.eight_bit;
  constexpr bool kMin = kFormat.has_min;
  constexpr int64_t kCodeBytes = kFormat.code_bytes;
  const int64_t nsub = w.cols / 32;
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int c = 0; c < kPanelVecs; ++c) {
    const int64_t first = row0 + 16 * c;
    if (16 * c >= valid) {  // rows beyond the matrix: zero codes and scales
      for (int64_t b = 0; b < nsub; ++b) {
        for (int g = 0; g < 8; ++g) {
          _mm512_store_si512(p.w + ((b * 8 + g) * kPanelVecs + c) * 64, _mm512_setzero_si512());
        }
        _mm512_store_ps(p.dw + b * kPanelRows + 16 * c, _mm512_setzero_ps());
        _mm512_store_ps(p.mw + b * kPanelRows + 16 * c, _mm512_setzero_ps());
      }
      continue;
    }
    const uint8_t* blk = w.packed + (first / 16) * w.packed_block_bytes;
    const uint8_t* scales = blk + nsub * kCodeBytes;
    for (int64_t b = 0; b < nsub; ++b) {
      const uint8_t* codes = blk + b * kCodeBytes;
      uint8_t* dst = p.w + (b * 8 * kPanelVecs + c) * 64;
      for (int g = 0; g < (kEightBit ? 8 : 4); ++g) {
        const __m512i raw = _mm512_load_si512(codes + 64 * g);
        if (kEightBit) {
          _mm512_store_si512(dst + g * kPanelVecs * 64, raw);
        } else {
          __m512i lo = _mm512_and_si512(raw, low);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
          if constexpr (kFormat.five_bit) {
            avx512::fifth_bits(_mm512_load_si512(codes + 256), g, &lo, &hi);
          }
          _mm512_store_si512(dst + g * kPanelVecs * 64, lo);
          _mm512_store_si512(dst + (g + 4) * kPanelVecs * 64, hi);
        }
      }
      if constexpr (kFormat.super()) {  // Q4_K
        __m512 dw, mw;
        avx512::q4_k_packed_scales(scales + (b / kSuperSubs) * kFormat.super_head_bytes,
                                   b % kSuperSubs, &dw, &mw);
        _mm512_store_ps(p.dw + b * kPanelRows + 16 * c, dw);
        _mm512_store_ps(p.mw + b * kPanelRows + 16 * c, mw);
        continue;
      }
      const __m512 dw =
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales + 32 * b)));
      _mm512_store_ps(p.dw + b * kPanelRows + 16 * c, dw);
      if (kMin) {
        _mm512_store_ps(p.mw + b * kPanelRows + 16 * c,
                        _mm512_cvtph_ps(_mm256_load_si256(
                            reinterpret_cast<const __m256i*>(scales + 32 * (nsub + b)))));
      }
    }
  }
}

// Activation rows [i0, i0 + R) against the panel; writes y rows i0.. at columns row0 + [0, valid).
template <GgmlType T, int R>
void panel_tile(const Panel& p, const Activations& a, int64_t nsub, int64_t i0, float* y,
                int64_t ldy, int64_t row0, int64_t valid) {
  using W = Weights<T>;
  constexpr int kGroups = W::kSub / 4;
  constexpr int C = kPanelVecs;
  const int8_t* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = a.q + (i0 + i) * a.cols_pad;
  alignas(64) float chain_a[R][C][16];  // the parity-0 chain, kept while parity 1 runs
  for (int parity = 0; parity < 2; ++parity) {
    __m512 facc[R][C];
    for (int i = 0; i < R; ++i) {
      for (int c = 0; c < C; ++c) facc[i][c] = _mm512_setzero_ps();
    }
    for (int64_t b = parity; b < nsub; b += 2) {
      __m512i acc[R][C];
      for (int i = 0; i < R; ++i) {
        for (int c = 0; c < C; ++c) acc[i][c] = _mm512_setzero_si512();
      }
      const uint8_t* wb = p.w + b * kGroups * C * 64;
      for (int g = 0; g < kGroups; ++g) {
        __m512i wv[C];
        for (int c = 0; c < C; ++c) wv[c] = _mm512_load_si512(wb + (g * C + c) * 64);
        for (int i = 0; i < R; ++i) {
          int32_t x4;
          std::memcpy(&x4, xr[i] + b * W::kSub + 4 * g, 4);
          const __m512i xb = _mm512_set1_epi32(x4);
          for (int c = 0; c < C; ++c) acc[i][c] = dpbusd(acc[i][c], wv[c], xb);
        }
      }
      for (int i = 0; i < R; ++i) {
        const __m512 dx = _mm512_set1_ps(a.dxs[(i0 + i) * a.nsub_pad + b]);
        const __m512 ex = _mm512_set1_ps(a.exs[(i0 + i) * a.nsub_pad + b]);
        for (int c = 0; c < C; ++c) {
          const __m512 dw = _mm512_load_ps(p.dw + b * kPanelRows + 16 * c);
          const __m512 mw = W::kMin ? _mm512_load_ps(p.mw + b * kPanelRows + 16 * c) : dw;
          facc[i][c] = epilogue<W::kMin>(facc[i][c], acc[i][c], dx, ex, dw, mw);
        }
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int c = 0; c < C; ++c) {
        if (parity == 0) {
          _mm512_store_ps(chain_a[i][c], facc[i][c]);
          continue;
        }
        float* yi = y + (i0 + i) * ldy + row0;
        const int64_t left = std::clamp<int64_t>(valid - 16 * c, 0, 16);
        const __m512 sum = _mm512_add_ps(_mm512_load_ps(chain_a[i][c]), facc[i][c]);
        _mm512_mask_storeu_ps(yi + 16 * c, static_cast<__mmask16>((1u << left) - 1), sum);
      }
    }
  }
}

template <GgmlType T>
void panel_kernel(const WeightMatrix& w, const Activations& a, float* y, int64_t r0, int64_t r1) {
  using W = Weights<T>;
  const int64_t nsub = w.cols / W::kSub;
  const size_t w_bytes = static_cast<size_t>(a.nsub_pad * (W::kSub / 4) * kPanelVecs * 64);
  const size_t s_bytes = static_cast<size_t>(a.nsub_pad * kPanelRows) * sizeof(float);
  const size_t nat_bytes = static_cast<size_t>(2 * (kPanelRows * a.nsub_pad + 16)) * sizeof(float);
  auto* mem =
      static_cast<uint8_t*>(thread_scratch(kScratchWeights).get(w_bytes + 2 * s_bytes + nat_bytes));
  Panel p;
  p.w = mem;
  p.dw = reinterpret_cast<float*>(mem + w_bytes);
  p.mw = reinterpret_cast<float*>(mem + w_bytes + s_bytes);
  auto* nat = reinterpret_cast<float*>(mem + w_bytes + 2 * s_bytes);
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
    const int64_t valid = std::min<int64_t>(kPanelRows, r1 - p0);
    // Q6_K panels come from the file's rows, which a Q6_K matrix always keeps (packed_weights.h)
    if constexpr (packed_format(T).code_bytes != 0 && !packed_format(T).six_bit) {
      if (w.packed != nullptr) {
        build_panel_packed<T>(w, p0, valid, a, p);
      } else {
        build_panel<T>(w, p0, valid, a, p, nat);
      }
    } else {
      build_panel<T>(w, p0, valid, a, p, nat);
    }
    int64_t i0 = 0;
    for (; i0 + kPanelTile <= a.n; i0 += kPanelTile) {
      panel_tile<T, kPanelTile>(p, a, nsub, i0, y, w.rows, p0, valid);
    }
    switch (a.n - i0) {
      case 3:
        panel_tile<T, 3>(p, a, nsub, i0, y, w.rows, p0, valid);
        break;
      case 2:
        panel_tile<T, 2>(p, a, nsub, i0, y, w.rows, p0, valid);
        break;
      case 1:
        panel_tile<T, 1>(p, a, nsub, i0, y, w.rows, p0, valid);
        break;
      default:
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Driver.

template <GgmlType T>
void quantized_matmul(const WeightMatrix& w, const float* x, int64_t n, float* y,
                      ThreadPool* pool) {
  using W = Weights<T>;
  constexpr int kSub = W::kSub;
  Activations a;
  a.n = n;
  a.n_pad = n == 1 ? 1 : round_up(n, kTileRows);
  a.cols = w.cols;
  a.cols_pad = round_up(w.cols, 64);
  a.units = a.cols_pad / (2 * kSub);
  a.units_pad = round_up(a.units, 8);
  a.nsub_pad = 2 * a.units_pad;
  a.tiles = n == 1 ? 0 : a.n_pad / kTileRows;
  auto r64 = [](int64_t v) { return static_cast<size_t>(round_up(v, 64)); };
  const size_t q_bytes = r64(a.n_pad * a.cols_pad);
  const size_t d_bytes = r64(a.n_pad * (a.cols_pad / 32) * 4);
  const size_t s_bytes = r64(a.n_pad * (a.cols_pad / 16) * 4);
  const size_t sub_bytes = r64(a.n_pad * a.nsub_pad * 4);
  const size_t qt_bytes = n == 1 ? 0 : q_bytes;
  const size_t t_bytes = n == 1 ? 0 : r64(a.tiles * a.units_pad * 16 * 4);
  auto* mem = static_cast<uint8_t*>(
      thread_scratch(kScratchActivations)
          .get(q_bytes + d_bytes + s_bytes + 2 * sub_bytes + qt_bytes + 2 * t_bytes));
  a.q = reinterpret_cast<int8_t*>(mem);
  a.d = reinterpret_cast<float*>(mem += q_bytes);
  a.s16 = reinterpret_cast<int32_t*>(mem += d_bytes);
  a.dxs = reinterpret_cast<float*>(mem += s_bytes);
  a.exs = reinterpret_cast<float*>(mem += sub_bytes);
  a.qt = reinterpret_cast<int8_t*>(mem += sub_bytes);
  a.dxt = reinterpret_cast<float*>(mem += qt_bytes);
  a.ext = reinterpret_cast<float*>(mem += t_bytes);

  if (n == 1) {
    auto prepare = [&] {
      prepare_row<kSub, W::kMin, W::kOffset>(x, a, 0);
      if constexpr (W::kNibbleOrder) {  // match the weights' code order: [A lo, B lo, A hi, B hi]
        for (int64_t s = 0; s < a.cols_pad / 64; ++s) {
          const __m512i v = _mm512_loadu_si512(a.q + 64 * s);
          _mm512_storeu_si512(a.q + 64 * s, _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0)));
        }
      }
    };
    if (pool && pool->size() > 1) {
      // Thread 0 quantizes the row while the others extract their first group's scales.
      std::atomic<int> ready{0};
      const int64_t groups = (w.rows + 7) / 8;
      pool->run([&](int ti, int nt) {
        if (ti == 0) {
          prepare();
          ready.store(1, std::memory_order_release);
        }
        const int64_t r0 = std::min(w.rows, groups * ti / nt * 8);
        const int64_t r1 = std::min(w.rows, groups * (ti + 1) / nt * 8);
        if (r0 < r1) row_kernel<T>(w, a, y, r0, r1, ti == 0 ? nullptr : &ready, pool);
      });
    } else {
      prepare();
      row_kernel<T>(w, a, y, 0, w.rows, nullptr, nullptr);
    }
    return;
  }
  if (n >= kPanelMinRows) {
    auto prepare_rows = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) prepare_row<kSub, W::kMin, W::kOffset>(x, a, i);
    };
    auto body = [&](int64_t r0, int64_t r1) { panel_kernel<T>(w, a, y, r0, r1); };
    if (pool) {
      pool->parallel_for(a.n_pad, kTileRows, prepare_rows);
      // Panels claimed one at a time (stealing_split.h) rather than a static half each, which
      // leaves the faster thread waiting whenever the other core is slowed down.
      const int64_t panels = (w.rows + kPanelRows - 1) / kPanelRows;
      StealingSplit split(panels, pool->size());
      pool->run([&](int ti, int) {
        for (StealingSplit::Claim c = split.next(ti); c.item >= 0; c = split.next(ti)) {
          body(c.item * kPanelRows, std::min(w.rows, (c.item + 1) * kPanelRows));
        }
      });
    } else {
      prepare_rows(0, a.n_pad);
      body(0, w.rows);
    }
    return;
  }
  // Tile kernel: thread 0 prepares the few activation rows while the others unpack their first
  // weights. The tile shape follows n (see TileShape).
  auto run_tiles = [&](auto h) {
    constexpr int H = decltype(h)::value;
    a.tiles = (n + H - 1) / H;  // <= n_pad / 8, what the buffers were sized for
    auto prepare = [&] {
      for (int64_t i = 0; i < a.tiles * H; ++i) prepare_row<kSub, W::kMin, W::kOffset>(x, a, i);
      build_tiles<kSub, H>(a);
    };
    if (pool && pool->size() > 1) {
      std::atomic<int> ready{0};
      const int64_t groups = (w.rows + 7) / 8;
      pool->run([&](int ti, int nt) {
        if (ti == 0) {
          prepare();
          ready.store(1, std::memory_order_release);
        }
        const int64_t r0 = std::min(w.rows, groups * ti / nt * 8);
        const int64_t r1 = std::min(w.rows, groups * (ti + 1) / nt * 8);
        if (r0 < r1) tile_kernel<T, H>(w, a, y, r0, r1, ti == 0 ? nullptr : &ready, pool);
      });
    } else {
      prepare();
      tile_kernel<T, H>(w, a, y, 0, w.rows, nullptr, nullptr);
    }
  };
  if (n <= 2) {
    run_tiles(std::integral_constant<int, 2>{});
  } else if (n <= 4) {
    run_tiles(std::integral_constant<int, 4>{});
  } else {
    run_tiles(std::integral_constant<int, 8>{});
  }
}

}  // namespace

void quantize_activations_avx512(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  quantize_row(x, cols, q, d, s16);
}

void matmul_avx512(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
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
      return matmul_float_avx512(w, x, n, y, pool);
  }
}

}  // namespace detail
}  // namespace specdec
