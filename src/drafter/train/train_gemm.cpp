// train_gemm: the scalar reference, the per-ISA dispatch and the split over threads (see
// train_gemm.h for the arithmetic every variant follows).
#include "drafter/train/train_gemm.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {
namespace {

// The reference: one std::fma chain per element over p in order.
void gemm_tile_ref(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, const MatView& a,
                   const MatView& b, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = j0; j < j1; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      const float* ai = a.data + i * a.rs;
      const float* bj = b.data + j * b.cs;
      for (int64_t p = 0; p < k; ++p) acc = std::fma(ai[p * a.cs], bj[p * b.rs], acc);
      c[i * ldc + j] = acc;
    }
  }
}

void gemm_tile(Isa isa, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k,
               const MatView& a, const MatView& b, float* c, int64_t ldc, bool accumulate) {
  switch (isa) {
    case Isa::kAvx512:
      detail::train_gemm_tile_avx512(i0, i1, j0, j1, k, a, b, c, ldc, accumulate);
      return;
    case Isa::kAvx2:
    case Isa::kAvxVnni:
      detail::train_gemm_tile_avx2(i0, i1, j0, j1, k, a, b, c, ldc, accumulate);
      return;
    case Isa::kScalar:
      gemm_tile_ref(i0, i1, j0, j1, k, a, b, c, ldc, accumulate);
      return;
  }
}

// Work below this many multiply-adds runs on the calling thread alone (waking the pool costs
// more than it saves).
constexpr int64_t kMinParallelMacs = 1 << 16;
// Threads get contiguous ranges of rows or columns in multiples of this (a multiple of every
// variant's register tile: 8 x 48 and 6 x 16), so that tiles are cut the same way.
constexpr int64_t kSplitUnit = 48;

}  // namespace

void train_gemm_isa(Isa isa, int64_t m, int64_t n, int64_t k, MatView a, MatView b, float* c,
                    int64_t ldc, bool accumulate, ThreadPool* pool) {
  SPECDEC_CHECK(m >= 0 && n >= 0 && k >= 0 && ldc >= n, "train_gemm: bad shape");
  SPECDEC_CHECK(isa_supported(isa), "train_gemm: variant not supported on this CPU");
  if (m == 0 || n == 0) return;
  const int nt = pool ? pool->size() : 1;
  if (nt == 1 || m * n * std::max<int64_t>(k, 1) < kMinParallelMacs) {
    gemm_tile(isa, 0, m, 0, n, k, a, b, c, ldc, accumulate);
    return;
  }
  // Split the dimension with more units; the reduction is never split, so the thread count
  // changes no bit of the result.
  const int64_t units_m = (m + kSplitUnit - 1) / kSplitUnit;
  const int64_t units_n = (n + kSplitUnit - 1) / kSplitUnit;
  const bool split_rows = units_m >= units_n;
  const int64_t units = split_rows ? units_m : units_n;
  pool->run([&](int ti, int nthreads) {
    const int64_t u0 = units * ti / nthreads, u1 = units * (ti + 1) / nthreads;
    if (u0 >= u1) return;
    if (split_rows) {
      gemm_tile(isa, u0 * kSplitUnit, std::min(m, u1 * kSplitUnit), 0, n, k, a, b, c, ldc,
                accumulate);
    } else {
      gemm_tile(isa, 0, m, u0 * kSplitUnit, std::min(n, u1 * kSplitUnit), k, a, b, c, ldc,
                accumulate);
    }
  });
}

void train_gemm(int64_t m, int64_t n, int64_t k, MatView a, MatView b, float* c, int64_t ldc,
                bool accumulate, ThreadPool* pool) {
  train_gemm_isa(active_isa(), m, n, k, a, b, c, ldc, accumulate, pool);
}

}  // namespace specdec
