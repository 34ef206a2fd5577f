// Random quantized weight blocks for the matmul tests (CPU and CUDA): every code value occurs,
// with sane f16 scales (random scale bytes would make inf / NaN).
#pragma once

#include <cstdint>
#include <random>

#include "backend/ggml_type.h"

namespace specdec::test {

// Stores v as an IEEE half (round to nearest even) at p (2 bytes, any alignment).
void put_f16(uint8_t* p, float v);

// One block of `type` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) at out: random bytes,
// then scales in [0.002, 0.05) (K-quants smaller) and Q4_1/Q5_1 minimums in [-1, 1).
void random_block(GgmlType type, std::mt19937& rng, uint8_t* out);

}  // namespace specdec::test
