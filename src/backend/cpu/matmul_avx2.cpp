// Temporary: forwards to the scalar reference until the avx2 kernels land (minutes).
#include "backend/cpu/quant_kernels.h"

namespace specdec {
namespace detail {

void matmul_avx2(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  matmul_ref(w, x, n, y, pool);
}

void quantize_activations_avx2(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  quantize_activations_ref(x, cols, q, d, s16);
}

}  // namespace detail
}  // namespace specdec
