// Checked lookups of a GGUF's weights by name, shared by the CPU and GPU models: each throws
// specdec::Error naming the file and the tensor when it is missing or mis-shaped.
#pragma once

#include <cstdint>
#include <string>

#include "model/gguf.h"

namespace specdec {

// The matrix `name` of shape [rows, cols] (GGUF ne = {cols, rows}), any type (the caller checks
// that its kernels take it).
const GgufTensor& require_matrix(const GgufFile& file, const std::string& name, int64_t rows,
                                 int64_t cols);
// The F32 vector `name` of n elements.
const GgufTensor& require_f32_vector(const GgufFile& file, const std::string& name, int64_t n);

}  // namespace specdec
