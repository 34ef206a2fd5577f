#include "drafter/head_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/quant_blocks.h"
#include "util/check.h"

namespace specdec {

std::vector<uint8_t> quantize_rows(GgmlType type, const float* rows, int64_t n_rows, int64_t n_cols) {
  const int64_t rb = ggml_row_bytes(type, n_cols);
  std::vector<uint8_t> out(static_cast<size_t>(rb * n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* x = rows + r * n_cols;
    uint8_t* dst = out.data() + r * rb;
    if (type == GgmlType::kF32) {
      std::memcpy(dst, x, static_cast<size_t>(n_cols) * 4);
    } else if (type == GgmlType::kF16) {
      for (int64_t c = 0; c < n_cols; ++c) {
        const uint16_t h = fp32_to_fp16(x[c]);
        std::memcpy(dst + 2 * c, &h, 2);
      }
    } else if (type == GgmlType::kQ8_0) {
      SPECDEC_CHECK(n_cols % kQK == 0, "Q8_0 rows need a multiple of 32 columns");
      auto* blocks = reinterpret_cast<BlockQ8_0*>(dst);
      for (int64_t b = 0; b < n_cols / kQK; ++b) {
        const float* v = x + b * kQK;
        float amax = 0.0f;
        for (int64_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blocks[b].d = fp32_to_fp16(d);
        for (int64_t j = 0; j < kQK; ++j) {
          blocks[b].qs[j] = static_cast<int8_t>(std::lround(v[j] * id));
        }
      }
    } else if (type == GgmlType::kQ4_1) {
      SPECDEC_CHECK(n_cols % kQK == 0, "Q4_1 rows need a multiple of 32 columns");
      auto* blocks = reinterpret_cast<BlockQ4_1*>(dst);
      for (int64_t b = 0; b < n_cols / kQK; ++b) {
        const float* v = x + b * kQK;
        float lo = v[0], hi = v[0];
        for (int64_t j = 1; j < kQK; ++j) {
          lo = std::min(lo, v[j]);
          hi = std::max(hi, v[j]);
        }
        // The codes are chosen against the scale and min as stored (f16), so that a code
        // reconstructs its value as closely as the stored pair allows.
        blocks[b].d = fp32_to_fp16((hi - lo) / 15.0f);
        blocks[b].m = fp32_to_fp16(lo);
        const float d = fp16_to_fp32(blocks[b].d), m = fp16_to_fp32(blocks[b].m);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int64_t j = 0; j < kQK / 2; ++j) {
          const auto code = [&](float value) {
            return static_cast<uint8_t>(std::clamp(std::lround((value - m) * id), 0L, 15L));
          };
          blocks[b].qs[j] = static_cast<uint8_t>(code(v[j]) | (code(v[j + kQK / 2]) << 4));
        }
      }
    } else {
      SPECDEC_CHECK(false, "quantize_rows: unsupported type");
    }
  }
  return out;
}

HeadMatrix::HeadMatrix(GgmlType type, const float* rows, int64_t n_rows, int64_t n_cols) {
  bytes_ = quantize_rows(type, rows, n_rows, n_cols);
  w_.type = type;
  w_.data = bytes_.data();
  w_.rows = n_rows;
  w_.cols = n_cols;
  w_.row_bytes = ggml_row_bytes(type, n_cols);
  if (packable(type) && isa_supported(Isa::kAvx2)) {
    const WeightMatrix parts[] = {w_};
    packed_ = PackedWeights::pack(parts, nullptr);
    w_ = packed_.stacked();
  }
}

GgmlType head_weight_type(GgmlType wanted, std::initializer_list<int64_t> widths) {
  if (wanted != GgmlType::kQ8_0 && wanted != GgmlType::kQ4_1) return wanted;
  for (int64_t w : widths) {
    if (w % kQK != 0) return GgmlType::kF32;
  }
  return wanted;
}

}  // namespace specdec
