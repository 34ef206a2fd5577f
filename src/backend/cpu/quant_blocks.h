// GGML block layouts of the weight types specdec multiplies, the half-precision conversions,
// and the one common view of a quantized row that every matmul variant shares.
//
// The common view ("sub-blocks"): a quantized row is a sequence of sub-blocks of
// quant_layout(type).sub elements (32, or 16 for Q6_K). Sub-block b holds unsigned codes
// q[0..sub) (0..255) and two floats, and its values are
//   with a min    (Q4_1, Q5_1, Q4_K, Q5_K):  w[j] = dw * q[j] + mw
//   with offset o (Q4_0, Q5_0, Q8_0, Q6_K):  w[j] = dw * (q[j] - o)
// For the K-quants dw and mw already include the super-block scales (dw = d * sc, mw = -dmin * m),
// exactly as ggml's dequantize_row_q*_K computes them.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/ggml_type.h"

namespace specdec {

inline constexpr int64_t kQK = 32;     // elements per block of the 32-element types
inline constexpr int64_t kQK_K = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // element j: low nibble of qs[j], element j + 16: high nibble
};
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 min
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j (little-endian uint32) = bit 4 of element j
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_K {
  uint16_t d;          // f16 super-block scale of the sub-block scales
  uint16_t dmin;       // f16 super-block scale of the sub-block mins
  uint8_t scales[12];  // 8 x (6-bit scale, 6-bit min), see get_scale_min_k4
  uint8_t qs[128];     // 64-element chunk c: qs[32c + l] low nibble = element 64c + l,
                       //                     high nibble = element 64c + 32 + l
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];   // bit 2c of qh[l]: bit 4 of element 64c + l; bit 2c+1: of element 64c + 32 + l
  uint8_t qs[128];  // as Q4_K
};
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits, see decode_sub_block
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // one per 16 elements
  uint16_t d;         // f16 super-block scale
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// IEEE half -> float, exact (subnormals, inf and NaN included).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE half, round to nearest even (used by quantizers and tests).
uint16_t fp32_to_fp16(float f);

inline float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_bf16(float f);  // round to nearest even; NaN stays NaN

// ggml's unpacking of the 12-byte K-quant scales: 6-bit scale and min of sub-block j (0..7).
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

struct QuantLayout {
  int64_t sub = 0;  // elements per sub-block: 32, or 16 for Q6_K
  bool has_min = false;
  int offset = 0;  // codes are centred on this value (0 when has_min)
};

// The sub-block view of a quantized weight type; sub == 0 for F32 / F16 / BF16.
QuantLayout quant_layout(GgmlType type);

// Sub-block b of a row of a quantized type: q[0..sub) codes, *dw and *mw as above (*mw = 0 for
// the offset types). The scalar reference and dequantize_row are written on top of this.
void decode_sub_block(GgmlType type, const uint8_t* row, int64_t b, uint8_t* q, float* dw,
                      float* mw);

}  // namespace specdec
