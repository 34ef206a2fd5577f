// AVX-512 (F/BW/VL/DQ) kernels of the element-wise and attention ops (the OpsKernels table for
// Isa::kAvx512). Tails use lane masks instead of scalar loops. Only called where supported.
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a false positive of the compiler's headers); silence that here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cpu/kernel_table.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_weights_avx512.h"  // avx512::transpose16
#include "backend/k_tiles.h"

namespace specdec {
namespace {

constexpr int kLanes = 16;

inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// exp(x): x = n·ln2 + r with |r| <= ln2/2, the same degree-6 polynomial as the AVX2 variant,
// and 2^n applied with vscalefps, which gives +inf on overflow and gradual underflow to 0
// (exp(-inf) = 0) without special cases. Relative error about 2 ulp.
inline __m512 exp_ps(__m512 x) {
  // Operand order keeps a NaN: min/max return the second operand when either is NaN.
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// 2^x for the attention softmax and merge, where x <= 0: x clamps to -125 (so the result stays a
// normal number: an underflow would cost a microcode assist; 2^-125 stands in for anything
// smaller, -inf and NaN included), x = n + f with n = round(x), f in [-1/2, 1/2] exact, a
// degree-6 polynomial for 2^f (relative error below 1e-7), 2^n applied with vscalefps; the
// _maskz form gives 0 in the lanes outside `keep`.
inline __m512 exp2_nonpositive_maskz(__mmask16 keep, __m512 x_in) {
  const __m512 x = _mm512_max_ps(x_in, _mm512_set1_ps(-125.0f));
  // f = x - round(x) in one vreduceps (exact), then n = x - f = round(x) exactly.
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 n = _mm512_sub_ps(x, f);
  __m512 y = _mm512_set1_ps(1.5370704932e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3399848249e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6183735877e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5503290147e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022647738e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718246e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, y, n);
}

inline __m512 exp2_nonpositive(__m512 x_in) {
  return exp2_nonpositive_maskz(static_cast<__mmask16>(0xffff), x_in);
}

void rmsnorm_avx512(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
                    float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;  // [dim]
    float* yr = y + r * dim;        // [dim]
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 4 * kLanes <= dim; i += 4 * kLanes) {
      for (int u = 0; u < 4; ++u) {
        const __m512 xv = _mm512_loadu_ps(xr + i + u * kLanes);
        acc[u] = _mm512_fmadd_ps(xv, xv, acc[u]);
      }
    }
    for (; i + kLanes <= dim; i += kLanes) {
      const __m512 xv = _mm512_loadu_ps(xr + i);
      acc[0] = _mm512_fmadd_ps(xv, xv, acc[0]);
    }
    if (i < dim) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail_mask(dim - i), xr + i);
      acc[1] = _mm512_fmadd_ps(xv, xv, acc[1]);
    }
    const float sum_sq = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    const __m512 inv_rms = _mm512_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps));
    for (i = 0; i + kLanes <= dim; i += kLanes) {
      const __m512 xv = _mm512_mul_ps(_mm512_loadu_ps(xr + i), inv_rms);
      _mm512_storeu_ps(yr + i, _mm512_mul_ps(xv, _mm512_loadu_ps(weight + i)));
    }
    if (i < dim) {
      const __mmask16 m = tail_mask(dim - i);
      const __m512 xv = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv_rms);
      _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(xv, _mm512_maskz_loadu_ps(m, weight + i)));
    }
  }
}

inline __m512 swiglu_ps(__m512 g, __m512 u) {
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(out + i, swiglu_ps(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    _mm512_mask_storeu_ps(out + i, m, swiglu_ps(g, u));
  }
}

float row_max_avx512(const float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 mx = neg_inf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
  if (i < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(mx);
}

float exp_shifted_sum_avx512(float* x, int64_t n, float max_value) {
  const __m512 max = _mm512_set1_ps(max_value);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int u = 0; u < 4; ++u) {
      const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + u * kLanes), max));
      _mm512_storeu_ps(x + i + u * kLanes, e);
      acc[u] = _mm512_add_ps(acc[u], e);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), max));
    _mm512_storeu_ps(x + i, e);
    acc[0] = _mm512_add_ps(acc[0], e);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max));
    _mm512_mask_storeu_ps(x + i, m, e);
    acc[1] = _mm512_mask_add_ps(acc[1], m, acc[1], e);
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

void scale_avx512(float* x, int64_t n, float a) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), av));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), av));
  }
}

// --- attention scores ---------------------------------------------------------------------
// Lanes hold 4 query rows x 4 interleaved dims: lane (r, p) of the accumulator for K row j sums
// q[r][4m + p] * k[j][4m + p] over m = 0, 1, .. (one FMA chain per lane, K quads broadcast to the
// four rows), then reduce4 adds the 4 phases as (p0 + p1) + (p2 + p3) (q is packed pre-scaled).
// That sequence is the same for every row and K row whatever n_q, n_rows or the position in the
// call (missing rows are zero lanes, missing K rows zero accumulators, which no score reads), as
// the attention driver requires; and no horizontal sum runs per dot product.

inline __m512 mul16(__m512 mult, const float* x) {
  return _mm512_mul_ps(mult, _mm512_loadu_ps(x));
}

// q rows (row r at q + (r / run_rows) * run_stride + (r % run_rows) * head_dim) times mult,
// packed by groups of 4 rows: packed[(g * steps + m) * 16 + r * 4 + p] = q[4g + r][4m + p] * mult,
// zero past n_q and head_dim; steps = ceil(head_dim / 4).
void pack_query_groups(const float* q, int n_q, int run_rows, int64_t run_stride, int head_dim,
                       float mult, float* packed) {
  const __m512 mult16 = _mm512_set1_ps(mult);
  const int steps = (head_dim + 3) / 4;
  for (int g = 0; 4 * g < n_q; ++g) {
    const int rows = n_q - 4 * g < 4 ? n_q - 4 * g : 4;
    const float* qr[4];  // [head_dim] each
    for (int r = 0; r < rows; ++r) {
      const int row = 4 * g + r;
      qr[r] = q + row / run_rows * run_stride + static_cast<int64_t>(row % run_rows) * head_dim;
    }
    float* pg = packed + static_cast<int64_t>(g) * steps * 16;  // [steps, 16]
    int m = 0;
    if (rows == 4) {
      for (; 4 * m + 16 <= head_dim; m += 4) {  // a 4x4 transpose of 128-bit quads
        const __m512 r0 = mul16(mult16, qr[0] + 4 * m);
        const __m512 r1 = mul16(mult16, qr[1] + 4 * m);
        const __m512 r2 = mul16(mult16, qr[2] + 4 * m);
        const __m512 r3 = mul16(mult16, qr[3] + 4 * m);
        const __m512 t0 = _mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 t1 = _mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(3, 2, 3, 2));
        const __m512 t2 = _mm512_shuffle_f32x4(r2, r3, _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 t3 = _mm512_shuffle_f32x4(r2, r3, _MM_SHUFFLE(3, 2, 3, 2));
        _mm512_storeu_ps(pg + (m + 0) * 16, _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_ps(pg + (m + 1) * 16, _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_storeu_ps(pg + (m + 2) * 16, _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_ps(pg + (m + 3) * 16, _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1)));
      }
    }
    for (; m < steps; ++m) {
      const int n = head_dim - 4 * m < 4 ? head_dim - 4 * m : 4;
      const __mmask8 dims = static_cast<__mmask8>((1u << n) - 1u);
      for (int r = 0; r < 4; ++r) {
        const __m128 x = r < rows ? _mm_mul_ps(_mm512_castps512_ps128(mult16),
                                               _mm_maskz_loadu_ps(dims, qr[r] + 4 * m))
                                  : _mm_setzero_ps();
        _mm_storeu_ps(pg + m * 16 + r * 4, x);
      }
    }
  }
}

// {row r: the 4 scores of slots 0..3} from the 4 slots' accumulators (lanes: row r, phase p).
inline __m512 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 b01 = _mm512_add_ps(_mm512_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 b23 = _mm512_add_ps(_mm512_shuffle_ps(a2, a3, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(a2, a3, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_ps(b01, b23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(b01, b23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of G (1..3) packed row groups against S (1..8) consecutive K rows: G·S accumulators,
// each K quad loaded once for all groups. rows[g]: valid rows of group g (1..4).
template <int G, int S>
void scores_block(const float* packed, int steps, const float* k, int64_t k_stride, int head_dim,
                  const int rows[3], float* s, int64_t ld_s) {
  __m512 acc[G][S];
#pragma GCC unroll 3
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) acc[g][j] = _mm512_setzero_ps();
  }
  const int full = head_dim / 4;
  for (int m = 0; m < full; ++m) {
    __m512 qg[G];
#pragma GCC unroll 3
    for (int g = 0; g < G; ++g) qg[g] = _mm512_loadu_ps(packed + (g * steps + m) * 16);
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) {
      const __m512 kq = _mm512_broadcast_f32x4(_mm_loadu_ps(k + j * k_stride + 4 * m));
#pragma GCC unroll 3
      for (int g = 0; g < G; ++g) acc[g][j] = _mm512_fmadd_ps(qg[g], kq, acc[g][j]);
    }
  }
  if (full < steps) {  // head_dim % 4 dims left: masked K loads (q is zero-padded)
    const __mmask8 dims = static_cast<__mmask8>((1u << (head_dim - 4 * full)) - 1u);
    __m512 qg[G];
#pragma GCC unroll 3
    for (int g = 0; g < G; ++g) qg[g] = _mm512_loadu_ps(packed + (g * steps + full) * 16);
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) {
      const __m512 kq =
          _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(dims, k + j * k_stride + 4 * full));
#pragma GCC unroll 3
      for (int g = 0; g < G; ++g) acc[g][j] = _mm512_fmadd_ps(qg[g], kq, acc[g][j]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 3
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 2
    for (int j0 = 0; j0 < S; j0 += 4) {
      const __m512 c =
          reduce4(acc[g][j0], j0 + 1 < S ? acc[g][j0 + 1] : zero,
                  j0 + 2 < S ? acc[g][j0 + 2] : zero, j0 + 3 < S ? acc[g][j0 + 3] : zero);
      float* sg = s + 4 * g * ld_s + j0;  // [rows, ld_s]
      if constexpr (S - 4 >= 0) {
        if (S - j0 >= 4) {  // full quads: plain 128-bit stores
          _mm_storeu_ps(sg, _mm512_castps512_ps128(c));
          if (rows[g] > 1) _mm_storeu_ps(sg + ld_s, _mm512_extractf32x4_ps(c, 1));
          if (rows[g] > 2) _mm_storeu_ps(sg + 2 * ld_s, _mm512_extractf32x4_ps(c, 2));
          if (rows[g] > 3) _mm_storeu_ps(sg + 3 * ld_s, _mm512_extractf32x4_ps(c, 3));
          continue;
        }
      }
      const __mmask8 slots = static_cast<__mmask8>((1u << (S - j0 < 4 ? S - j0 : 4)) - 1u);
      _mm_mask_storeu_ps(sg, slots, _mm512_castps512_ps128(c));
      if (rows[g] > 1) _mm_mask_storeu_ps(sg + ld_s, slots, _mm512_extractf32x4_ps(c, 1));
      if (rows[g] > 2) _mm_mask_storeu_ps(sg + 2 * ld_s, slots, _mm512_extractf32x4_ps(c, 2));
      if (rows[g] > 3) _mm_mask_storeu_ps(sg + 3 * ld_s, slots, _mm512_extractf32x4_ps(c, 3));
    }
  }
}

// The K rows [0, n_rows) against G row groups, by blocks of 8 rows; each block is one step of the
// prefetch cursor.
template <int G>
void scores_groups(const float* packed, int steps, const float* k, int64_t k_stride, int64_t n_rows,
                   int head_dim, const int rows[3], float* s, int64_t ld_s,
                   AttnPrefetchCursor& pf) {
  int64_t j = 0;
  for (; j + 8 <= n_rows; j += 8) {
    pf.step();
    scores_block<G, 8>(packed, steps, k + j * k_stride, k_stride, head_dim, rows, s + j, ld_s);
  }
  if (j < n_rows) pf.step();
  const float* kj = k + j * k_stride;
  float* sj = s + j;
  switch (n_rows - j) {
    case 7:
      scores_block<G, 7>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    case 6:
      scores_block<G, 6>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    case 5:
      scores_block<G, 5>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    case 4:
      scores_block<G, 4>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    case 3:
      scores_block<G, 3>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    case 2:
      scores_block<G, 2>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    case 1:
      scores_block<G, 1>(packed, steps, kj, k_stride, head_dim, rows, sj, ld_s);
      break;
    default:
      break;
  }
}

void attn_pack_q_avx512(const float* q, int n_q, int run_rows, int64_t run_stride, int head_dim,
                        float mult, float* packed) {
  pack_query_groups(q, n_q, run_rows, run_stride, head_dim, mult, packed);
}

// K rows per pass over the row groups: a tile of one head's K stays in L1 while every group
// uses it.
constexpr int64_t kScoreTileRows = 64;

// Row groups of a pass over a K tile: by threes (the last two or four by twos: 3 + 1 would leave
// a lone group).
inline int groups_in_pass(int left) {
  return left == 4 || left == 2 ? 2 : left == 1 ? 1 : 3;
}

void attn_scores_avx512(const float* packed, int n_q, const float* k, int64_t k_stride,
                        int64_t n_rows, int head_dim, float* s, int64_t ld_s, AttnPrefetch next) {
  const int steps = (head_dim + 3) / 4;
  const int n_groups = (n_q + 3) / 4;
  int passes = 0;
  for (int g = 0; g < n_groups; g += groups_in_pass(n_groups - g)) ++passes;
  AttnPrefetchCursor pf(next, passes * ((n_rows + 7) / 8));
  for (int64_t j = 0; j < n_rows; j += kScoreTileRows) {
    const int64_t n = n_rows - j < kScoreTileRows ? n_rows - j : kScoreTileRows;
    int g = 0;
    while (g < n_groups) {
      const int take = groups_in_pass(n_groups - g);
      int rows[3];
      for (int u = 0; u < 3; ++u) {
        const int rem = n_q - 4 * (g + u);
        rows[u] = rem < 0 ? 0 : rem < 4 ? rem : 4;
      }
      const float* pg = packed + static_cast<int64_t>(g) * steps * 16;
      const float* kj = k + j * k_stride;
      float* sg = s + 4 * g * ld_s + j;
      if (take == 3) {
        scores_groups<3>(pg, steps, kj, k_stride, n, head_dim, rows, sg, ld_s, pf);
      } else if (take == 2) {
        scores_groups<2>(pg, steps, kj, k_stride, n, head_dim, rows, sg, ld_s, pf);
      } else {
        scores_groups<1>(pg, steps, kj, k_stride, n, head_dim, rows, sg, ld_s, pf);
      }
      g += take;
    }
  }
  pf.rest();
}

// --- attention scores from f16 K tiles -----------------------------------------------------
// K in tiles of 16 slots (backend/k_tiles.h): one load and one conversion give dim d of 16 slots.
// Lanes hold the slots; for row r and dim d = 4m + p, phase accumulator p of a slot vector takes
// fma(q[r][d], k[slot][d], acc_p) in order m = 0, 1, .., and the score is
// (acc_0 + acc_1) + (acc_2 + acc_3): per score exactly the sequence of scores_block (lane (r, p)
// over m, then reduce4), so these scores equal attn_scores' on the same values bit for bit.
// Every query row uses each converted K vector, no lane is idle when a KV head has fewer than 4
// query rows (decode: 3), and no horizontal sums run.

// The 16 halves at p as floats (the load folds into vcvtph2ps).
inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Dim d of the 16 slots of the K tile at `tile` ([head_dim, 16] halves), as floats.
inline __m512 k16_dim(const uint16_t* tile, int d) { return load_f16(tile + d * kKTileSlots); }

// The 16 int8 codes at p as floats (exact; the q8_0 cache).
inline __m512 load_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Dim d of the 16 slots of a q8_0 K tile ([head_dim, 16] codes), as floats. The kernels below
// take either tile type (KT = uint16_t: halves, int8_t: codes); the arithmetic is the same.
inline __m512 k16_dim(const int8_t* tile, int d) {
  return load_i8(tile + d * kKTileSlots);
}

// Rows r0 .. r0 + R - 1 (R <= 3) of the packed q against V (1..2) tiles of K, scores into s
// (row r at s + r * ld_s, slot 16 v + lane at column 16 v + lane); `slots`: the valid columns
// (the rest of the tiles is computed and not stored). Tile v at kt + v * tile_stride; dim d of a
// tile is its 16 halves at d * 16. pf (may be null) steps once per 4 dims.
template <int R, int V, class KT>
void scores_k16_block(const float* packed, int r0, int steps, const KT* kt, int64_t tile_stride,
                      int head_dim, float* s, int64_t ld_s, int64_t slots, AttnPrefetchCursor* pf) {
  const float* qr[R];  // row r's phase-0 element of step 0; step m, phase p at qr[r][16 m + p]
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) {
    qr[r] = packed + static_cast<int64_t>((r0 + r) / 4) * steps * 16 + ((r0 + r) % 4) * 4;
  }
  __m512 acc[R][V][4];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) acc[r][v][p] = _mm512_setzero_ps();
    }
  }
  auto dim = [&](int m, int p) {
    const int d = 4 * m + p;
    __m512 kv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) kv[v] = k16_dim(kt + v * tile_stride, d);
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) {
      const __m512 q = _mm512_set1_ps(qr[r][16 * m + p]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v][p] = _mm512_fmadd_ps(q, kv[v], acc[r][v][p]);
    }
  };
  const int full = head_dim / 4;
  for (int m = 0; m < full; ++m) {
    if (pf != nullptr) pf->step();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) dim(m, p);
  }
  // head_dim % 4 dims left (constant phases: acc stays in registers).
  const int rem = head_dim - 4 * full;
  if (rem > 0) dim(full, 0);
  if (rem > 1) dim(full, 1);
  if (rem > 2) dim(full, 2);
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      const int64_t left = slots - 16 * v;
      if (left <= 0) break;
      const __m512 score = _mm512_add_ps(_mm512_add_ps(acc[r][v][0], acc[r][v][1]),
                                         _mm512_add_ps(acc[r][v][2], acc[r][v][3]));
      _mm512_mask_storeu_ps(s + r * ld_s + 16 * v, tail_mask(left < kLanes ? left : kLanes), score);
    }
  }
}

// All n_q rows, by passes of up to 3, against the V tiles from kt; the first pass steps pf.
template <int V, class KT>
void scores_k16_rows(const float* packed, int n_q, int steps, const KT* kt, int64_t tile_stride,
                     int head_dim, float* s, int64_t ld_s, int64_t slots, AttnPrefetchCursor& pf) {
  AttnPrefetchCursor* step = &pf;
  int r = 0;
  for (; r + 3 <= n_q; r += 3, step = nullptr) {
    scores_k16_block<3, V, KT>(packed, r, steps, kt, tile_stride, head_dim, s + r * ld_s, ld_s,
                               slots, step);
  }
  if (n_q - r == 2) {
    scores_k16_block<2, V, KT>(packed, r, steps, kt, tile_stride, head_dim, s + r * ld_s, ld_s,
                               slots, step);
  } else if (n_q - r == 1) {
    scores_k16_block<1, V, KT>(packed, r, steps, kt, tile_stride, head_dim, s + r * ld_s, ld_s,
                               slots, step);
  }
}

// Many query rows per KV head (verification and prefill: 3 per token): rows r0 .. r0 + R - 1
// against V tiles (R x V <= 24), one phase at a time. Phase p's accumulator of (row, tile) takes
// fma(q[r][d], k[slot][d], acc) for d = 4m + p in order m = 0, 1, .. - the FMA chain of lane
// (r, p) in scores_block - and the phases combine as (acc_0 + acc_1) + (acc_2 + acc_3), as
// reduce4 does: bitwise attn_scores' scores. Only R x V accumulators are live (the finished
// phases wait in `part`), so up to 12 rows share every converted K vector and each q broadcast
// feeds V FMAs; no float K rows are formed (the 16 x 16 transposes of k16_tiles_to_rows were
// ~12% of an 8-token attention's samples). A 3-row pass keeps all four phases in registers
// instead (scores_k16_block: 4-8% faster for decode than this kernel).
// pf (may be null) steps once per 4 dims of phase 0.
template <int R, int V, class KT>
void scores_k16_phased(const float* packed, int r0, int steps, const KT* kt, int64_t tile_stride,
                       int head_dim, float* s, int64_t ld_s, int64_t slots,
                       AttnPrefetchCursor* pf) {
  // r0 is a multiple of 4: row r's step m, phase p at grp[r / 4][16 m + (r % 4) * 4 + p].
  constexpr int kGroups = (R + 3) / 4;
  const float* grp[kGroups];
#pragma GCC unroll 3
  for (int g = 0; g < kGroups; ++g) grp[g] = packed + static_cast<int64_t>(r0 / 4 + g) * steps * 16;
  alignas(64) float part[2][R][V][kLanes];  // acc_0 + acc_1, then acc_2
  const int full = head_dim / 4;
  const int rem = head_dim - 4 * full;
  for (int p = 0; p < 4; ++p) {
    __m512 acc[R][V];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    const int n_m = full + (p < rem ? 1 : 0);
    for (int m = 0; m < n_m; ++m) {
      if (p == 0 && pf != nullptr) pf->step();
      const int d = 4 * m + p;
      __m512 kv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) kv[v] = k16_dim(kt + v * tile_stride, d);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const __m512 q = _mm512_set1_ps(grp[r / 4][16 * m + (r % 4) * 4 + p]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(q, kv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        float* p01 = part[0][r][v];
        float* p2 = part[1][r][v];
        if (p == 0) {
          _mm512_store_ps(p01, acc[r][v]);
        } else if (p == 1) {
          _mm512_store_ps(p01, _mm512_add_ps(_mm512_load_ps(p01), acc[r][v]));
        } else if (p == 2) {
          _mm512_store_ps(p2, acc[r][v]);
        } else {
          const int64_t left = slots - 16 * v;
          if (left <= 0) continue;
          const __m512 score =
              _mm512_add_ps(_mm512_load_ps(p01), _mm512_add_ps(_mm512_load_ps(p2), acc[r][v]));
          _mm512_mask_storeu_ps(s + r * ld_s + 16 * v, tail_mask(left < kLanes ? left : kLanes),
                                score);
        }
      }
    }
  }
}

// Rows per pass of the phased kernel by tiles per pass: each q broadcast feeds V FMAs and each
// converted K vector P of them (R x V <= 24 accumulators). 4 tiles (a whole chunk) for up to 6
// rows (two tokens of a 3-head group), else 2 tiles for up to 12 rows.
template <int V>
inline constexpr int kPhasedRows = V == 4 ? 6 : 12;

// All n_q rows (4 or more; at most kPhasedRows<V> for V = 4) against the V tiles from kt, by
// passes of at most kPhasedRows<V> rows, each starting at a row group of the packed q (a multiple
// of 4 rows); the first pass steps pf.
template <int V, class KT>
void scores_k16_many(const float* packed, int n_q, int steps, const KT* kt, int64_t tile_stride,
                     int head_dim, float* s, int64_t ld_s, int64_t slots, AttnPrefetchCursor& pf) {
  constexpr int P = kPhasedRows<V>;
  static constexpr auto kByRows =
      kernel_table<P>([]<int R>() { return &scores_k16_phased<R, V, KT>; });
  const int groups = (n_q + 3) / 4;
  const int passes = (n_q + P - 1) / P;
  AttnPrefetchCursor* step = &pf;
  for (int k = 0, r = 0; k < passes; ++k, step = nullptr) {
    const int r_end = std::min(n_q, 4 * (groups * (k + 1) / passes));
    kByRows[r_end - r - 1](packed, r, steps, kt, tile_stride, head_dim, s + r * ld_s, ld_s, slots,
                           step);
    r = r_end;
  }
}

// Tiles [t, tiles) by groups of V while whole groups last (t advances past them), with the
// phased kernel (4+ rows) or the 3-row one.
template <int V, bool kPhased, class KT>
void scores_k16_tile_groups(const float* packed, int n_q, int steps, const KT* kt,
                            int64_t tile_stride, int head_dim, float* s, int64_t ld_s,
                            int64_t n_slots, int64_t tiles, int64_t& t, AttnPrefetchCursor& pf) {
  for (; t + V <= tiles; t += V) {
    const KT* first = kt + t * tile_stride;  // the group's first tile
    float* st = s + t * kKTileSlots;
    const int64_t slots = n_slots - t * kKTileSlots;
    if constexpr (kPhased) {
      scores_k16_many<V, KT>(packed, n_q, steps, first, tile_stride, head_dim, st, ld_s, slots, pf);
    } else {
      scores_k16_rows<V, KT>(packed, n_q, steps, first, tile_stride, head_dim, st, ld_s, slots, pf);
    }
  }
}

template <class KT>
void scores_tiles(const float* packed, int n_q, const KT* kt, int64_t tile_stride, int64_t n_slots,
                  int head_dim, float* s, int64_t ld_s, AttnPrefetch next) {
  const int steps = (head_dim + 3) / 4;
  const int64_t tiles = (n_slots + kKTileSlots - 1) / kKTileSlots;
  int64_t t = 0;
  if (n_q > 3) {
    // Many rows (verification, prefill): the phased kernel; pf steps once per 4 dims of phase 0
    // of each tile group's first pass.
    const int64_t wide = n_q <= kPhasedRows<4> ? tiles / 4 : 0;  // groups of 4 tiles
    const int64_t groups = wide + (tiles - 4 * wide + 1) / 2;
    AttnPrefetchCursor pf(next, groups * ((head_dim + 3) / 4));
    if (wide > 0) {
      scores_k16_tile_groups<4, true, KT>(packed, n_q, steps, kt, tile_stride, head_dim, s, ld_s,
                                          n_slots, tiles, t, pf);
    }
    scores_k16_tile_groups<2, true, KT>(packed, n_q, steps, kt, tile_stride, head_dim, s, ld_s,
                                        n_slots, tiles, t, pf);
    scores_k16_tile_groups<1, true, KT>(packed, n_q, steps, kt, tile_stride, head_dim, s, ld_s,
                                        n_slots, tiles, t, pf);
    pf.rest();
    return;
  }
  // Decode (1-3 rows): pf steps once per 4 full dims of each pair of tiles.
  AttnPrefetchCursor pf(next, (tiles + 1) / 2 * (head_dim / 4));
  scores_k16_tile_groups<2, false, KT>(packed, n_q, steps, kt, tile_stride, head_dim, s, ld_s,
                                       n_slots, tiles, t, pf);
  scores_k16_tile_groups<1, false, KT>(packed, n_q, steps, kt, tile_stride, head_dim, s, ld_s,
                                       n_slots, tiles, t, pf);
  pf.rest();
}

void attn_scores_k16_avx512(const float* packed, int n_q, const uint16_t* kt, int64_t tile_stride,
                            int64_t n_slots, int head_dim, float* s, int64_t ld_s,
                            AttnPrefetch next) {
  scores_tiles(packed, n_q, kt, tile_stride, n_slots, head_dim, s, ld_s, next);
}

void attn_scores_k8_avx512(const float* packed, int n_q, const int8_t* kt, int64_t tile_stride,
                           int64_t n_slots, int head_dim, float* s, int64_t ld_s,
                           AttnPrefetch next) {
  scores_tiles(packed, n_q, kt, tile_stride, n_slots, head_dim, s, ld_s, next);
}

// --- attention chunk softmax and merge ------------------------------------------------------
// A row of kAttnChunk = 64 columns is four 16-lane vectors; l = reduce_add((e0 + e1) + (e2 + e3)).
// Rows go by fours: their max and sum reductions share the shuffles.
static_assert(kAttnChunk == 4 * kLanes, "the chunk softmax assumes 64-column chunks");

// Tree reduction of four rows' vectors at once, each row in the order of _mm512_reduce_*_ps:
// lanes (i, i + 8), then (i, i + 4), (i, i + 2), (i, i + 1). Returns row k's result in all four
// lanes of 128-bit lane k. A row's result does not depend on the other three.
template <class Op>
inline __m512 reduce_rows4(__m512 a, __m512 b, __m512 c, __m512 d, Op op) {
  const __m512 ab = op(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = op(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 t4 = op(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 t2 = op(t4, _mm512_permute_ps(t4, _MM_SHUFFLE(1, 0, 3, 2)));
  return op(t2, _mm512_permute_ps(t2, _MM_SHUFFLE(2, 3, 0, 1)));
}

// Rows r0 .. r0 + n - 1 (n = 1..4) of the chunk softmax; missing rows are all -inf and discarded.
inline void chunk_softmax_rows4(float* s, int64_t ld_s, int r0, int n, const int32_t* n_valid,
                                float* m, float* l) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __mmask16 valid[4][4];
  __m512 x[4][4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const int nv = k < n ? n_valid[r0 + k] : 0;
    const float* row = s + (r0 + k) * ld_s;  // [64]
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const int rem = nv - c * kLanes;
      valid[k][c] = rem >= kLanes ? static_cast<__mmask16>(0xffff) : rem <= 0 ? 0 : tail_mask(rem);
      x[k][c] = _mm512_mask_loadu_ps(neg_inf, valid[k][c], row + c * kLanes);
    }
  }
  auto max_op = [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); };
  auto add_op = [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); };
  __m512 mx[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    mx[k] = _mm512_max_ps(_mm512_max_ps(x[k][0], x[k][1]), _mm512_max_ps(x[k][2], x[k][3]));
  }
  const __m512 maxes = reduce_rows4(mx[0], mx[1], mx[2], mx[3], max_op);
  // max_k[k]: row k's max in all lanes.
  const __m512 max_k[4] = {
      _mm512_shuffle_f32x4(maxes, maxes, 0x00), _mm512_shuffle_f32x4(maxes, maxes, 0x55),
      _mm512_shuffle_f32x4(maxes, maxes, 0xaa), _mm512_shuffle_f32x4(maxes, maxes, 0xff)};
  __m512 sum[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    float* row = s + (r0 + k) * ld_s;  // [64]
    __m512 e[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      e[c] = exp2_nonpositive_maskz(valid[k][c], _mm512_sub_ps(x[k][c], max_k[k]));
      if (k < n) _mm512_storeu_ps(row + c * kLanes, e[c]);
    }
    sum[k] = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
  }
  const __m512 sums = reduce_rows4(sum[0], sum[1], sum[2], sum[3], add_op);
  const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __mmask16 rows = tail_mask(n);
  _mm512_mask_storeu_ps(m + r0, rows, _mm512_permutexvar_ps(pick, maxes));
  _mm512_mask_storeu_ps(l + r0, rows, _mm512_permutexvar_ps(pick, sums));
}

void attn_chunk_softmax_avx512(float* s, int64_t ld_s, int n_q, const int32_t* n_valid, float* m,
                               float* l) {
  for (int r = 0; r < n_q; r += 4) {
    chunk_softmax_rows4(s, ld_s, r, n_q - r < 4 ? n_q - r : 4, n_valid, m, l);
  }
}

// 16 rows' weights per exp2_nonpositive.
void attn_merge_weights_avx512(const float* m, const float* l, int n_q, float* big_m, float* big_l,
                               float* wo, float* wn) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  for (int r0 = 0; r0 < n_q; r0 += kLanes) {
    const int n = n_q - r0 < kLanes ? n_q - r0 : kLanes;
    const __mmask16 lanes = tail_mask(n);
    // m and l were just stored one float at a time (attn_chunk_softmax): gathered with scalar
    // loads, which store-to-load forwarding serves, unlike a vector load spanning those stores.
    __m512 mv = neg_inf, lv = _mm512_setzero_ps();
    for (int u = 0; u < n; ++u) {
      const __mmask16 lane = static_cast<__mmask16>(1u << u);
      mv = _mm512_mask_broadcastss_ps(mv, lane, _mm_load_ss(m + r0 + u));
      lv = _mm512_mask_broadcastss_ps(lv, lane, _mm_load_ss(l + r0 + u));
    }
    const __mmask16 live = _mm512_mask_cmp_ps_mask(lanes, mv, neg_inf, _CMP_NEQ_OQ);
    const __m512 old_max = _mm512_mask_loadu_ps(neg_inf, live, big_m + r0);
    const __m512 new_max = _mm512_max_ps(old_max, mv);
    // -inf - M' (the first chunk) gives w_old = 2^-125, which multiplies the zero state.
    const __m512 w_old = exp2_nonpositive(_mm512_sub_ps(old_max, new_max));
    const __m512 w_new = exp2_nonpositive(_mm512_sub_ps(mv, new_max));
    const __m512 big_lv = _mm512_maskz_loadu_ps(live, big_l + r0);
    _mm512_mask_storeu_ps(big_l + r0, live,
                          _mm512_fmadd_ps(big_lv, w_old, _mm512_mul_ps(lv, w_new)));
    _mm512_mask_storeu_ps(big_m + r0, live, new_max);
    _mm512_mask_storeu_ps(wo + r0, lanes, _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), w_old));
    _mm512_mask_storeu_ps(wn + r0, lanes, _mm512_maskz_mov_ps(live, w_new));
  }
}

// big_a = fmadd(big_a, wo, a·wn) per element, as the end of accumulate_pass<R, true>.
void attn_merge_rows_avx512(const float* a, int n_q, int head_dim, const float* wo, const float* wn,
                            float* big_a) {
  for (int r = 0; r < n_q; ++r) {
    const float* a_r = a + static_cast<int64_t>(r) * head_dim;    // [head_dim]
    float* big_a_r = big_a + static_cast<int64_t>(r) * head_dim;  // [head_dim]
    const __m512 wo16 = _mm512_set1_ps(wo[r]);
    const __m512 wn16 = _mm512_set1_ps(wn[r]);
    for (int d = 0; d < head_dim; d += kLanes) {
      const __mmask16 t = tail_mask(head_dim - d < kLanes ? head_dim - d : kLanes);
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, a_r + d), wn16);
      _mm512_mask_storeu_ps(big_a_r + d, t,
                            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(t, big_a_r + d), wo16, x));
    }
  }
}

// --- attention accumulation ---------------------------------------------------------------
// out[r, 0:64] += Σ_j p[r, j] · v[j, 0:64] for R (1..6) rows: four 16-lane chunks (lanes m[0..3];
// a masked-off chunk costs nothing extra) per row, so a pass reads each V row's 256 bytes once
// for all R rows. Every output lane takes one FMA per j, in order. kMerge: the sums start from
// zero and end as out = fmadd(out, wo[r], sum·wn[r]) (attn_merge_rows' arithmetic).
// 16 values of a V row: floats, or halves converted exactly as they are loaded (the f16 cache).
inline __m512 load_v(__mmask16 m, const float* v) {
  return _mm512_maskz_loadu_ps(m, v);
}
inline __m512 load_v(__mmask16 m, const uint16_t* v) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, v));
}
// Unmasked, for passes whose four chunks are whole (kFull). The masked f16 load is a separate
// instruction whose result vcvtph2ps then converts; unmasked, the load folds into vcvtph2ps
// (8-token forward pass at 512 cached 0.988-0.989x, paired A/B).
inline __m512 load_v(const float* v) { return _mm512_loadu_ps(v); }
inline __m512 load_v(const uint16_t* v) { return load_f16(v); }
// 16 codes of a q8_0 V row, converted exactly.
inline __m512 load_v(__mmask16 m, const int8_t* v) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, v)));
}
inline __m512 load_v(const int8_t* v) {
  return load_i8(v);
}

// The cursor is stepped through a local copy, which stays in registers across the loop (stepped
// through the reference, its position went to memory every V row: attention op 1.5-2% slower at
// 8 new tokens, 512 cached, paired A/B). kFull: m[0..3] are all ones (64 dims left).
template <int R, bool kMerge, class V, bool kFull>
void accumulate_pass(const float* p, int64_t ld_p, const V* v, int64_t v_stride, int64_t n_rows,
                     int head_dim, const __mmask16 m[4], const float* wo, const float* wn,
                     float* out, AttnPrefetchCursor& cursor) {
  AttnPrefetchCursor pf = cursor;
  __m512 acc[R][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      acc[r][c] = kMerge ? _mm512_setzero_ps()
                         : _mm512_maskz_loadu_ps(m[c], out + r * head_dim + c * kLanes);
    }
  }
  for (int64_t j = 0; j < n_rows; ++j) {
    pf.step();
    const V* vj = v + j * v_stride;  // [64] of this pass
    __m512 vv[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      vv[c] = kFull ? load_v(vj + c * kLanes) : load_v(m[c], vj + c * kLanes);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ld_p + j]);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* out_r = out + r * head_dim;
    if constexpr (kMerge) {
      const __m512 wo16 = _mm512_set1_ps(wo[r]);
      const __m512 wn16 = _mm512_set1_ps(wn[r]);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512 x = _mm512_mul_ps(acc[r][c], wn16);
        _mm512_mask_storeu_ps(
            out_r + c * kLanes, m[c],
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[c], out_r + c * kLanes), wo16, x));
      }
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(out_r + c * kLanes, m[c], acc[r][c]);
    }
  }
  cursor = pf;
}

// Rows r0 .. r0 + R - 1 of the call: one pass per 64 dims.
template <int R, bool kMerge, class V>
void accumulate_rows(const float* p, int64_t ld_p, const V* v, int64_t v_stride, int64_t n_rows,
                     int head_dim, const float* wo, const float* wn, float* out,
                     AttnPrefetchCursor& pf) {
  for (int d = 0; d < head_dim; d += 4 * kLanes) {
    __mmask16 m[4];
    for (int c = 0; c < 4; ++c) {
      const int rem = head_dim - d - c * kLanes;
      m[c] = tail_mask(rem <= 0 ? 0 : rem < kLanes ? rem : kLanes);
    }
    if (head_dim - d >= 4 * kLanes) {
      accumulate_pass<R, kMerge, V, true>(p, ld_p, v + d, v_stride, n_rows, head_dim, m, wo, wn,
                                          out + d, pf);
    } else {
      accumulate_pass<R, kMerge, V, false>(p, ld_p, v + d, v_stride, n_rows, head_dim, m, wo, wn,
                                           out + d, pf);
    }
  }
}

// Each V row step of each pass is a step of the prefetch cursor.
template <bool kMerge, class V>
void accumulate_all(const float* p, int64_t ld_p, int n_q, const V* v, int64_t v_stride,
                    int64_t n_rows, int head_dim, const float* wo, const float* wn, float* out,
                    AttnPrefetch next) {
  const int passes = (n_q + 5) / 6 * ((head_dim + 4 * kLanes - 1) / (4 * kLanes));
  AttnPrefetchCursor pf(next, passes * n_rows);
  int r = 0;
  auto w = [&r](const float* x) { return kMerge ? x + r : x; };  // row r's weights
  for (; r + 6 <= n_q; r += 6) {
    accumulate_rows<6, kMerge, V>(p + r * ld_p, ld_p, v, v_stride, n_rows, head_dim, w(wo), w(wn),
                                  out + r * head_dim, pf);
  }
  const float* pr = p + r * ld_p;
  float* out_r = out + r * head_dim;
  switch (n_q - r) {
    case 5:
      accumulate_rows<5, kMerge, V>(pr, ld_p, v, v_stride, n_rows, head_dim, w(wo), w(wn), out_r,
                                    pf);
      break;
    case 4:
      accumulate_rows<4, kMerge, V>(pr, ld_p, v, v_stride, n_rows, head_dim, w(wo), w(wn), out_r,
                                    pf);
      break;
    case 3:
      accumulate_rows<3, kMerge, V>(pr, ld_p, v, v_stride, n_rows, head_dim, w(wo), w(wn), out_r,
                                    pf);
      break;
    case 2:
      accumulate_rows<2, kMerge, V>(pr, ld_p, v, v_stride, n_rows, head_dim, w(wo), w(wn), out_r,
                                    pf);
      break;
    case 1:
      accumulate_rows<1, kMerge, V>(pr, ld_p, v, v_stride, n_rows, head_dim, w(wo), w(wn), out_r,
                                    pf);
      break;
    default:
      break;
  }
  pf.rest();
}

// The table's Σ p·v entries for V rows of floats, halves or codes (one instantiation each).
template <class V>
void attn_accumulate_avx512(const float* p, int64_t ld_p, int n_q, const V* v, int64_t v_stride,
                            int64_t n_rows, int head_dim, float* out, AttnPrefetch next) {
  accumulate_all<false>(p, ld_p, n_q, v, v_stride, n_rows, head_dim, nullptr, nullptr, out, next);
}

template <class V>
void attn_accumulate_merge_avx512(const float* p, int64_t ld_p, int n_q, const V* v,
                                  int64_t v_stride, int64_t n_rows, int head_dim, const float* wo,
                                  const float* wn, float* big_a, AttnPrefetch next) {
  accumulate_all<true>(p, ld_p, n_q, v, v_stride, n_rows, head_dim, wo, wn, big_a, next);
}

// dst[r * cols + c] = float(src[r * src_stride + c]) for halves (f16 cache) or codes (q8_0),
// exactly; tails with lane masks.
template <class T>
void rows_to_f32_avx512(const T* src, int64_t src_stride, int64_t n_rows, int cols, float* dst) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const T* s = src + r * src_stride;  // [cols]
    float* d = dst + r * cols;          // [cols]
    for (int c = 0; c < cols; c += kLanes) {
      const __mmask16 t = tail_mask(cols - c < kLanes ? cols - c : kLanes);
      _mm512_mask_storeu_ps(d + c, t, load_v(t, s + c));
    }
  }
}

void scale_columns_avx512(const float* x, int64_t ld_x, int n_rows, const float* d, int64_t n,
                          float* out, int64_t ld_out) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ld_x;
    float* o = out + r * ld_out;
    for (int64_t j = 0; j < n; j += kLanes) {
      const __mmask16 t = tail_mask(n - j < kLanes ? n - j : kLanes);
      _mm512_mask_storeu_ps(
          o + j, t,
          _mm512_mul_ps(_mm512_maskz_loadu_ps(t, xr + j), _mm512_maskz_loadu_ps(t, d + j)));
    }
  }
}

// 16 floats per conversion; tails with lane masks.
void f32_to_f16_avx512(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 t = tail_mask(n - i < kLanes ? n - i : kLanes);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(t, x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_mask_storeu_epi16(y + i, t, h);
  }
}

// Slots [0, n_slots) of K tiles (kt at a tile's first slot, tiles tile_stride halves apart) as
// float rows dst [n_slots, head_dim]: per 16 dims of a tile, 16 conversions and one 16 x 16
// transpose.
void k16_tiles_to_rows_avx512(const uint16_t* kt, int64_t tile_stride, int64_t n_slots,
                              int head_dim, float* dst) {
  for (int64_t t = 0; t * kKTileSlots < n_slots; ++t) {
    const uint16_t* tile = kt + t * tile_stride;  // [head_dim, 16]
    const int64_t slots =
        n_slots - t * kKTileSlots < kKTileSlots ? n_slots - t * kKTileSlots : kKTileSlots;
    float* rows = dst + t * kKTileSlots * head_dim;  // [slots, head_dim]
    for (int d0 = 0; d0 < head_dim; d0 += kLanes) {
      const int dims = head_dim - d0 < kLanes ? head_dim - d0 : kLanes;
      __m512 x[16];
      for (int i = 0; i < 16; ++i) {
        x[i] = i < dims ? k16_dim(tile, d0 + i) : _mm512_setzero_ps();
      }
      detail::avx512::transpose16(x);  // x[j]: slot j, dims d0 ..
      const __mmask16 keep = tail_mask(dims);
      for (int64_t j = 0; j < slots; ++j) {
        _mm512_mask_storeu_ps(rows + j * head_dim + d0, keep, x[j]);
      }
    }
  }
}

// --- RoPE --------------------------------------------------------------------------------
// The products come from the masked-multiply builtins, which the compiler does not contract with
// the following add or subtract into an FMA: each value is the reference's two rounded products
// and one rounded sum (x0·s + x1·c and x1·c + x0·s are the same IEEE sum).
inline __m512 mul_rounded(__m512 a, __m512 b) {
  return _mm512_maskz_mul_ps(0xffff, a, b);
}

void rope_apply_avx512(float* x, const float* cos_sin, int64_t n_tokens, int n_heads, int head_dim,
                       int rope_dim, RopeStyle style) {
  const int n_pairs = rope_dim / 2;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* xt = x + t * n_heads * head_dim;    // [n_heads, head_dim]
    const float* cs = cos_sin + t * rope_dim;  // [n_pairs, 2]
    for (int h = 0; h < n_heads; ++h) {
      float* xh = xt + static_cast<int64_t>(h) * head_dim;  // [head_dim]
      if (style == RopeStyle::kNorm) {
        // 8 pairs (x0, x1) per vector: even lanes x0·c - x1·s, odd lanes x1·c + x0·s.
        for (int i = 0; i < rope_dim; i += kLanes) {
          const __mmask16 m = tail_mask(rope_dim - i < kLanes ? rope_dim - i : kLanes);
          const __m512 v = _mm512_maskz_loadu_ps(m, xh + i);
          const __m512 c = _mm512_maskz_loadu_ps(m, cs + i);  // (cos, sin) per pair
          const __m512 t1 = mul_rounded(v, _mm512_moveldup_ps(c));
          const __m512 t2 = mul_rounded(_mm512_permute_ps(v, 0xb1), _mm512_movehdup_ps(c));
          const __m512 r = _mm512_mask_sub_ps(_mm512_add_ps(t1, t2), 0x5555, t1, t2);
          _mm512_mask_storeu_ps(xh + i, m, r);
        }
      } else {
        // 16 pairs (x[i], x[i + n_pairs]) per step; cos / sin de-interleaved from cs.
        for (int i = 0; i < n_pairs; i += kLanes) {
          const int pairs = n_pairs - i < kLanes ? n_pairs - i : kLanes;
          const __mmask16 m = tail_mask(pairs);
          const int first = 2 * pairs < kLanes ? 2 * pairs : kLanes;
          const __m512 lo = _mm512_maskz_loadu_ps(tail_mask(first), cs + 2 * i);
          const __m512 hi =
              _mm512_maskz_loadu_ps(tail_mask(2 * pairs - first), cs + 2 * i + kLanes);
          const __m512 cv = _mm512_permutex2var_ps(lo, even, hi);
          const __m512 sv = _mm512_permutex2var_ps(lo, odd, hi);
          const __m512 x0 = _mm512_maskz_loadu_ps(m, xh + i);
          const __m512 x1 = _mm512_maskz_loadu_ps(m, xh + n_pairs + i);
          _mm512_mask_storeu_ps(xh + i, m, _mm512_sub_ps(mul_rounded(x0, cv), mul_rounded(x1, sv)));
          _mm512_mask_storeu_ps(xh + n_pairs + i, m,
                                _mm512_add_ps(mul_rounded(x0, sv), mul_rounded(x1, cv)));
        }
      }
    }
  }
}

}  // namespace

const OpsKernels& ops_kernels_avx512() {
  // clang-format off
  static const OpsKernels kernels = {
      rmsnorm_avx512,             swiglu_avx512,
      row_max_avx512,             exp_shifted_sum_avx512,
      scale_avx512,               attn_pack_q_avx512,
      attn_scores_avx512,         attn_chunk_softmax_avx512,
      attn_accumulate_avx512<float>, attn_merge_weights_avx512,
      attn_merge_rows_avx512,     attn_accumulate_merge_avx512<float>,
      f32_to_f16_avx512,          rows_to_f32_avx512<uint16_t>,
      attn_scores_k16_avx512,     k16_tiles_to_rows_avx512,
      attn_accumulate_avx512<uint16_t>, attn_accumulate_merge_avx512<uint16_t>,
      rope_apply_avx512,
      rows_to_f32_avx512<int8_t>, attn_scores_k8_avx512,
      attn_accumulate_avx512<int8_t>, attn_accumulate_merge_avx512<int8_t>,
      // q8_0 K tiles are scored directly (attn_scores_k8); run pieces gather their codes.
      scale_columns_avx512,       nullptr,
  };
  // clang-format on
  return kernels;
}

}  // namespace specdec
