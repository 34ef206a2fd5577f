// Conformance of the matmul variants (ggml's test-backend-ops idea):
//  * dequantize_row against hand-built blocks with known values, and against a second,
//    independently written transcription of ggml's dequantize loops (catches layout errors);
//  * every variant supported here equals the scalar reference BIT FOR BIT, for every weight type
//    and many shapes (odd block counts, tails of every tile size, n from 0 to 512): the float
//    arithmetic of all variants is specified exactly in quant_kernels.h;
//  * results do not depend on the thread count or on n (row i of a batch equals a batch of one);
//  * the reference itself is close to exact float math on the dequantized weights, within a
//    bound derived from the 8-bit activation quantization (|x - dx q| <= dx / 2 per element).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"  // swiglu
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"
#include "common/random_blocks.h"
#include "util/check.h"
#include "util/huge_pages.h"

namespace specdec {
namespace {

using test::put_f16;
using test::random_block;

const GgmlType kAllTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                              GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

const char* type_name(GgmlType t) {
  return ggml_type_traits(t).name;
}

// ---------------------------------------------------------------------------------------------
// Weight generation: quantize random floats (32-element types, floats) or random block bytes
// with sane scales (every type; covers every code value, e.g. Q8_0's -128).

void quantize_block_32(GgmlType type, const float* x, uint8_t* out) {
  float mn = x[0], mx = x[0], amax = 0.0f, signed_max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      signed_max = x[j];
    }
  }
  auto nibble_pack = [&](const int* q, uint8_t* qs) {
    for (int j = 0; j < 16; ++j)
      qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  };
  auto high_bits = [&](const int* q, uint8_t* qh) {
    uint32_t bits = 0;
    for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    std::memcpy(qh, &bits, 4);
  };
  int q[32];
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0: {
      const int levels = type == GgmlType::kQ4_0 ? 8 : 16;
      const float d = signed_max / -static_cast<float>(levels);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int j = 0; j < 32; ++j) {
        q[j] =
            std::clamp(static_cast<int>(std::floor(x[j] * id + levels + 0.5f)), 0, 2 * levels - 1);
      }
      put_f16(out, d);
      if (type == GgmlType::kQ4_0) {
        nibble_pack(q, out + 2);
      } else {
        high_bits(q, out + 2);
        nibble_pack(q, out + 6);
      }
      return;
    }
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: {
      const int top = type == GgmlType::kQ4_1 ? 15 : 31;
      const float d = (mx - mn) / static_cast<float>(top);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int j = 0; j < 32; ++j)
        q[j] = std::clamp(static_cast<int>(std::lround((x[j] - mn) * id)), 0, top);
      put_f16(out, d);
      put_f16(out + 2, mn);
      if (type == GgmlType::kQ4_1) {
        nibble_pack(q, out + 4);
      } else {
        high_bits(q, out + 4);
        nibble_pack(q, out + 8);
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      put_f16(out, d);
      for (int j = 0; j < 32; ++j)
        out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
      return;
    }
    default:
      FAIL() << "not a 32-element type";
  }
}

struct Weights {
  GgmlType type;
  int64_t rows, cols;
  std::vector<uint8_t> data;
  WeightMatrix matrix() const {
    WeightMatrix w;
    w.type = type;
    w.data = data.data();
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = ggml_row_bytes(type, cols);
    return w;
  }
};

Weights make_weights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed, bool from_floats) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  Weights w{type, rows, cols, {}};
  const int64_t row_bytes = ggml_row_bytes(type, cols);
  w.data.resize(static_cast<size_t>(rows * row_bytes) + 64);
  const GgmlTypeTraits& t = ggml_type_traits(type);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data.data() + r * row_bytes;
    if (t.block_size == 1) {
      for (int64_t k = 0; k < cols; ++k) {
        const float v = normal(rng);
        if (type == GgmlType::kF32) {
          std::memcpy(row + 4 * k, &v, 4);
        } else {
          const uint16_t h = type == GgmlType::kF16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
          std::memcpy(row + 2 * k, &h, 2);
        }
      }
      continue;
    }
    for (int64_t b = 0; b < cols / t.block_size; ++b) {
      uint8_t* blk = row + b * t.block_bytes;
      if (from_floats && t.block_size == 32) {
        float x[32];
        for (float& v : x) v = normal(rng);
        quantize_block_32(type, x, blk);
      } else {
        random_block(type, rng, blk);
      }
    }
  }
  return w;
}

std::vector<float> make_activations(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = normal(rng);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 5 == 1) x[static_cast<size_t>(i * cols)] = 40.0f;  // an outlier
    if (i % 7 == 3 && cols >= 32) {
      for (int64_t k = 0; k < 32; ++k) x[static_cast<size_t>(i * cols + k)] = 0.0f;  // zero block
    }
    if (i % 11 == 4) {
      for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>(i * cols + k)] *= 1e-3f;
    }
  }
  return x;
}

int64_t min_cols(GgmlType type) {
  return ggml_type_traits(type).block_size == 256 ? 256 : 32;
}

// First index where two float arrays differ in bits, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// dequantize_row

// A second transcription of ggml's dequantize_row_* loops, written independently of
// decode_sub_block: used to cross-check the sub-block view on random blocks.
std::vector<float> ggml_style_dequantize(GgmlType type, const uint8_t* row, int64_t cols) {
  std::vector<float> y(static_cast<size_t>(cols));
  auto h = [](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return fp16_to_fp32(v);
  };
  const GgmlTypeTraits& t = ggml_type_traits(type);
  for (int64_t i = 0; i < cols / t.block_size; ++i) {
    const uint8_t* b = row + i * t.block_bytes;
    float* out = y.data() + i * t.block_size;
    switch (type) {
      case GgmlType::kQ4_0:
        for (int j = 0; j < 16; ++j) {
          out[j] = static_cast<float>((b[2 + j] & 0x0f) - 8) * h(b);
          out[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * h(b);
        }
        break;
      case GgmlType::kQ4_1:
        for (int j = 0; j < 16; ++j) {
          out[j] = static_cast<float>(b[4 + j] & 0x0f) * h(b) + h(b + 2);
          out[j + 16] = static_cast<float>(b[4 + j] >> 4) * h(b) + h(b + 2);
        }
        break;
      case GgmlType::kQ5_0:
      case GgmlType::kQ5_1: {
        const bool min = type == GgmlType::kQ5_1;
        uint32_t qh;
        std::memcpy(&qh, b + (min ? 4 : 2), 4);
        const uint8_t* qs = b + (min ? 8 : 6);
        for (int j = 0; j < 16; ++j) {
          const int xh0 = ((qh >> j) << 4) & 0x10;
          const int xh1 = (qh >> (j + 12)) & 0x10;
          const int x0 = (qs[j] & 0x0f) | xh0;
          const int x1 = (qs[j] >> 4) | xh1;
          out[j] =
              min ? static_cast<float>(x0) * h(b) + h(b + 2) : static_cast<float>(x0 - 16) * h(b);
          out[j + 16] =
              min ? static_cast<float>(x1) * h(b) + h(b + 2) : static_cast<float>(x1 - 16) * h(b);
        }
        break;
      }
      case GgmlType::kQ8_0:
        for (int j = 0; j < 32; ++j)
          out[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * h(b);
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K: {
        const bool five = type == GgmlType::kQ5_K;
        const float d = h(b), dmin = h(b + 2);
        const uint8_t* scales = b + 4;
        const uint8_t* qh = b + 16;
        const uint8_t* q = b + (five ? 48 : 16);
        int is = 0;
        uint8_t u1 = 1, u2 = 2;
        float* yy = out;
        for (int j = 0; j < 256; j += 64) {
          uint8_t sc, m;
          get_scale_min_k4(is + 0, scales, &sc, &m);
          const float d1 = d * sc, m1 = dmin * m;
          get_scale_min_k4(is + 1, scales, &sc, &m);
          const float d2 = d * sc, m2 = dmin * m;
          for (int l = 0; l < 32; ++l) {
            *yy++ = d1 * static_cast<float>((q[l] & 0xf) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
          }
          for (int l = 0; l < 32; ++l) {
            *yy++ = d2 * static_cast<float>((q[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
          }
          q += 32;
          is += 2;
          u1 = static_cast<uint8_t>(u1 << 2);
          u2 = static_cast<uint8_t>(u2 << 2);
        }
        break;
      }
      case GgmlType::kQ6_K: {
        const float d = h(b + 208);
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
        float* yy = out;
        for (int n = 0; n < 256; n += 128) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = d * sc[is + 0] * static_cast<float>(q1);
            yy[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
            yy[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
            yy[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
          }
          yy += 128;
          ql += 64;
          qh += 32;
          sc += 8;
        }
        break;
      }
      default:
        ADD_FAILURE() << "unexpected type";
    }
  }
  return y;
}

TEST(Dequantize, HandBuiltBlocks) {
  // Q4_0: d = 0.5, element j = (j - 8) * 0.5 for j < 16, element j + 16 = (15 - j - 8) * 0.5.
  {
    uint8_t b[18];
    put_f16(b, 0.5f);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    WeightMatrix w{GgmlType::kQ4_0, b, 1, 32, 18};
    float out[32];
    dequantize_row(w, 0, out);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(out[j], (j - 8) * 0.5f) << j;
      EXPECT_EQ(out[j + 16], (7 - j) * 0.5f) << j;
    }
  }
  // Q4_1: d = 0.25, m = -1: element = q * 0.25 - 1.
  {
    uint8_t b[20];
    put_f16(b, 0.25f);
    put_f16(b + 2, -1.0f);
    for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | (3 << 4));
    WeightMatrix w{GgmlType::kQ4_1, b, 1, 32, 20};
    float out[32];
    dequantize_row(w, 0, out);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(out[j], j * 0.25f - 1.0f) << j;
      EXPECT_EQ(out[j + 16], 3 * 0.25f - 1.0f) << j;
    }
  }
  // Q5_0: d = 1, qh bit j set for even j: element j = (nibble + 16 * bit) - 16.
  {
    uint8_t b[22];
    put_f16(b, 1.0f);
    const uint32_t qh = 0x55555555u;
    std::memcpy(b + 2, &qh, 4);
    for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(j | (j << 4));
    WeightMatrix w{GgmlType::kQ5_0, b, 1, 32, 22};
    float out[32];
    dequantize_row(w, 0, out);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(out[j], static_cast<float>(j + (j % 2 == 0 ? 16 : 0) - 16)) << j;
      EXPECT_EQ(out[j + 16], static_cast<float>(j + ((j + 16) % 2 == 0 ? 16 : 0) - 16)) << j;
    }
  }
  // Q5_1: d = 0.5, m = 2, all high bits set: element = (nibble + 16) * 0.5 + 2.
  {
    uint8_t b[24];
    put_f16(b, 0.5f);
    put_f16(b + 2, 2.0f);
    const uint32_t qh = 0xffffffffu;
    std::memcpy(b + 4, &qh, 4);
    for (int j = 0; j < 16; ++j) b[8 + j] = static_cast<uint8_t>(15 - j);
    WeightMatrix w{GgmlType::kQ5_1, b, 1, 32, 24};
    float out[32];
    dequantize_row(w, 0, out);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(out[j], (15 - j + 16) * 0.5f + 2.0f) << j;
      EXPECT_EQ(out[j + 16], 16 * 0.5f + 2.0f) << j;
    }
  }
  // Q8_0: d = 0.125, qs = j - 16 (and -128 once).
  {
    uint8_t b[34];
    put_f16(b, 0.125f);
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
    b[2 + 31] = 0x80;
    WeightMatrix w{GgmlType::kQ8_0, b, 1, 32, 34};
    float out[32];
    dequantize_row(w, 0, out);
    for (int j = 0; j < 31; ++j) EXPECT_EQ(out[j], (j - 16) * 0.125f) << j;
    EXPECT_EQ(out[31], -16.0f);
  }
  // Q4_K: d = 1, dmin = 0.5; sub-block scales 1..8 and mins 0..7 packed by hand.
  {
    BlockQ4_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(0.5f);
    const int sc[8] = {1, 2, 3, 4, 40, 50, 60, 63}, mn[8] = {0, 1, 2, 3, 33, 44, 55, 62};
    for (int j = 0; j < 4; ++j) {
      b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
      b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l)
        b.qs[32 * c + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
    }
    WeightMatrix w{GgmlType::kQ4_K, &b, 1, 256, 144};
    float out[256];
    dequantize_row(w, 0, out);
    for (int s = 0; s < 8; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int q = s % 2 == 0 ? l % 16 : 15 - l % 16;
        EXPECT_EQ(out[32 * s + l], static_cast<float>(sc[s] * q) - 0.5f * mn[s]) << s << " " << l;
      }
    }
  }
  // Q6_K: d = 0.5, scales s - 8, ql / qh chosen so that the code of element e is e % 64.
  {
    BlockQ6_K b{};
    b.d = fp32_to_fp16(0.5f);
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
    for (int e = 0; e < 256; ++e) {
      const int q = e % 64;
      const int h = e / 128, g = (e % 128) / 32, l = e % 32;
      uint8_t& low = b.ql[64 * h + l + 32 * (g & 1)];
      low = static_cast<uint8_t>(g < 2 ? (low & 0xf0) | (q & 15) : (low & 0x0f) | ((q & 15) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * g)));
    }
    WeightMatrix w{GgmlType::kQ6_K, &b, 1, 256, 210};
    float out[256];
    dequantize_row(w, 0, out);
    for (int e = 0; e < 256; ++e) {
      EXPECT_EQ(out[e], 0.5f * static_cast<float>(e / 16 - 8) * static_cast<float>(e % 64 - 32))
          << e;
    }
  }
  // F16 / BF16 / F32.
  {
    const uint16_t f16[3] = {0x3c00, 0xc100, 0x0001};  // 1, -2.5, 2^-24
    WeightMatrix w{GgmlType::kF16, f16, 1, 3, 6};
    float out[3];
    dequantize_row(w, 0, out);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -2.5f);
    EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
    const uint16_t bf16[3] = {0x3f80, 0xc020, 0x0000};  // 1, -2.5, 0
    w = WeightMatrix{GgmlType::kBF16, bf16, 1, 3, 6};
    dequantize_row(w, 0, out);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -2.5f);
    EXPECT_EQ(out[2], 0.0f);
    const float f32[3] = {1.5f, -0.25f, 3.0f};
    w = WeightMatrix{GgmlType::kF32, f32, 1, 3, 12};
    dequantize_row(w, 0, out);
    EXPECT_EQ(std::memcmp(out, f32, 12), 0);
  }
}

TEST(Dequantize, MatchesGgmlLoopsOnRandomBlocks) {
  for (GgmlType type : kAllTypes) {
    if (ggml_type_traits(type).block_size == 1) continue;
    const int64_t cols = 4 * min_cols(type) * (min_cols(type) == 32 ? 8 : 1);
    const Weights w = make_weights(type, 3, cols, 7, /*from_floats=*/false);
    for (int64_t r = 0; r < 3; ++r) {
      std::vector<float> out(static_cast<size_t>(cols));
      dequantize_row(w.matrix(), r, out.data());
      const std::vector<float> want =
          ggml_style_dequantize(type, w.data.data() + r * w.matrix().row_bytes, cols);
      for (int64_t k = 0; k < cols; ++k) {
        ASSERT_EQ(out[k], want[k]) << type_name(type) << " row " << r << " col " << k;
      }
    }
  }
}

TEST(Dequantize, HalfConversionsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), h) << h;
    ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
}

TEST(Dequantize, RejectsBadInput) {
  const std::vector<uint8_t> data(1024);
  WeightMatrix w{GgmlType::kQ4_0, data.data(), 2, 64, 36};
  float out[64];
  EXPECT_THROW(dequantize_row(w, 2, out), Error);
  EXPECT_THROW(dequantize_row(w, -1, out), Error);
  w.row_bytes = 40;
  EXPECT_THROW(dequantize_row(w, 0, out), Error);
}

// ---------------------------------------------------------------------------------------------
// Activation quantization

TEST(ActivationQuantization, SimdEqualsReference) {
  const int64_t cols = 576;
  const std::vector<float> x = make_activations(12, cols, 3);
  for (Isa isa : simd_isas()) {
    for (int64_t i = 0; i < 12; ++i) {
      std::vector<int8_t> q0(cols), q1(cols);
      std::vector<float> d0(cols / 32), d1(cols / 32);
      std::vector<int32_t> s0(cols / 16), s1(cols / 16);
      const float* xi = x.data() + i * cols;
      detail::quantize_activations_ref(xi, cols, q0.data(), d0.data(), s0.data());
      if (isa == Isa::kAvx2) {
        detail::quantize_activations_avx2(xi, cols, q1.data(), d1.data(), s1.data());
      } else {
        detail::quantize_activations_avx512(xi, cols, q1.data(), d1.data(), s1.data());
      }
      EXPECT_EQ(q0, q1) << isa_name(isa) << " row " << i;
      EXPECT_EQ(std::memcmp(d0.data(), d1.data(), d0.size() * 4), 0) << isa_name(isa);
      EXPECT_EQ(s0, s1) << isa_name(isa) << " row " << i;
    }
  }
}

TEST(ActivationQuantization, ReferenceIsAccurate) {
  const int64_t cols = 256;
  const std::vector<float> x = make_activations(6, cols, 5);
  for (int64_t i = 0; i < 6; ++i) {
    std::vector<int8_t> q(cols);
    std::vector<float> d(cols / 32);
    std::vector<int32_t> s16(cols / 16);
    detail::quantize_activations_ref(x.data() + i * cols, cols, q.data(), d.data(), s16.data());
    for (int64_t k = 0; k < cols; ++k) {
      const float xk = x[static_cast<size_t>(i * cols + k)];
      EXPECT_LE(std::fabs(xk - d[k / 32] * q[k]), 0.5001f * d[k / 32] + 1e-30f) << k;
      EXPECT_LE(std::abs(q[k]), 127);
    }
    for (int64_t h = 0; h < cols / 16; ++h) {
      int32_t sum = 0;
      for (int64_t k = 16 * h; k < 16 * h + 16; ++k) sum += q[k];
      EXPECT_EQ(s16[h], sum);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// matmul

std::vector<float> run(Isa isa, const Weights& w, const std::vector<float>& x, int64_t n,
                       ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(n * w.rows), -777.0f);
  matmul_isa(isa, w.matrix(), x.data(), n, y.data(), pool);
  return y;
}

// The AVX-512 or AVX2 kernels on the packed copy of w (packed_weights.h). packed_only: the
// copy alone (no `data`, as for stacked matrices), which the packed kernels run for every n.
std::vector<float> run_packed(Isa isa, const Weights& w, const std::vector<float>& x, int64_t n,
                              ThreadPool* pool, bool packed_only = false) {
  const WeightMatrix m = w.matrix();
  const PackedWeights packed = PackedWeights::pack({&m, 1}, pool);
  WeightMatrix pm = packed.stacked();
  if (packed_only) pm.data = nullptr;
  std::vector<float> y(static_cast<size_t>(n * w.rows), -777.0f);
  matmul_isa(isa, pm, x.data(), n, y.data(), pool);
  return y;
}

// The ISAs of this machine with a kernel over packed weights (AVX-VNNI: AVX2's, compiled with
// vpdpbusd).
std::vector<Isa> packed_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

void expect_variants_equal_reference(GgmlType type, int64_t rows, int64_t cols, int64_t n,
                                     uint32_t seed, ThreadPool* pool) {
  SCOPED_TRACE(std::string(type_name(type)) + " rows=" + std::to_string(rows) +
               " cols=" + std::to_string(cols) + " n=" + std::to_string(n));
  const Weights w = make_weights(type, rows, cols, seed, seed % 2 == 0);
  const std::vector<float> x = make_activations(n, cols, seed + 1);
  const std::vector<float> want = run(Isa::kScalar, w, x, n, pool);
  for (Isa isa : simd_isas()) {
    const std::vector<float> got = run(isa, w, x, n, pool);
    const int64_t at = first_bit_difference(want, got);
    ASSERT_EQ(at, -1) << isa_name(isa) << ": first difference at " << at << " (x row " << at / rows
                      << ", weight row " << at % rows << "): " << got[at] << " vs reference "
                      << want[at];
  }
  if (!packable(type)) return;
  for (Isa isa : packed_isas()) {
    for (bool packed_only : {false, true}) {
      if (packed_only && isa == Isa::kAvx512) continue;       // its n >= 32 path needs no rows
      if (packed_only && !avx2_reads_packed(type)) continue;  // AVX2 reads its file rows
      const std::vector<float> got = run_packed(isa, w, x, n, pool, packed_only);
      const int64_t at = first_bit_difference(want, got);
      ASSERT_EQ(at, -1) << isa_name(isa) << " packed" << (packed_only ? " only" : "")
                        << ": first difference at " << at << " (x row " << at / rows
                        << ", weight row " << at % rows << "): " << got[at] << " vs reference "
                        << want[at];
    }
  }
}

TEST(Matmul, VariantsEqualReferenceAllBatchSizes) {
  ThreadPool pool(2);
  for (GgmlType type : kAllTypes) {
    const int64_t cols = min_cols(type) == 256 ? 512 : 192;
    for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 31, 32, 33}) {
      expect_variants_equal_reference(type, 17, cols, n, static_cast<uint32_t>(100 + n), &pool);
    }
  }
}

TEST(Matmul, VariantsEqualReferenceShapes) {
  ThreadPool pool(2);
  for (GgmlType type : kAllTypes) {
    const int64_t c0 = min_cols(type);
    std::vector<int64_t> col_sizes;
    if (c0 == 32) {
      col_sizes = {32, 64, 96, 192, 576};  // odd and even block counts, not multiples of 128
    } else {
      col_sizes = {256, 768};
    }
    if (ggml_type_traits(type).block_size == 1) col_sizes.push_back(37);  // any width for floats
    for (int64_t cols : col_sizes) {
      for (int64_t rows : {1, 3, 17, 172}) {
        for (int64_t n : {1, 3, 9}) {
          expect_variants_equal_reference(type, rows, cols, n,
                                          static_cast<uint32_t>(rows * 31 + cols + n), &pool);
        }
      }
    }
    expect_variants_equal_reference(type, 513, c0 == 256 ? 256 : 64, 1, 11, &pool);
    expect_variants_equal_reference(type, 513, c0 == 256 ? 256 : 64, 16, 12, &pool);
  }
}

TEST(Matmul, VariantsEqualReferenceAnyThreadCount) {
  // The packed kernel's threads claim blocks of 16 rows from each other (stealing_split.h):
  // more threads than blocks, uneven stretches and a one-thread pool give the same bits.
  for (int threads : {1, 3, 5}) {
    ThreadPool pool(threads);
    for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
      const int64_t cols = min_cols(type) == 256 ? 256 : 64;
      for (int64_t rows : {17, 80, 513}) {
        for (int64_t n : {1, 5, 9}) {
          expect_variants_equal_reference(type, rows, cols, n,
                                          static_cast<uint32_t>(threads * 1000 + rows + n), &pool);
        }
      }
    }
  }
}

// The largest codes against the largest activations: every code at its maximum (15 for the
// nibble types, 31 for Q5, 63 for Q6_K, 127 / -128 for Q8_0) and every activation quantized to
// +-127, through the packed kernels for 1 and 8 rows, against the scalar reference bit for bit.
// The AVX2 kernels add 16-bit partial sums (vpmaddubsw) before widening: for 5-bit codes four of
// them would wrap (4 x 4 x 31 x 127 > 32767), for 6-bit codes three (3 x 2 x 63 x 127), which
// this catches (the random codes of the other tests do not reach it).
TEST(Matmul, PackedSixteenBitSumsHoldTheLargestCodes) {
  if (packed_isas().empty()) GTEST_SKIP() << "packed kernels need AVX2 or AVX-512";
  const uint16_t one = fp32_to_fp16(1.0f), half = fp32_to_fp16(0.5f);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kQ6_K}) {
    for (uint8_t code8 : {uint8_t{0x7f}, uint8_t{0x80}}) {
      if (code8 == 0x80 && type != GgmlType::kQ8_0) continue;
      const int64_t rows = 16, cols = 512;
      Weights w{type, rows, cols, {}};
      const GgmlTypeTraits& t = ggml_type_traits(type);
      const int64_t row_bytes = ggml_row_bytes(type, cols);
      w.data.assign(static_cast<size_t>(rows * row_bytes) + 64, 0);
      if (type == GgmlType::kQ6_K) {
        // ql and qh every bit set (every code 63), positive scales 1..16 and d = 1.
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t b = 0; b < cols / 256; ++b) {
            BlockQ6_K blk{};
            std::memset(blk.ql, 0xff, sizeof(blk.ql));
            std::memset(blk.qh, 0xff, sizeof(blk.qh));
            for (int s = 0; s < 16; ++s) blk.scales[s] = static_cast<int8_t>(1 + s);
            blk.d = one;
            std::memcpy(w.data.data() + r * row_bytes + b * t.block_bytes, &blk, sizeof(blk));
          }
        }
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t b = 0; b < cols / 32; ++b) {
            uint8_t* blk = w.data.data() + r * row_bytes + b * t.block_bytes;
            const bool has_min = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
            std::memcpy(blk, &one, 2);
            if (has_min) std::memcpy(blk + 2, &half, 2);
            // The rest of the block: qh (Q5) and qs, every bit set (Q8_0: the chosen byte).
            const int64_t head = has_min ? 4 : 2;
            std::memset(blk + head, type == GgmlType::kQ8_0 ? code8 : 0xff,
                        static_cast<size_t>(t.block_bytes - head));
          }
        }
      }
      for (float sign : {1.0f, -1.0f}) {
        for (int64_t n : {1, 8}) {
          SCOPED_TRACE(std::string(type_name(type)) + " code byte " + std::to_string(code8) +
                       " sign " + std::to_string(sign) + " n=" + std::to_string(n));
          const std::vector<float> x(static_cast<size_t>(n * cols), sign);
          const std::vector<float> want = run(Isa::kScalar, w, x, n, nullptr);
          for (Isa isa : packed_isas()) {
            for (bool packed_only : {false, true}) {
              if (packed_only && (isa == Isa::kAvx512 || !avx2_reads_packed(type))) continue;
              const std::vector<float> got = run_packed(isa, w, x, n, nullptr, packed_only);
              ASSERT_EQ(first_bit_difference(want, got), -1) << isa_name(isa);
            }
          }
        }
      }
    }
  }
}

// The kernels over packed weights (AVX2: matmul_packed_avx2.cpp; AVX-512 where present) for
// every row count of a verification or batching pass, 1..17 (full tiles of 8 and every tail),
// with a ragged last block of 16 rows (37 rows: its second half of 8 holds 5), an odd number of
// sub-blocks (96 columns) and both parities, with and without the file's rows beside the packed
// copy, on one thread and on pools that share the blocks; n == 0 writes nothing.
TEST(Matmul, PackedEqualsReferenceEveryRowCount) {
  if (packed_isas().empty()) GTEST_SKIP() << "packed kernels need AVX2 or AVX-512";
  ThreadPool pool2(2), pool3(3);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const bool super = min_cols(type) == 256;  // K-quants: whole super-blocks of 8 sub-blocks
    for (int64_t cols :
         super ? std::vector<int64_t>{256, 512, 768} : std::vector<int64_t>{32, 96, 256}) {
      for (int64_t rows : {5, 16, 37}) {
        const Weights w = make_weights(type, rows, cols, static_cast<uint32_t>(rows + cols), true);
        for (int64_t n = 1; n <= 17; ++n) {
          SCOPED_TRACE(std::string(type_name(type)) + " rows=" + std::to_string(rows) +
                       " cols=" + std::to_string(cols) + " n=" + std::to_string(n));
          const std::vector<float> x = make_activations(n, cols, static_cast<uint32_t>(7 * n));
          const std::vector<float> want = run(Isa::kScalar, w, x, n, nullptr);
          for (Isa isa : packed_isas()) {
            for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
              for (bool packed_only : {false, true}) {
                if (packed_only && isa == Isa::kAvx512) continue;
                if (packed_only && !avx2_reads_packed(type)) continue;
                const std::vector<float> got = run_packed(isa, w, x, n, pool, packed_only);
                const int64_t at = first_bit_difference(want, got);
                ASSERT_EQ(at, -1) << isa_name(isa) << (packed_only ? " packed only" : " packed")
                                  << " threads " << (pool ? pool->size() : 1)
                                  << ": first difference at " << at << ": " << got[at]
                                  << " vs reference " << want[at];
              }
            }
          }
        }
        // An empty batch: a no-op that leaves y alone.
        const WeightMatrix m = w.matrix();
        const PackedWeights packed = PackedWeights::pack({&m, 1}, nullptr);
        for (Isa isa : packed_isas()) {
          std::vector<float> y(4, -3.0f);
          const std::vector<float> x = make_activations(1, cols, 1);
          matmul_isa(isa, packed.stacked(), x.data(), 0, y.data(), &pool2);
          EXPECT_EQ(y, std::vector<float>(4, -3.0f));
        }
      }
    }
  }
}

// Prefill sizes: AVX2's tile kernel, AVX-512's panels, AVX-VNNI's packed kernel in slabs of 64
// rows (8 whole ones and a tail of 3).
TEST(Matmul, VariantsEqualReferencePrefill) {
  ThreadPool pool(2);
  for (GgmlType type : kAllTypes) {
    const int64_t cols = min_cols(type) == 256 ? 256 : 64;
    expect_variants_equal_reference(type, 172, cols, 515, 21, &pool);
  }
}

TEST(Matmul, IndependentOfBatchSizeAndThreads) {
  ThreadPool pool(2);
  for (GgmlType type : kAllTypes) {
    SCOPED_TRACE(type_name(type));
    const int64_t rows = 37, cols = min_cols(type) == 256 ? 512 : 160, n = 37;
    const Weights w = make_weights(type, rows, cols, 5, true);
    const std::vector<float> x = make_activations(n, cols, 6);
    for (Isa isa : simd_isas()) {
      const std::vector<float> batch = run(isa, w, x, n, &pool);
      const std::vector<float> single_thread = run(isa, w, x, n, nullptr);
      EXPECT_EQ(first_bit_difference(batch, single_thread), -1) << isa_name(isa);
      for (int64_t i = 0; i < n; ++i) {
        const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
        const std::vector<float> yi = run(isa, w, xi, 1, &pool);
        const std::vector<float> from_batch(batch.begin() + i * rows,
                                            batch.begin() + (i + 1) * rows);
        ASSERT_EQ(first_bit_difference(yi, from_batch), -1) << isa_name(isa) << " row " << i;
      }
    }
  }
}

// |y_ref - y_exact| <= sum_k |w_k| * 0.51 * dx(k) + 1e-5 * sum_k |w_k x_k|, where dx(k) is the
// activation scale of k's block: 8-bit quantization moves each activation by at most dx / 2 (plus
// float rounding of x / dx); the float part adds a few roundings per sub-block.
TEST(Matmul, ReferenceCloseToFloatMath) {
  double worst_ratio = 0.0, worst_relative = 0.0;
  for (GgmlType type : kAllTypes) {
    SCOPED_TRACE(type_name(type));
    const int64_t rows = 23, cols = min_cols(type) == 256 ? 512 : 576, n = 5;
    const Weights w = make_weights(type, rows, cols, 9, true);
    const std::vector<float> x = make_activations(n, cols, 10);
    const std::vector<float> y = run(Isa::kScalar, w, x, n, nullptr);
    const bool quantized = ggml_type_traits(type).block_size > 1;
    std::vector<float> wrow(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(w.matrix(), r, wrow.data());
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x.data() + i * cols;
        double exact = 0.0, abs_sum = 0.0, quant_bound = 0.0;
        for (int64_t k0 = 0; k0 < cols; k0 += 32) {
          float amax = 0.0f;
          for (int64_t k = k0; k < std::min(cols, k0 + 32); ++k)
            amax = std::max(amax, std::fabs(xi[k]));
          for (int64_t k = k0; k < std::min(cols, k0 + 32); ++k) {
            exact += static_cast<double>(wrow[k]) * xi[k];
            abs_sum += std::fabs(static_cast<double>(wrow[k]) * xi[k]);
            if (quantized) quant_bound += std::fabs(wrow[k]) * 0.51 * amax / 127.0;
          }
        }
        const double err = std::fabs(y[i * rows + r] - exact);
        const double bound = quant_bound + 1e-5 * abs_sum + 1e-30;
        ASSERT_LE(err, bound) << "row " << r << " x row " << i;
        worst_ratio = std::max(worst_ratio, err / bound);
        if (quantized) worst_relative = std::max(worst_relative, err / abs_sum);
      }
    }
  }
  std::printf(
      "[ reference vs float math: worst error / bound %.3f, worst error / sum|w x| %.2e ]\n",
      worst_ratio, worst_relative);
}

TEST(Matmul, EmptyAndErrors) {
  const Weights w = make_weights(GgmlType::kQ4_1, 8, 64, 1, true);
  std::vector<float> y(8, 5.0f);
  const std::vector<float> x(64, 1.0f);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    matmul_isa(isa, w.matrix(), x.data(), 0, y.data(), nullptr);  // n == 0: nothing written
    EXPECT_EQ(y, std::vector<float>(8, 5.0f));
  }
  WeightMatrix bad = w.matrix();
  bad.cols = 48;  // not a multiple of 32
  bad.row_bytes = 30;
  EXPECT_THROW(matmul(bad, x.data(), 1, y.data(), nullptr), Error);
  bad = w.matrix();
  bad.row_bytes += 1;
  EXPECT_THROW(matmul(bad, x.data(), 1, y.data(), nullptr), Error);
  bad = w.matrix();
  bad.type = GgmlType::kQ2_K;  // known to GGML, not to specdec's matmul
  EXPECT_THROW(matmul(bad, x.data(), 1, y.data(), nullptr), Error);
  bad = w.matrix();
  bad.type = static_cast<GgmlType>(5);  // unassigned id
  EXPECT_THROW(matmul(bad, x.data(), 1, y.data(), nullptr), Error);
  EXPECT_THROW(matmul(w.matrix(), nullptr, 1, y.data(), nullptr), Error);
  WeightMatrix zero_rows = w.matrix();
  zero_rows.rows = 0;
  matmul(zero_rows, x.data(), 1, y.data(), nullptr);  // nothing to do
}

// The packed layout holds exactly the codes and scales of the sub-block view, for every element.
TEST(PackedWeights, LayoutHoldsEverySubBlockValue) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(type_name(type));
    // rows not a multiple of 16; Q4_K: three super-blocks
    const Weights w = make_weights(type, 37, min_cols(type) == 256 ? 768 : 96, 3, false);
    const WeightMatrix m = w.matrix();
    const PackedWeights packed = PackedWeights::pack({&m, 1}, nullptr);
    const QuantLayout layout = quant_layout(type);
    uint8_t q[32];
    for (int64_t r = 0; r < w.rows; ++r) {
      const uint8_t* row = w.data.data() + r * m.row_bytes;
      const int64_t sub = layout.sub;  // 16 for Q6_K
      for (int64_t b = 0; b < w.cols / sub; ++b) {
        float dw, mw;
        decode_sub_block(type, row, b, q, &dw, &mw);
        for (int64_t j = 0; j < sub; ++j) {
          uint8_t code;
          float pdw, pmw;
          packed_element(packed.stacked(), r, sub * b + j, &code, &pdw, &pmw);
          ASSERT_EQ(code, q[j]) << "row " << r << " element " << sub * b + j;
          ASSERT_EQ(pdw, dw);
          if (layout.has_min) {
            ASSERT_EQ(pmw, mw);
          }
        }
      }
    }
  }
}

// Stacked matrices (Q/K/V packed as one) give each part's outputs in its columns, bit for bit,
// in memory of their own or in a HugeArena shared by several packed matrices (as a model does).
TEST(PackedWeights, StackedPartsEqualSeparateMatmuls) {
  if (packed_isas().empty()) {
    GTEST_SKIP() << "packed kernels need AVX2 or AVX-512";
  }
  ThreadPool pool(2);
  HugeArena shared_arena(size_t{64} << 10);  // small chunks: the pieces span several
  for (HugeArena* arena : {static_cast<HugeArena*>(nullptr), &shared_arena}) {
    for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                          GgmlType::kQ8_0, GgmlType::kQ4_K}) {
      SCOPED_TRACE(std::string(type_name(type)) + (arena ? " in an arena" : ""));
      const int64_t cols = min_cols(type) == 256 ? 512 : 192;
      const Weights a = make_weights(type, 48, cols, 1, true);
      const Weights b = make_weights(type, 16, cols, 2, true);
      const Weights c = make_weights(type, 21, cols, 3, true);
      const WeightMatrix parts[] = {a.matrix(), b.matrix(), c.matrix()};
      const PackedWeights packed = PackedWeights::pack(parts, &pool, arena);
      EXPECT_EQ(packed.stacked().rows, 85);
      EXPECT_EQ(packed.stacked().data, nullptr);
      for (Isa isa : packed_isas()) {
        for (int64_t n : {1, 3, 8, 13}) {
          const std::vector<float> x = make_activations(n, cols, 7);
          std::vector<float> y(static_cast<size_t>(n * 85));
          if (isa_avx2_class(isa) && !avx2_reads_packed(type)) {
            // The stack is AVX-512 only (a model multiplies the parts there): a clear error.
            EXPECT_THROW(matmul_isa(isa, packed.stacked(), x.data(), n, y.data(), &pool), Error);
            continue;
          }
          matmul_isa(isa, packed.stacked(), x.data(), n, y.data(), &pool);
          int64_t col0 = 0;
          for (size_t k = 0; k < 3; ++k) {
            const Weights& part = k == 0 ? a : k == 1 ? b : c;
            const std::vector<float> want = run(Isa::kScalar, part, x, n, nullptr);
            std::vector<float> got_part(static_cast<size_t>(n * part.rows));
            matmul_isa(isa, packed.part(k), x.data(), n, got_part.data(), &pool);
            EXPECT_EQ(first_bit_difference(want, got_part), -1)
                << isa_name(isa) << " part " << k << " n=" << n;
            for (int64_t i = 0; i < n; ++i) {
              for (int64_t r = 0; r < part.rows; ++r) {
                ASSERT_EQ(y[i * 85 + col0 + r], want[i * part.rows + r])
                    << isa_name(isa) << " part " << k << " n=" << n << " row " << i << " col " << r;
              }
            }
            col0 += part.rows;
          }
        }
      }
      // A packed-only matrix cannot run on the other variants: a clear error, not a crash.
      const std::vector<float> x = make_activations(1, cols, 7);
      std::vector<float> y(85);
      EXPECT_THROW(matmul_isa(Isa::kScalar, packed.stacked(), x.data(), 1, y.data(), nullptr),
                   Error);
    }
  }
  // Bad stacks: a type without a packed layout; a middle part that does not fill its blocks.
  const Weights k5 = make_weights(GgmlType::kQ5_K, 16, 256, 1, false);
  const WeightMatrix k5m = k5.matrix();
  EXPECT_THROW(PackedWeights::pack({&k5m, 1}, nullptr), Error);
  // Q6_K is packed one matrix at a time (a prefill needs its file rows).
  const Weights k6 = make_weights(GgmlType::kQ6_K, 16, 256, 1, false);
  const WeightMatrix k6_stack[] = {k6.matrix(), k6.matrix()};
  EXPECT_THROW(PackedWeights::pack(k6_stack, nullptr), Error);
  EXPECT_NO_THROW(PackedWeights::pack({k6_stack, 1}, nullptr));
  const Weights odd = make_weights(GgmlType::kQ4_0, 17, 64, 1, false);
  const Weights even = make_weights(GgmlType::kQ4_0, 16, 64, 1, false);
  const WeightMatrix bad_stack[] = {odd.matrix(), even.matrix()};
  EXPECT_THROW(PackedWeights::pack(bad_stack, nullptr), Error);
}

TEST(CpuFeatures, DispatchFollowsSetIsa) {
  const Isa before = active_isa();
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  EXPECT_TRUE(isa_supported(detect_isa()));
  if (isa_supported(Isa::kAvx512) || isa_supported(Isa::kAvxVnni)) {
    EXPECT_TRUE(isa_supported(Isa::kAvx2));
  }
  const Weights w = make_weights(GgmlType::kQ4_K, 9, 256, 4, false);
  const std::vector<float> x = make_activations(2, 256, 8);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512}) {
    if (!isa_supported(isa)) {
      EXPECT_THROW(set_isa(isa), Error);
      continue;
    }
    set_isa(isa);
    EXPECT_EQ(active_isa(), isa);
    std::vector<float> y(18);
    matmul(w.matrix(), x.data(), 2, y.data(), nullptr);
    EXPECT_EQ(y, run(isa, w, x, 2, nullptr));
  }
  set_isa(before);
  EXPECT_STREQ(isa_name(Isa::kAvx512), "avx512");
  EXPECT_STREQ(isa_name(Isa::kAvxVnni), "avxvnni");
}

// matmul_swiglu gives bitwise what swiglu() of each row and then matmul() give: the packed
// AVX-512 path (swiglu formed while quantizing, one thread or sharing the sub-blocks), the
// panel sizes from 32 rows on and unpacked weights (scratch path).
TEST(Matmul, SwigluFusedEqualsSwigluThenMatmul) {
  ThreadPool pool2(2), pool3(3);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (int64_t cols : {64, 96, 192}) {
      const Weights w = make_weights(type, 40, cols, static_cast<uint32_t>(cols), true);
      const WeightMatrix m = w.matrix();
      const PackedWeights packed = PackedWeights::pack({&m, 1}, &pool2);
      for (int64_t n : {1, 3, 5, 8, 9, 33}) {
        const std::vector<float> gu = make_activations(n, 2 * cols, static_cast<uint32_t>(n));
        std::vector<float> act(static_cast<size_t>(n * cols));  // [n, cols]
        for (int64_t i = 0; i < n; ++i) {
          swiglu(gu.data() + i * 2 * cols, gu.data() + i * 2 * cols + cols, cols,
                 act.data() + i * cols);
        }
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
          for (const WeightMatrix& wm : {m, packed.stacked()}) {
            std::vector<float> want(static_cast<size_t>(n * w.rows), -1.0f);
            std::vector<float> got(static_cast<size_t>(n * w.rows), -2.0f);
            std::vector<float> scratch(static_cast<size_t>(n * cols));
            matmul(wm, act.data(), n, want.data(), pool);
            matmul_swiglu(wm, gu.data(), n, got.data(), scratch.data(), pool);
            ASSERT_EQ(first_bit_difference(want, got), -1)
                << type_name(type) << " cols " << cols << " n " << n << " threads "
                << (pool ? pool->size() : 1) << (wm.packed ? " packed" : "");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace specdec
