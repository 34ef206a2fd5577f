// AVX2 + FMA kernels of the element-wise and attention ops (the OpsKernels table for
// Isa::kAvx2). Compiled with -mavx2 -mfma; only called where the CPU supports them.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/kernel_table.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/transpose_avx2.h"
#include "backend/k_tiles.h"

namespace specdec {
namespace {

constexpr int kLanes = 8;

// One K/V element as a float (exact): a float, an IEEE half or a q8_0 code.
inline float to_float(float x) {
  return x;
}
inline float to_float(uint16_t h) {
  return _cvtsh_ss(h);
}
inline float to_float(int8_t c) {
  return static_cast<float>(c);
}

// Lane mask for the first n (0..8) lanes: loadu(kTailMask + 8 - n).
alignas(32) constexpr int32_t kTailMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                               0,  0,  0,  0,  0,  0,  0,  0};
inline __m256i tail_mask(int64_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailMask + kLanes - n));
}

inline float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// exp(x), Cephes-style: x = n·ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r, and
// 2^n built in the exponent field. Relative error about 2 ulp; 0 below ln(FLT_MIN), +inf above
// ln(FLT_MAX) (denormal results are flushed to 0).
inline __m256 exp_ps(__m256 x) {
  const __m256 kMin = _mm256_set1_ps(-87.33654475f);  // ln(FLT_MIN)
  const __m256 kMax = _mm256_set1_ps(88.72283905f);   // ln(FLT_MAX)
  // Operand order keeps a NaN: min/max return the second operand when either is NaN.
  const __m256 xc = _mm256_max_ps(kMin, _mm256_min_ps(kMax, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n <= 127 keeps 2^n finite; e^r absorbs the rest for x near ln(FLT_MAX).
  const __m256i ni = _mm256_cvtps_epi32(_mm256_min_ps(n, _mm256_set1_ps(127.0f)));
  const __m256 pow2n =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  __m256 result = _mm256_mul_ps(y, pow2n);
  result = _mm256_andnot_ps(_mm256_cmp_ps(x, kMin, _CMP_LT_OQ), result);
  return _mm256_blendv_ps(result, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, kMax, _CMP_GT_OQ));
}

// 2^x for the attention softmax and merge, where x <= 0 (or -inf): x clamps to -125 (so the
// result stays a normal number: an underflow would cost a microcode assist; 2^-125 stands in for
// anything smaller), x = n + f with n = round(x), f in [-1/2, 1/2] exact, a degree-6 polynomial
// for 2^f (relative error below 1e-7), and 2^n built in the exponent field.
inline __m256 exp2_nonpositive(__m256 x) {
  const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(-125.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(xc, n);
  __m256 y = _mm256_set1_ps(1.5370704932e-4f);
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.3399848249e-3f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(9.6183735877e-3f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.5503290147e-2f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.4022647738e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(6.9314718246e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256 pow2n =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(y, pow2n);
}

void rmsnorm_avx2(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                  float* y) {
  const int64_t dim_vec = dim / kLanes * kLanes;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;  // [dim]
    float* yr = y + r * dim;        // [dim]
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 4 * kLanes <= dim; i += 4 * kLanes) {
      for (int u = 0; u < 4; ++u) {
        const __m256 xv = _mm256_loadu_ps(xr + i + u * kLanes);
        acc[u] = _mm256_fmadd_ps(xv, xv, acc[u]);
      }
    }
    for (; i < dim_vec; i += kLanes) {
      const __m256 xv = _mm256_loadu_ps(xr + i);
      acc[0] = _mm256_fmadd_ps(xv, xv, acc[0]);
    }
    float sum_sq =
        hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < dim; ++i) sum_sq += xr[i] * xr[i];
    const __m256 inv_rms = _mm256_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps));
    for (i = 0; i < dim_vec; i += kLanes) {
      const __m256 xv = _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv_rms);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(xv, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = xr[i] * _mm256_cvtss_f32(inv_rms) * weight[i];
  }
}

inline __m256 swiglu_ps(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void swiglu_avx2(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(out + i, swiglu_ps(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    const __m256 u = _mm256_maskload_ps(up + i, m);
    _mm256_maskstore_ps(out + i, m, swiglu_ps(g, u));
  }
}

float row_max_avx2(const float* x, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 mx = neg_inf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 xv =
        _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m));
    mx = _mm256_max_ps(mx, xv);
  }
  return hmax(mx);
}

float exp_shifted_sum_avx2(float* x, int64_t n, float max_value) {
  const __m256 max = _mm256_set1_ps(max_value);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int u = 0; u < 4; ++u) {
      const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + u * kLanes), max));
      _mm256_storeu_ps(x + i + u * kLanes, e);
      acc[u] = _mm256_add_ps(acc[u], e);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), max));
    _mm256_storeu_ps(x + i, e);
    acc[0] = _mm256_add_ps(acc[0], e);
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), max));
    _mm256_maskstore_ps(x + i, m, e);
    acc[1] = _mm256_add_ps(acc[1], _mm256_and_ps(e, _mm256_castsi256_ps(m)));
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

void scale_avx2(float* x, int64_t n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), av));
  }
}

// 8 values of a V row as floats: floats, IEEE halves (F16C) or int8 codes (q8_0), each converted
// exactly. The first n (<= 8) lanes where masked (the rest zero; the halves and codes of a
// masked tail go through a buffer, as there is no masked 16- or 8-bit load).
inline __m256 load_v8(const float* x) {
  return _mm256_loadu_ps(x);
}
inline __m256 load_v8(const uint16_t* x) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}
inline __m256 load_v8(const int8_t* x) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x))));
}
inline __m256 load_v8_masked(const float* x, int n) {
  return _mm256_maskload_ps(x, tail_mask(n));
}
template <class V>
inline __m256 load_v8_masked(const V* x, int n) {
  alignas(32) float buf[kLanes] = {};
  for (int i = 0; i < n; ++i) buf[i] = to_float(x[i]);
  return _mm256_load_ps(buf);
}

// The calling thread's float tile for K or V elements converted inside a kernel call (K rows
// transposed for scoring, V halves or codes for a multi-pass Σ p·v): one buffer for both, as no
// kernel call nests in another; it grows to the largest call and is kept.
inline float* float_tile(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

// --- attention scores -----------------------------------------------------------------------
// The lanes hold 8 slots. A score is one FMA chain over the dims in order,
//   acc = 0; acc = fma(q[r][d], k[slot][d], acc) for d = 0, 1, .., head_dim - 1,
// so the K of 8 slots is one vector per dim (8 halves or codes of a K tile, or 8 float rows
// transposed), each converted K vector serves every query row of the pass, each q broadcast every
// slot vector, and no horizontal sums run. The sequence of a score depends only on its q row and
// K slot, never on n_q, the pass, or where the K came from (tiles of halves or codes, float rows):
// attn_scores_k16/k8 equal attn_scores on the same values bit for bit.

// Rows [0, R) of q (row r at q + r * head_dim) against V slot vectors: vector v's dim d is the 8
// elements at k + (v / 2) * tile_stride + (v % 2) * 8 + d * 16 (K tiles of 16 slots). Scores into
// s (row r at s + r * ld_s, slot 8 v + lane at column 8 v + lane); `slots`: the valid columns
// (the rest is computed and not stored). pf (may be null) steps once per 4 dims.
// Up to 3 rows keep their q broadcasts in registers and load each K vector as it is used (R x V
// accumulators + R + 1 registers); more rows keep the V K vectors and broadcast q per row.
template <int R, int V, class KT>
void scores_tile_pass(const float* q, int head_dim, const KT* kt, int64_t tile_stride, float* s,
                      int64_t ld_s, int64_t slots, AttnPrefetchCursor* pf) {
  static_assert(V == 2 || V == 4);
  const KT* kv_base[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) kv_base[v] = kt + (v / 2) * tile_stride + (v % 2) * kLanes;
  __m256 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int d = 0; d < head_dim; ++d) {
    if (pf != nullptr && (d & 3) == 0) pf->step();
    const int64_t off = static_cast<int64_t>(d) * kKTileSlots;
    if constexpr (R <= 3) {
      __m256 qb[R];
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) qb[r] = _mm256_broadcast_ss(q + r * head_dim + d);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const __m256 k = load_v8(kv_base[v] + off);
#pragma GCC unroll 3
        for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(qb[r], k, acc[r][v]);
      }
    } else {
      __m256 k[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) k[v] = load_v8(kv_base[v] + off);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256 qb = _mm256_broadcast_ss(q + r * head_dim + d);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(qb, k[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const int64_t left = slots - kLanes * v;
      float* out = s + r * ld_s + kLanes * v;
      if (left >= kLanes) {
        _mm256_storeu_ps(out, acc[r][v]);
      } else if (left > 0) {
        _mm256_maskstore_ps(out, tail_mask(left), acc[r][v]);
      }
    }
  }
}

// Rows per pass by slot vectors per pass: 12 accumulators either way.
template <int V>
inline constexpr int kPassRows = V == 4 ? 3 : 6;

// All n_q rows against the V slot vectors from kt, in passes of at most kPassRows<V> rows of
// near-equal size; the first pass steps pf.
template <int V, class KT>
void scores_tile_rows(const float* q, int n_q, int head_dim, const KT* kt, int64_t tile_stride,
                      float* s, int64_t ld_s, int64_t slots, AttnPrefetchCursor& pf) {
  constexpr int P = kPassRows<V>;
  static constexpr auto kByRows =
      kernel_table<P>([]<int R>() { return &scores_tile_pass<R, V, KT>; });
  const int passes = (n_q + P - 1) / P;
  AttnPrefetchCursor* step = &pf;
  for (int k = 0, r = 0; k < passes; ++k, step = nullptr) {
    const int r_end = n_q * (k + 1) / passes;
    kByRows[r_end - r - 1](q + static_cast<int64_t>(r) * head_dim, head_dim, kt, tile_stride,
                           s + r * ld_s, ld_s, slots, step);
    r = r_end;
  }
}

// Slots [0, n_slots) of K tiles (kt at a tile's first slot, tiles tile_stride elements apart):
// up to 3 rows two tiles at a time (decode), more rows one tile at a time. Reads (does not
// store) the rest of the last tile.
template <class KT>
void scores_tiles(const float* q, int n_q, const KT* kt, int64_t tile_stride, int64_t n_slots,
                  int head_dim, float* s, int64_t ld_s, AttnPrefetchCursor& pf) {
  const int64_t tiles = (n_slots + kKTileSlots - 1) / kKTileSlots;
  int64_t t = 0;
  if (n_q <= kPassRows<4>) {
    for (; t + 2 <= tiles; t += 2) {
      scores_tile_rows<4, KT>(q, n_q, head_dim, kt + t * tile_stride, tile_stride,
                              s + t * kKTileSlots, ld_s, n_slots - t * kKTileSlots, pf);
    }
  }
  for (; t < tiles; ++t) {
    scores_tile_rows<2, KT>(q, n_q, head_dim, kt + t * tile_stride, tile_stride,
                            s + t * kKTileSlots, ld_s, n_slots - t * kKTileSlots, pf);
  }
}

// Prefetch steps of scores_tiles: per 4 dims of each tile group's first pass.
inline int64_t scores_tiles_steps(int n_q, int64_t n_slots, int head_dim) {
  const int64_t tiles = (n_slots + kKTileSlots - 1) / kKTileSlots;
  const int64_t groups = n_q <= kPassRows<4> ? (tiles + 1) / 2 : tiles;
  return groups * ((head_dim + 3) / 4);
}

template <class KT>
void attn_scores_tiles_avx2(const float* q, int n_q, const KT* kt, int64_t tile_stride,
                            int64_t n_slots, int head_dim, float* s, int64_t ld_s,
                            AttnPrefetch next) {
  AttnPrefetchCursor pf(next, scores_tiles_steps(n_q, n_slots, head_dim));
  scores_tiles(q, n_q, kt, tile_stride, n_slots, head_dim, s, ld_s, pf);
  pf.rest();
}

// Float K rows: each 16 rows are transposed into a float tile ([head_dim, 16], rows past n_rows
// zero) and scored as a tile - the same chains as from a cache's tiles.
void attn_scores_avx2(const float* q, int n_q, const float* k, int64_t k_stride, int64_t n_rows,
                      int head_dim, float* s, int64_t ld_s, AttnPrefetch next) {
  float* tile = float_tile(static_cast<size_t>(head_dim) * kKTileSlots);  // [head_dim, 16]
  AttnPrefetchCursor pf(next, (n_rows + kKTileSlots - 1) / kKTileSlots * ((head_dim + 3) / 4));
  for (int64_t j0 = 0; j0 < n_rows; j0 += kKTileSlots) {
    const int64_t rows = std::min<int64_t>(kKTileSlots, n_rows - j0);
    for (int half = 0; half < 2; ++half) {
      const int64_t first = half * kLanes;  // the 8 slots' first, within the tile
      const int64_t n8 = std::clamp<int64_t>(rows - first, 0, kLanes);
      int d = 0;
      for (; d + kLanes <= head_dim; d += kLanes) {
        __m256 r[kLanes];  // r[i]: dims d .. d + 7 of slot first + i
        for (int i = 0; i < kLanes; ++i) {
          r[i] =
              i < n8 ? _mm256_loadu_ps(k + (j0 + first + i) * k_stride + d) : _mm256_setzero_ps();
        }
        avx2::transpose8(r);  // r[i]: dim d + i of the 8 slots
        for (int i = 0; i < kLanes; ++i)
          _mm256_storeu_ps(tile + (d + i) * kKTileSlots + first, r[i]);
      }
      for (; d < head_dim; ++d) {
        for (int i = 0; i < kLanes; ++i) {
          tile[d * kKTileSlots + first + i] = i < n8 ? k[(j0 + first + i) * k_stride + d] : 0.0f;
        }
      }
    }
    scores_tile_rows<2, float>(q, n_q, head_dim, tile, 0, s + j0, ld_s, rows, pf);
  }
  pf.rest();
}

// A row of kAttnChunk = 64 columns is eight 8-lane vectors; l = hsum of the pairwise tree
// ((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7)).
static_assert(kAttnChunk == 8 * kLanes, "the chunk softmax assumes 64-column chunks");

void attn_chunk_softmax_avx2(float* s, int64_t ld_s, int n_q, const int32_t* n_valid, float* m,
                             float* l) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  for (int r = 0; r < n_q; ++r) {
    float* row = s + r * ld_s;  // [64]
    const int n = n_valid[r];
    if (n == 0) {
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(row + c * kLanes, _mm256_setzero_ps());
      m[r] = -INFINITY;
      l[r] = 0.0f;
      continue;
    }
    __m256 valid[8];
    __m256 x[8];
    for (int c = 0; c < 8; ++c) {
      const int rem = n - c * kLanes;
      valid[c] = _mm256_castsi256_ps(tail_mask(rem >= kLanes ? kLanes : rem <= 0 ? 0 : rem));
      x[c] = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(row + c * kLanes), valid[c]);
    }
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3])),
                              _mm256_max_ps(_mm256_max_ps(x[4], x[5]), _mm256_max_ps(x[6], x[7])));
    const float max = hmax(mx);
    const __m256 max8 = _mm256_set1_ps(max);
    __m256 e[8];
    for (int c = 0; c < 8; ++c) {
      e[c] = _mm256_and_ps(valid[c], exp2_nonpositive(_mm256_sub_ps(x[c], max8)));
      _mm256_storeu_ps(row + c * kLanes, e[c]);
    }
    m[r] = max;
    l[r] = hsum(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[2], e[3])),
                              _mm256_add_ps(_mm256_add_ps(e[4], e[5]), _mm256_add_ps(e[6], e[7]))));
  }
}

// 8 rows' weights per exp2_nonpositive.
void attn_merge_weights_avx2(const float* m, const float* l, int n_q, float* big_m, float* big_l,
                             float* wo, float* wn) {
  for (int r0 = 0; r0 < n_q; r0 += kLanes) {
    const int n = n_q - r0 < kLanes ? n_q - r0 : kLanes;
    alignas(32) float mv[kLanes], old_max[kLanes], w_old[kLanes], w_new[kLanes];
    for (int u = 0; u < kLanes; ++u) {
      mv[u] = u < n ? m[r0 + u] : 0.0f;
      old_max[u] = u < n && m[r0 + u] != -INFINITY ? big_m[r0 + u] : 0.0f;
    }
    const __m256 new_max = _mm256_max_ps(_mm256_load_ps(old_max), _mm256_load_ps(mv));
    _mm256_store_ps(w_old, exp2_nonpositive(_mm256_sub_ps(_mm256_load_ps(old_max), new_max)));
    _mm256_store_ps(w_new, exp2_nonpositive(_mm256_sub_ps(_mm256_load_ps(mv), new_max)));
    for (int u = 0; u < n; ++u) {
      const int r = r0 + u;
      if (m[r] == -INFINITY) {
        wo[r] = 1.0f;
        wn[r] = 0.0f;
        continue;
      }
      wo[r] = w_old[u];
      wn[r] = w_new[u];
      big_l[r] = std::fma(big_l[r], w_old[u], l[r] * w_new[u]);
      big_m[r] = big_m[r] > m[r] ? big_m[r] : m[r];
    }
  }
}

// big_a = fma(big_a, wo, a·wn) per element, as the end of accumulate_pass<R, kMasked, true>.
void attn_merge_rows_avx2(const float* a, int n_q, int head_dim, const float* wo, const float* wn,
                          float* big_a) {
  const int d_vec = head_dim / kLanes * kLanes;
  for (int r = 0; r < n_q; ++r) {
    const float* a_r = a + static_cast<int64_t>(r) * head_dim;    // [head_dim]
    float* big_a_r = big_a + static_cast<int64_t>(r) * head_dim;  // [head_dim]
    const __m256 wo8 = _mm256_set1_ps(wo[r]);
    const __m256 wn8 = _mm256_set1_ps(wn[r]);
    for (int d = 0; d < d_vec; d += kLanes) {
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(a_r + d), wn8);
      _mm256_storeu_ps(big_a_r + d, _mm256_fmadd_ps(_mm256_loadu_ps(big_a_r + d), wo8, x));
    }
    for (int d = d_vec; d < head_dim; ++d) big_a_r[d] = std::fma(big_a_r[d], wo[r], a_r[d] * wn[r]);
  }
}

// Rows of floats, halves or codes [n_rows, cols] (src_stride apart) as floats, exactly.
template <class T>
void rows_to_f32_avx2(const T* src, int64_t src_stride, int64_t n_rows, int cols, float* dst) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const T* s = src + r * src_stride;  // [cols]
    float* d = dst + r * cols;          // [cols]
    int c = 0;
    for (; c + kLanes <= cols; c += kLanes) _mm256_storeu_ps(d + c, load_v8(s + c));
    for (; c < cols; ++c) d[c] = to_float(s[c]);
  }
}

// out[r, 0:16] += Σ_j p[r, j] · v[j, 0:16] for R (1..6) rows: two 8-lane chunks per row, 2R
// accumulators. kMasked: the two chunks cover only the lanes of m0 and m1. kMerge: the sums
// start from zero and end as out = fma(out, wo[r], sum·wn[r]) (attn_merge_rows' arithmetic).
template <int R, bool kMasked, bool kMerge, class V>
void accumulate_pass(const float* p, int64_t ld_p, const V* v, int64_t v_stride, int64_t n_rows,
                     int head_dim, int n0, int n1, const float* wo, const float* wn, float* out,
                     AttnPrefetchCursor& pf) {
  static_assert(R >= 1 && R <= 6);
  const __m256i mask[2] = {tail_mask(n0), tail_mask(n1)};  // used where kMasked
  const int n_lanes[2] = {n0, n1};
  auto load = [](const float* x, __m256i m) {
    if constexpr (kMasked) return _mm256_maskload_ps(x, m);
    return _mm256_loadu_ps(x);
  };
  auto store = [](float* x, __m256i m, __m256 a) {
    if constexpr (kMasked) {
      _mm256_maskstore_ps(x, m, a);
    } else {
      _mm256_storeu_ps(x, a);
    }
  };
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      acc[r][c] = kMerge ? _mm256_setzero_ps() : load(out + r * head_dim + c * kLanes, mask[c]);
    }
  }
  for (int64_t j = 0; j < n_rows; ++j) {
    pf.step();
    const V* vj = v + j * v_stride;
    __m256 vv[2];
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      if constexpr (kMasked) {
        vv[c] = load_v8_masked(vj + c * kLanes, n_lanes[c]);
      } else {
        vv[c] = load_v8(vj + c * kLanes);
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * ld_p + j);
      acc[r][0] = _mm256_fmadd_ps(pr, vv[0], acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(pr, vv[1], acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      float* o = out + r * head_dim + c * kLanes;
      if constexpr (kMerge) {
        const __m256 scaled = _mm256_mul_ps(acc[r][c], _mm256_set1_ps(wn[r]));
        store(o, mask[c], _mm256_fmadd_ps(load(o, mask[c]), _mm256_set1_ps(wo[r]), scaled));
      } else {
        store(o, mask[c], acc[r][c]);
      }
    }
  }
}

// Rows r0 .. r0 + R - 1 of the call: one pass per 16 dims.
template <int R, bool kMerge, class V>
void accumulate_rows(const float* p, int64_t ld_p, const V* v, int64_t v_stride, int64_t n_rows,
                     int head_dim, const float* wo, const float* wn, float* out,
                     AttnPrefetchCursor& pf) {
  int d = 0;
  for (; d + 2 * kLanes <= head_dim; d += 2 * kLanes) {
    accumulate_pass<R, false, kMerge>(p, ld_p, v + d, v_stride, n_rows, head_dim, kLanes, kLanes,
                                      wo, wn, out + d, pf);
  }
  if (d < head_dim) {
    const int rem = head_dim - d;  // 1..15
    const int n0 = rem < kLanes ? rem : kLanes, n1 = rem > kLanes ? rem - kLanes : 0;
    accumulate_pass<R, true, kMerge>(p, ld_p, v + d, v_stride, n_rows, head_dim, n0, n1, wo, wn,
                                     out + d, pf);
  }
}

constexpr int kAccumulateRows = 6;  // rows per pass (12 accumulators)

// The rows in passes of at most 6 rows of near-equal size. Halves or codes that more than one
// pass would convert are converted once into a float tile first (the same values, so the same
// bits). Each V row step of each pass is a step of the prefetch cursor.
template <bool kMerge, class V>
void accumulate_all(const float* p, int64_t ld_p, int n_q, const V* v, int64_t v_stride,
                    int64_t n_rows, int head_dim, const float* wo, const float* wn, float* out,
                    AttnPrefetch next) {
  const int passes = (n_q + kAccumulateRows - 1) / kAccumulateRows;
  if constexpr (!std::is_same_v<V, float>) {
    if (passes > 1) {
      float* tile = float_tile(static_cast<size_t>(n_rows) * head_dim);  // [n_rows, head_dim]
      rows_to_f32_avx2(v, v_stride, n_rows, head_dim, tile);
      accumulate_all<kMerge, float>(p, ld_p, n_q, tile, head_dim, n_rows, head_dim, wo, wn, out,
                                    next);
      return;
    }
  }
  static constexpr auto kByRows =
      kernel_table<kAccumulateRows>([]<int R>() { return &accumulate_rows<R, kMerge, V>; });
  AttnPrefetchCursor pf(next, passes * ((head_dim + 2 * kLanes - 1) / (2 * kLanes)) * n_rows);
  for (int k = 0, r = 0; k < passes; ++k) {
    const int r_end = n_q * (k + 1) / passes;
    kByRows[r_end - r - 1](p + r * ld_p, ld_p, v, v_stride, n_rows, head_dim,
                           kMerge ? wo + r : nullptr, kMerge ? wn + r : nullptr,
                           out + static_cast<int64_t>(r) * head_dim, pf);
    r = r_end;
  }
  pf.rest();
}

// The table's Σ p·v entries for V rows of floats, halves or codes (one instantiation each).
template <class V>
void attn_accumulate_avx2(const float* p, int64_t ld_p, int n_q, const V* v, int64_t v_stride,
                          int64_t n_rows, int head_dim, float* out, AttnPrefetch next) {
  accumulate_all<false>(p, ld_p, n_q, v, v_stride, n_rows, head_dim, nullptr, nullptr, out, next);
}

template <class V>
void attn_accumulate_merge_avx2(const float* p, int64_t ld_p, int n_q, const V* v, int64_t v_stride,
                                int64_t n_rows, int head_dim, const float* wo, const float* wn,
                                float* big_a, AttnPrefetch next) {
  accumulate_all<true>(p, ld_p, n_q, v, v_stride, n_rows, head_dim, wo, wn, big_a, next);
}

// Slots [0, n_slots) of K tiles (kt at a tile's first slot, tiles tile_stride elements apart,
// elements halves or codes) as float rows dst [n_slots, head_dim]: per 8 dims of 8 slots of a
// tile, 8 conversions and one 8 x 8 transpose; the head_dim % 8 last dims one by one. Reads
// (does not store) the rest of the last tile.
template <class T>
void k_tiles_to_rows(const T* kt, int64_t tile_stride, int64_t n_slots, int head_dim, float* dst) {
  for (int64_t t = 0; t * kKTileSlots < n_slots; ++t) {
    const T* tile = kt + t * tile_stride;  // [head_dim, 16]
    for (int half = 0; half < 2; ++half) {
      const int64_t first = t * kKTileSlots + half * kLanes;  // the slots' first
      const int64_t slots = std::min<int64_t>(kLanes, n_slots - first);
      if (slots <= 0) break;
      int d = 0;
      for (; d + kLanes <= head_dim; d += kLanes) {
        __m256 r[kLanes];  // r[i]: dim d + i of the 8 slots
        for (int i = 0; i < kLanes; ++i)
          r[i] = load_v8(tile + (d + i) * kKTileSlots + half * kLanes);
        avx2::transpose8(r);  // r[s]: dims d .. d + 7 of slot first + s
        for (int64_t s2 = 0; s2 < slots; ++s2)
          _mm256_storeu_ps(dst + (first + s2) * head_dim + d, r[s2]);
      }
      for (; d < head_dim; ++d) {
        for (int64_t s2 = 0; s2 < slots; ++s2) {
          dst[(first + s2) * head_dim + d] = to_float(tile[d * kKTileSlots + half * kLanes + s2]);
        }
      }
    }
  }
}

void k16_tiles_to_rows_avx2(const uint16_t* kt, int64_t tile_stride, int64_t n_slots, int head_dim,
                            float* dst) {
  k_tiles_to_rows(kt, tile_stride, n_slots, head_dim, dst);
}

void k8_tiles_to_rows_avx2(const int8_t* kt, int64_t tile_stride, int64_t n_slots, int head_dim,
                           float* dst) {
  k_tiles_to_rows(kt, tile_stride, n_slots, head_dim, dst);
}

// F16C conversions, 8 floats per instruction; tails through a stack buffer.
void f32_to_f16_avx2(const float* x, int64_t n, uint16_t* y) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
  if (i < n) {
    alignas(32) float xb[kLanes] = {};
    alignas(16) uint16_t yb[kLanes];
    for (int64_t j = i; j < n; ++j) xb[j - i] = x[j];
    _mm_store_si128(reinterpret_cast<__m128i*>(yb),
                    _mm256_cvtps_ph(_mm256_load_ps(xb), _MM_FROUND_TO_NEAREST_INT));
    for (int64_t j = i; j < n; ++j) y[j] = yb[j - i];
  }
}

// dst[r * cols + c] = float(src[r * src_stride + c]) for halves (f16 cache) or codes (q8_0): 8
// conversions per instruction, the tail one value at a time (the same, exact, values).

void scale_columns_avx2(const float* x, int64_t ld_x, int n_rows, const float* d, int64_t n,
                        float* out, int64_t ld_out) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ld_x;
    float* o = out + r * ld_out;
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(xr + j), _mm256_loadu_ps(d + j)));
    }
    for (; j < n; ++j) o[j] = xr[j] * d[j];
  }
}

}  // namespace

const OpsKernels& ops_kernels_avx2() {
  // clang-format off
  static const OpsKernels kernels = {
      rmsnorm_avx2,         swiglu_avx2,
      row_max_avx2,         exp_shifted_sum_avx2,
      // The packed q is the reference's (q·mult, row-major): the scores kernels read that form.
      scale_avx2,           ops_kernels_ref().attn_pack_q,
      attn_scores_avx2,     attn_chunk_softmax_avx2,
      attn_accumulate_avx2<float>, attn_merge_weights_avx2,
      attn_merge_rows_avx2, attn_accumulate_merge_avx2<float>,
      f32_to_f16_avx2,      rows_to_f32_avx2<uint16_t>,
      // Scores read the K tiles directly; V rows of halves are converted as they are loaded.
      attn_scores_tiles_avx2<uint16_t>, k16_tiles_to_rows_avx2,
      attn_accumulate_avx2<uint16_t>, attn_accumulate_merge_avx2<uint16_t>,
      ops_kernels_ref().rope_apply,  // a few rotations per head: the reference serves AVX2 hosts
      // q8_0: the same with codes.
      rows_to_f32_avx2<int8_t>, attn_scores_tiles_avx2<int8_t>,
      attn_accumulate_avx2<int8_t>, attn_accumulate_merge_avx2<int8_t>,
      scale_columns_avx2,   k8_tiles_to_rows_avx2,
  };
  // clang-format on
  return kernels;
}

}  // namespace specdec
