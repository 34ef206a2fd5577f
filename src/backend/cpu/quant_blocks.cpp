// Decoding of GGML blocks into the common sub-block view (see quant_blocks.h). Scalar and
// written to be read: this is the definition every SIMD variant is tested against.
#include "backend/cpu/quant_blocks.h"

#include <cmath>

#include "util/check.h"

namespace specdec {

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal (or zero): value / 2^-24, rounded to even
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact: a < 2^-14, so scaled < 2^10
    const auto q = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const uint32_t e = ((abs >> 23) - 112) << 10;
  const uint32_t m = (abs >> 13) & 0x3ffu;
  uint32_t h = e | m;
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return static_cast<uint16_t>(sign | h);
}

uint16_t fp32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

QuantLayout quant_layout(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return {32, false, 8};
    case GgmlType::kQ4_1:
      return {32, true, 0};
    case GgmlType::kQ5_0:
      return {32, false, 16};
    case GgmlType::kQ5_1:
      return {32, true, 0};
    case GgmlType::kQ8_0:
      return {32, false, 128};
    case GgmlType::kQ4_K:
      return {32, true, 0};
    case GgmlType::kQ5_K:
      return {32, true, 0};
    case GgmlType::kQ6_K:
      return {16, false, 32};
    default:
      return {0, false, 0};
  }
}

namespace {

template <class Block>
const Block& block_at(const uint8_t* row, int64_t i) {
  return *reinterpret_cast<const Block*>(row + i * static_cast<int64_t>(sizeof(Block)));
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

void decode_sub_block(GgmlType type, const uint8_t* row, int64_t b, uint8_t* q, float* dw,
                      float* mw) {
  *mw = 0.0f;
  switch (type) {
    case GgmlType::kQ4_0: {
      const auto& blk = block_at<BlockQ4_0>(row, b);
      for (int j = 0; j < 16; ++j) {
        q[j] = blk.qs[j] & 0xf;
        q[j + 16] = blk.qs[j] >> 4;
      }
      *dw = fp16_to_fp32(blk.d);
      return;
    }
    case GgmlType::kQ4_1: {
      const auto& blk = block_at<BlockQ4_1>(row, b);
      for (int j = 0; j < 16; ++j) {
        q[j] = blk.qs[j] & 0xf;
        q[j + 16] = blk.qs[j] >> 4;
      }
      *dw = fp16_to_fp32(blk.d);
      *mw = fp16_to_fp32(blk.m);
      return;
    }
    case GgmlType::kQ5_0: {
      const auto& blk = block_at<BlockQ5_0>(row, b);
      const uint32_t qh = load_u32(blk.qh);
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<uint8_t>((blk.qs[j] & 0xf) | (((qh >> j) & 1u) << 4));
        q[j + 16] = static_cast<uint8_t>((blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      }
      *dw = fp16_to_fp32(blk.d);
      return;
    }
    case GgmlType::kQ5_1: {
      const auto& blk = block_at<BlockQ5_1>(row, b);
      const uint32_t qh = load_u32(blk.qh);
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<uint8_t>((blk.qs[j] & 0xf) | (((qh >> j) & 1u) << 4));
        q[j + 16] = static_cast<uint8_t>((blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      }
      *dw = fp16_to_fp32(blk.d);
      *mw = fp16_to_fp32(blk.m);
      return;
    }
    case GgmlType::kQ8_0: {
      const auto& blk = block_at<BlockQ8_0>(row, b);
      for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(blk.qs[j] + 128);
      *dw = fp16_to_fp32(blk.d);
      return;
    }
    case GgmlType::kQ4_K: {
      const auto& blk = block_at<BlockQ4_K>(row, b / 8);
      const int s = static_cast<int>(b % 8);  // sub-block within the super-block
      const uint8_t* qs = blk.qs + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) q[l] = (s % 2 == 0) ? (qs[l] & 0xf) : (qs[l] >> 4);
      uint8_t sc, m;
      get_scale_min_k4(s, blk.scales, &sc, &m);
      *dw = fp16_to_fp32(blk.d) * static_cast<float>(sc);
      *mw = -(fp16_to_fp32(blk.dmin) * static_cast<float>(m));
      return;
    }
    case GgmlType::kQ5_K: {
      const auto& blk = block_at<BlockQ5_K>(row, b / 8);
      const int s = static_cast<int>(b % 8);
      const uint8_t* qs = blk.qs + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) {
        const int low = (s % 2 == 0) ? (qs[l] & 0xf) : (qs[l] >> 4);
        q[l] = static_cast<uint8_t>(low | (((blk.qh[l] >> s) & 1) << 4));
      }
      uint8_t sc, m;
      get_scale_min_k4(s, blk.scales, &sc, &m);
      *dw = fp16_to_fp32(blk.d) * static_cast<float>(sc);
      *mw = -(fp16_to_fp32(blk.dmin) * static_cast<float>(m));
      return;
    }
    case GgmlType::kQ6_K: {
      // Super-block element e = 128 h + 32 g + l (h: half, g: group 0..3, l: 0..31):
      //   low 4 bits:  ql[64 h + l + 32 (g & 1)], low nibble for g < 2, high nibble for g >= 2
      //   high 2 bits: qh[32 h + l] >> 2 g
      // Sub-block s = e / 16 has scale scales[s].
      const auto& blk = block_at<BlockQ6_K>(row, b / 16);
      const int s = static_cast<int>(b % 16);
      const int h = s / 8;
      const int g = (s % 8) / 2;
      const int l0 = 16 * (s % 2);
      for (int j = 0; j < 16; ++j) {
        const int l = l0 + j;
        const uint8_t low_byte = blk.ql[64 * h + l + 32 * (g & 1)];
        const int low = g < 2 ? (low_byte & 0xf) : (low_byte >> 4);
        const int high = (blk.qh[32 * h + l] >> (2 * g)) & 3;
        q[j] = static_cast<uint8_t>(low | (high << 4));
      }
      *dw = fp16_to_fp32(blk.d) * static_cast<float>(blk.scales[s]);
      return;
    }
    default:
      SPECDEC_CHECK(false, std::string("decode_sub_block: not a quantized weight type: ") +
                               ggml_type_traits(type).name);
  }
}

}  // namespace specdec
