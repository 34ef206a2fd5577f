// KvCache: rows written as floats come back exactly (f32), rounded to half (f16) or quantized
// per (slot, KV head) row (q8_0, backend/kv_quant.h), in place and per layer (f16 / q8_0 K in
// tiles of 16 slots, ranges crossing tiles); keep_slots moves exactly the listed rows of every
// layer; out-of-range use stops. The q8_0 quantizer itself: KvQuant below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16
#include "backend/k_tiles.h"
#include "backend/kv_quant.h"
#include "common/kv_stored.h"
#include "kv/kv_cache.h"

namespace specdec {
namespace {

constexpr int kLayers = 3, kKvHeads = 2, kHeadDim = 5;  // rows of 10 elements
constexpr int64_t kRow = kKvHeads * kHeadDim;

std::vector<float> random_rows(std::mt19937& gen, int64_t n) {
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n * kRow));  // [n, n_kv_heads, head_dim]
  for (float& x : v) x = dist(gen);
  return v;
}

// What a cache of type t gives back for the rows x [n, n_kv_heads, head_dim] (q8_0: each head
// row quantized on its own).
std::vector<float> stored(KvType t, const std::vector<float>& x) {
  return test::stored_rows(t, x, kHeadDim);
}

// Element (slot, h, d) of layer `layer` as the raw view holds it: K rows (f32) or tiles (f16,
// q8_0 codes times the scale of the slot's head row), V rows.
float raw_element(const KvCache& kv, bool is_k, int layer, int64_t slot, int h, int d) {
  const int32_t table[1] = {0};
  const KvView view = const_cast<KvCache&>(kv).storage().view(layer, table);
  const KvType t = kv.type();
  const int64_t row = slot * kRow + h * kHeadDim + d;
  const int64_t e = is_k && k_tiled(t) ? k_tile_index(slot, h, d, kKvHeads, kHeadDim) : row;
  const uint8_t* base = is_k ? view.k : view.v;
  if (t == KvType::kF32) return reinterpret_cast<const float*>(base)[e];
  if (t == KvType::kF16) return fp16_to_fp32(reinterpret_cast<const uint16_t*>(base)[e]);
  const float* scales = is_k ? view.k_scale : view.v_scale;  // [n_kv_heads, block_slots]
  return dequantize_kv(reinterpret_cast<const int8_t*>(base)[e],
                       scales[h * view.block_slots + slot]);
}

class KvCacheTest : public ::testing::TestWithParam<KvType> {};

TEST_P(KvCacheTest, WriteReadRoundTripPerLayer) {
  const KvType t = GetParam();
  std::mt19937 gen(1);
  constexpr int64_t kFirst = 13, kN = 20;  // slots 13..32: parts of three K tiles
  KvCache kv(kLayers, kKvHeads, kHeadDim, 40, t);
  EXPECT_EQ(kv.type(), t);
  EXPECT_EQ(kv.row_elems(), kRow);
  std::vector<std::vector<float>> k(kLayers), v(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    k[l] = random_rows(gen, kN);
    v[l] = random_rows(gen, kN);
    kv.write(l, kFirst, kN, k[l].data(), v[l].data());
  }
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> kr(kN * kRow), vr(kN * kRow);
    kv.read(l, kFirst, kN, kr.data(), vr.data());
    const std::vector<float> ks = stored(t, k[l]), vs = stored(t, v[l]);
    for (int64_t e = 0; e < kN * kRow; ++e) {
      ASSERT_EQ(kr[e], ks[e]) << "layer " << l << " K element " << e;
      ASSERT_EQ(vr[e], vs[e]) << "layer " << l << " V element " << e;
    }
  }
  // The raw layer views hold the elements where the layout says: K rows (f32) or tiles (f16,
  // q8_0), with q8_0's scales per (KV head, slot).
  const std::vector<float> ks = stored(t, k[1]), vs = stored(t, v[1]);
  for (int64_t i = 0; i < kN; ++i) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) {
        const int64_t e = i * kRow + h * kHeadDim + d;
        const int64_t slot = kFirst + i;
        ASSERT_EQ(raw_element(kv, true, 1, slot, h, d), ks[e])
            << "slot " << slot << " head " << h << " dim " << d;
        ASSERT_EQ(raw_element(kv, false, 1, slot, h, d), vs[e])
            << "slot " << slot << " head " << h << " dim " << d;
      }
    }
  }
}

TEST_P(KvCacheTest, KeepSlotsMovesListedRowsOfEveryLayer) {
  const KvType t = GetParam();
  std::mt19937 gen(2);
  KvCache kv(kLayers, kKvHeads, kHeadDim, 40, t);
  std::vector<std::vector<float>> k(kLayers), v(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    k[l] = random_rows(gen, 37);
    v[l] = random_rows(gen, 37);
    kv.write(l, 0, 37, k[l].data(), v[l].data());
  }
  kv.append(37);
  const std::vector<int64_t> keep = {15, 16, 20, 33, 36};  // from K tiles 0, 1 and 2
  kv.keep_slots(14, keep);  // slots 0..13 stay, then 15, 16, 20, 33, 36 move to 14 .. 18
  ASSERT_EQ(kv.size(), 19);
  std::vector<int64_t> source;
  for (int64_t s = 0; s < 14; ++s) source.push_back(s);
  source.insert(source.end(), keep.begin(), keep.end());
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> kr(19 * kRow), vr(19 * kRow);
    kv.read(l, 0, 19, kr.data(), vr.data());
    const std::vector<float> ks = stored(t, k[l]), vs = stored(t, v[l]);
    for (int64_t s = 0; s < 19; ++s) {
      for (int64_t e = 0; e < kRow; ++e) {
        ASSERT_EQ(kr[s * kRow + e], ks[source[s] * kRow + e]) << l << " " << s;
        ASSERT_EQ(vr[s * kRow + e], vs[source[s] * kRow + e]) << l << " " << s;
      }
    }
  }
}

// Misuse is a caller's bug: an internal check stops the process with a message.
TEST_P(KvCacheTest, OutOfRangeUseStopsWithAMessage) {
  KvCache kv(kLayers, kKvHeads, kHeadDim, 4, GetParam());
  std::vector<float> rows(5 * kRow, 1.0f);
  EXPECT_DEATH(kv.write(0, 2, 3, rows.data(), rows.data()), "KV write outside the cache");
  EXPECT_DEATH(kv.write(kLayers, 0, 1, rows.data(), rows.data()), "KV write outside the cache");
  EXPECT_DEATH(kv.read(0, 3, 2, rows.data(), nullptr), "KV read outside the cache");
  EXPECT_DEATH(kv.append(5), "KV append past capacity");
  kv.append(2);
  EXPECT_DEATH(kv.truncate(3), "KV truncate past size");
  const std::vector<int64_t> bad = {1, 1};
  EXPECT_DEATH(kv.keep_slots(0, bad), "increasing slots");
}

INSTANTIATE_TEST_SUITE_P(Types, KvCacheTest,
                         ::testing::Values(KvType::kF32, KvType::kF16, KvType::kQ8),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

TEST(KvType, ParseAndName) {
  EXPECT_EQ(parse_kv_type("f16"), KvType::kF16);
  EXPECT_EQ(parse_kv_type("f32"), KvType::kF32);
  EXPECT_EQ(parse_kv_type("q8_0"), KvType::kQ8);
  EXPECT_FALSE(parse_kv_type("q8").has_value());
  EXPECT_FALSE(parse_kv_type("q4_0").has_value());
  EXPECT_STREQ(kv_type_name(KvType::kF16), "f16");
  EXPECT_STREQ(kv_type_name(KvType::kQ8), "q8_0");
  EXPECT_EQ(kv_type_bytes(KvType::kF16), 2u);
  EXPECT_EQ(kv_type_bytes(KvType::kF32), 4u);
  EXPECT_EQ(kv_type_bytes(KvType::kQ8), 1u);
  EXPECT_EQ(kv_scale_bytes(KvType::kQ8), 4u);
  EXPECT_EQ(kv_scale_bytes(KvType::kF16), 0u);
}

// The q8_0 rows (kv_quant.h), checked against their definition element by element: the scale is
// max |x| / 127, every value within half a step of d · c, the largest one at ±127, ties of
// x · 127 / amax rounded to even; a zero row and rows with a NaN or an infinity.
TEST(KvQuant, RowsQuantizeToTheirDefinition) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-5.0f, 5.0f);
  for (int n : {1, 7, 64, 128}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& e : x) e = dist(gen) * (trial % 5 == 0 ? 1e-30f : 1.0f);  // some tiny rows
      std::vector<int8_t> c(static_cast<size_t>(n));
      const float d = quantize_kv_row(x.data(), n, c.data());
      float amax = 0.0f;
      for (float e : x) amax = std::max(amax, std::fabs(e));
      ASSERT_EQ(d, amax / 127.0f) << n;
      for (int i = 0; i < n; ++i) {
        const double want = std::nearbyint(static_cast<double>(x[i] * (127.0f / amax)));
        ASSERT_EQ(c[i], static_cast<int8_t>(want)) << n << " element " << i;
        ASSERT_LE(std::fabs(static_cast<double>(x[i]) - static_cast<double>(d) * c[i]),
                  0.5 * d * (1 + 1e-5) + 1e-45)
            << n << " element " << i;
        if (std::fabs(x[i]) == amax) ASSERT_EQ(std::abs(c[i]), 127);
      }
    }
  }
  // 63.5 / 127 · 127 = 63.5 rounds to even 64; 62.5 to 62.
  const float ties[3] = {127.0f, 63.5f, -62.5f};
  int8_t c[3];
  ASSERT_EQ(quantize_kv_row(ties, 3, c), 1.0f);
  EXPECT_EQ(c[0], 127);
  EXPECT_EQ(c[1], 64);
  EXPECT_EQ(c[2], -62);
  const float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
  int8_t z[4] = {1, 1, 1, 1};
  EXPECT_EQ(quantize_kv_row(zeros, 4, z), 0.0f);
  for (int8_t e : z) EXPECT_EQ(e, 0);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    const float row[3] = {1.0f, bad, 2.0f};
    int8_t b[3] = {5, 5, 5};
    EXPECT_TRUE(std::isnan(quantize_kv_row(row, 3, b)));
    for (int8_t e : b) EXPECT_EQ(e, 0);
  }
}

}  // namespace
}  // namespace specdec
