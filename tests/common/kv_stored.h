// What a KV cache of each type gives back for rows written as floats: the rows themselves (f32),
// rounded to half (f16), or each head row quantized and dequantized (q8_0, backend/kv_quant.h).
// Shared by the KvCache and PagedKvStorage tests.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16
#include "backend/kv_quant.h"
#include "backend/kv_type.h"

namespace specdec::test {

// x: rows [n, n_kv_heads, head_dim] (any n_kv_heads), head_dim values per head row.
inline std::vector<float> stored_rows(KvType t, const std::vector<float>& x, int head_dim) {
  std::vector<float> out(x.size());
  std::vector<int8_t> codes(static_cast<size_t>(head_dim));
  for (size_t r = 0; r < x.size(); r += static_cast<size_t>(head_dim)) {
    const float d = t == KvType::kQ8 ? quantize_kv_row(&x[r], head_dim, codes.data()) : 0.0f;
    for (int i = 0; i < head_dim; ++i) {
      out[r + i] = t == KvType::kF16  ? fp16_to_fp32(fp32_to_fp16(x[r + i]))
                   : t == KvType::kQ8 ? dequantize_kv(codes[i], d)
                                      : x[r + i];
    }
  }
  return out;
}

}  // namespace specdec::test
