// Matrix multiplication with a weight matrix stored in any supported GGML type.
//   y[n, rows] = x[n, cols] · W[rows, cols]ᵀ
// W is row-major: row r is `cols` elements of `type` (ggml ne = {cols, rows}).
// Quantized weights are multiplied block by block (activations quantized to 8 bits where the
// type calls for it); the matrix is never expanded to floats as a whole.
// Each weight row is read once for all n rows of x, so a pass over 8 tokens costs little more
// than a pass over 1 (speculative verification depends on this).
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "backend/ggml_type.h"

namespace specdec {

class ThreadPool;

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;       // output features
  int64_t cols = 0;       // input features; a multiple of the type's block size
  int64_t row_bytes = 0;  // ggml_row_bytes(type, cols)
  // Optional copy of the same matrix in the row-interleaved layout of packed_weights.h, which
  // the AVX-512 kernels and the AVX2 kernels below 32 rows read instead of `data` (null: none).
  // `data` may be null when a matrix exists only packed (matrices stacked at load time, e.g.
  // Q/K/V); only the AVX-512 and AVX2 variants can run it.
  const uint8_t* packed = nullptr;
  int64_t packed_block_bytes = 0;  // bytes of one block of 16 rows in `packed`
};

// x: [n, cols] row-major float; y: [n, rows] row-major float. n == 0 is a no-op.
// pool may be null (single thread). Dispatches on active_isa().
void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool);

// The same with an explicit variant (tests compare each with kScalar, the reference).
void matmul_isa(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y,
                ThreadPool* pool);

// y = swiglu(gate, up) · Wᵀ for n rows whose gate and up halves lie side by side:
// gu: [n, 2 cols] (gate in columns [0, cols), up in [cols, 2 cols)), y: [n, rows]. Bitwise what
// swiglu() of each row into [n, cols] followed by matmul() gives. The AVX-512 kernels over packed
// weights (5 to 31 rows) form the products while they quantize the activations, on all threads
// and without a pass of their own; elsewhere swiglu runs into scratch ([n, cols]) first.
void matmul_swiglu(const WeightMatrix& w, const float* gu, int64_t n, float* y, float* scratch,
                   ThreadPool* pool);

// A hint for thread `ti` of `nt` of a pool, while it has nothing else to do: brings up to
// `max_bytes` of the weights it will read first in the next matmul(w, ...) over fewer than 32
// rows into its cache (prefetcht1). Only the AVX-512 and AVX2 kernels over packed weights, whose
// threads start on fixed stretches of the matrix (stealing_split.h), use it; elsewhere a no-op.
// Never changes a result.
void matmul_prefetch(const WeightMatrix& w, int ti, int nt, int64_t max_bytes);

// Row `row` of W as floats: out[cols]. Used for embedding lookup.
void dequantize_row(const WeightMatrix& w, int64_t row, float* out);

}  // namespace specdec
