#include "common/random_blocks.h"

#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/quant_blocks.h"

namespace specdec::test {

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

void random_block(GgmlType type, std::mt19937& rng, uint8_t* out) {
  const int64_t bytes = ggml_type_traits(type).block_bytes;
  for (int64_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  std::uniform_real_distribution<float> offset(-1.0f, 1.0f);
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      put_f16(out, scale(rng));
      return;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      put_f16(out, scale(rng));
      put_f16(out + 2, offset(rng));
      return;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      put_f16(out, scale(rng) * 0.1f);
      put_f16(out + 2, scale(rng) * 0.1f);
      return;
    case GgmlType::kQ6_K:
      put_f16(out + 208, scale(rng) * 0.05f);
      return;
    default:
      FAIL() << "not a quantized type";
  }
}

}  // namespace specdec::test
