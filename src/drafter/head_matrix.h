// A drafter head's weight matrix ready for the CPU matmul: float rows converted once to a GGML
// type (Q8_0 by default: the int8 kernels the target uses; F16; F32) and packed where the
// machine's kernels take a packed layout.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/packed_weights.h"

namespace specdec {

// Rows of float weights to a GGML type: Q8_0 (per 32 values an f16 scale max|x|/127 and int8
// codes, as GGML's quantizer), Q4_1 (per 32 values an f16 scale (max-min)/15, an f16 min and
// 4-bit codes, GGML's layout), F16 or F32. rows: [n_rows, n_cols]; returns [n_rows, row bytes].
std::vector<uint8_t> quantize_rows(GgmlType type, const float* rows, int64_t n_rows, int64_t n_cols);

class HeadMatrix {
 public:
  HeadMatrix() = default;
  // rows: [n_rows, n_cols]. Q8_0 and Q4_1 need n_cols % 32 == 0 (callers fall back to F32).
  HeadMatrix(GgmlType type, const float* rows, int64_t n_rows, int64_t n_cols);
  HeadMatrix(HeadMatrix&&) = default;
  HeadMatrix& operator=(HeadMatrix&&) = default;

  const WeightMatrix& w() const { return w_; }
  int64_t bytes() const { return w_.rows * ggml_row_bytes(w_.type, w_.cols); }

 private:
  std::vector<uint8_t> bytes_;  // [rows, row_bytes]
  PackedWeights packed_;
  WeightMatrix w_;
};

// Q8_0 / Q4_1 when every width is a multiple of their block, else F32 (F16 / F32 pass through).
GgmlType head_weight_type(GgmlType wanted, std::initializer_list<int64_t> widths);

}  // namespace specdec
