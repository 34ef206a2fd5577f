// Weight and tensor element types as numbered by GGML / GGUF, with their block layout.
// A "block" is the unit a quantized row is stored in: `block_size` elements packed in
// `block_bytes` bytes. Unquantized types have block_size 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace specdec {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  const char* name;      // "Q4_K"
  int64_t block_size;    // elements per block
  int64_t block_bytes;   // bytes per block
  bool weight_supported;  // specdec can multiply a weight matrix of this type
};

// Traits of a raw type id read from a file; nullptr when the id is not a known GGML type.
const GgmlTypeTraits* ggml_type_traits(uint32_t raw_type);
const GgmlTypeTraits& ggml_type_traits(GgmlType type);  // type must be known
std::string ggml_type_name(uint32_t raw_type);           // "Q4_K" or "unknown(123)"

// Bytes of one row of n elements; n must be a multiple of the block size.
inline int64_t ggml_row_bytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = ggml_type_traits(type);
  return n / t.block_size * t.block_bytes;
}

}  // namespace specdec
