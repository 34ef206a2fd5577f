// KvCache: rows written as floats come back exactly (f32) or rounded to half (f16), in place and
// per layer (f16 K in tiles of 16 slots, ranges crossing tiles); keep_slots moves exactly the
// listed rows of every layer; out-of-range use stops.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16
#include "backend/k_tiles.h"
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

// What a cache of type t gives back for x.
float stored(KvType t, float x) {
  return t == KvType::kF16 ? fp16_to_fp32(fp32_to_fp16(x)) : x;
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
    for (int64_t e = 0; e < kN * kRow; ++e) {
      ASSERT_EQ(kr[e], stored(t, k[l][e])) << "layer " << l << " K element " << e;
      ASSERT_EQ(vr[e], stored(t, v[l][e])) << "layer " << l << " V element " << e;
    }
  }
  // The raw layer views hold the elements where the layout says: K rows (f32) or tiles (f16).
  for (int64_t i = 0; i < kN; ++i) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) {
        const int64_t e = i * kRow + h * kHeadDim + d;
        const int64_t slot = kFirst + i;
        const float raw_k =
            t == KvType::kF16
                ? fp16_to_fp32(static_cast<const uint16_t*>(kv.k(1))[k_tile_index(
                      slot, h, d, kKvHeads, kHeadDim)])
                : static_cast<const float*>(kv.k(1))[slot * kRow + h * kHeadDim + d];
        const float raw_v = t == KvType::kF16
                                ? fp16_to_fp32(static_cast<const uint16_t*>(kv.v(1))[slot * kRow +
                                                                                     h * kHeadDim + d])
                                : static_cast<const float*>(kv.v(1))[slot * kRow + h * kHeadDim + d];
        ASSERT_EQ(raw_k, stored(t, k[1][e])) << "slot " << slot << " head " << h << " dim " << d;
        ASSERT_EQ(raw_v, stored(t, v[1][e])) << "slot " << slot << " head " << h << " dim " << d;
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
    for (int64_t s = 0; s < 19; ++s) {
      for (int64_t e = 0; e < kRow; ++e) {
        ASSERT_EQ(kr[s * kRow + e], stored(t, k[l][source[s] * kRow + e])) << l << " " << s;
        ASSERT_EQ(vr[s * kRow + e], stored(t, v[l][source[s] * kRow + e])) << l << " " << s;
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

INSTANTIATE_TEST_SUITE_P(Types, KvCacheTest, ::testing::Values(KvType::kF32, KvType::kF16),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

TEST(KvType, ParseAndName) {
  EXPECT_EQ(parse_kv_type("f16"), KvType::kF16);
  EXPECT_EQ(parse_kv_type("f32"), KvType::kF32);
  EXPECT_FALSE(parse_kv_type("q8_0").has_value());
  EXPECT_STREQ(kv_type_name(KvType::kF16), "f16");
  EXPECT_EQ(kv_type_bytes(KvType::kF16), 2u);
  EXPECT_EQ(kv_type_bytes(KvType::kF32), 4u);
}

}  // namespace
}  // namespace specdec
