// The f32 matrix product that drafter training runs on (the three products of a linear layer),
// with a scalar reference and AVX2 / AVX-512 variants chosen at run time (active_isa(),
// SPECDEC_ISA), shared over a ThreadPool.
//
// Every output element is ONE fma chain over the reduction index in order:
//   acc = accumulate ? C(i, j) : 0;  for p = 0 .. k-1: acc = fma(A(i, p), B(p, j), acc)
// whatever the variant, the thread count or how the work is cut into tiles, so the result is
// bitwise the reference's (std::fma in that order) and training replays exactly with 1 or 2
// threads. Threads split the output, never the reduction.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace specdec {

class ThreadPool;

// A strided view of a float matrix: element (r, c) is data[r * rs + c * cs]. The variants are
// fastest when one of the strides is 1 (a row-major matrix or its transpose).
struct MatView {
  const float* data = nullptr;
  int64_t rs = 0;  // step between rows
  int64_t cs = 1;  // step between columns
};

// C[m, n] = (accumulate ? C : 0) + A[m, k] · B[k, n]; c is row-major with leading dimension
// ldc (>= n). m, n or k == 0 are allowed (k == 0: C stays or becomes 0). pool may be null.
void train_gemm(int64_t m, int64_t n, int64_t k, MatView a, MatView b, float* c, int64_t ldc,
                bool accumulate, ThreadPool* pool);
// The same with an explicit variant (tests compare each with kScalar, the reference).
void train_gemm_isa(Isa isa, int64_t m, int64_t n, int64_t k, MatView a, MatView b, float* c,
                    int64_t ldc, bool accumulate, ThreadPool* pool);

// The three products of a linear layer y = x · Wᵀ, W: [n_out, n_in] row-major with leading
// dimension ldw (a column slice W[:, c0 .. c0 + n_in) is w + c0 with ldw = full width).

// y[rows, n_out] (+)= x[rows, n_in] · Wᵀ           (ldx, ldy: leading dimensions)
inline void linear_forward(int64_t rows, int64_t n_in, int64_t n_out, const float* x, int64_t ldx,
                           const float* w, int64_t ldw, float* y, int64_t ldy, bool accumulate,
                           ThreadPool* pool) {
  train_gemm(rows, n_out, n_in, {x, ldx, 1}, {w, 1, ldw}, y, ldy, accumulate, pool);
}

// dx[rows, n_in] (+)= dy[rows, n_out] · W
inline void linear_backward_input(int64_t rows, int64_t n_in, int64_t n_out, const float* dy,
                                  int64_t lddy, const float* w, int64_t ldw, float* dx,
                                  int64_t lddx, bool accumulate, ThreadPool* pool) {
  train_gemm(rows, n_in, n_out, {dy, lddy, 1}, {w, ldw, 1}, dx, lddx, accumulate, pool);
}

// dw[n_out, n_in] (+)= dy[rows, n_out]ᵀ · x[rows, n_in]   (sums over the rows in order)
inline void linear_backward_weight(int64_t rows, int64_t n_in, int64_t n_out, const float* dy,
                                   int64_t lddy, const float* x, int64_t ldx, float* dw,
                                   int64_t lddw, bool accumulate, ThreadPool* pool) {
  train_gemm(n_out, n_in, rows, {dy, 1, lddy}, {x, ldx, 1}, dw, lddw, accumulate, pool);
}

namespace detail {
// C[i0:i1, j0:j1] of train_gemm (all of k) on the calling thread; per-ISA translation units.
void train_gemm_tile_avx512(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, MatView a,
                            MatView b, float* c, int64_t ldc, bool accumulate);
void train_gemm_tile_avx2(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, MatView a,
                          MatView b, float* c, int64_t ldc, bool accumulate);
}  // namespace detail

}  // namespace specdec
