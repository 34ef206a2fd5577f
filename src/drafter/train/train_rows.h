// Row-parallel helpers of the drafter heads' training passes (redrafter_grad, medusa_grad):
// each element is computed by one fixed, thread-free computation, so how the pool splits the
// work changes no bit.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace specdec {

// body(begin, end) over [0, n) on the pool's threads (serially when small or no pool).
template <class F>
void for_rows(ThreadPool* pool, int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  if (!pool || pool->size() == 1 || n <= grain) {
    body(int64_t{0}, n);
    return;
  }
  pool->parallel_for(n, grain, body);
}

// sum[cols] = Σ_r m[r, cols] over r = 0 .. rows-1 in order (double accumulators), per column
// chunk on the pool.
inline void column_sums(const float* m, int64_t rows, int64_t cols, float* sum, ThreadPool* pool) {
  for_rows(pool, cols, 64, [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(static_cast<size_t>(c1 - c0), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = m + r * cols;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) sum[c] = static_cast<float>(acc[c - c0]);
  });
}

}  // namespace specdec
