// PagedKvStorage and KvView: rows written through a scattered block table come back exactly
// (f32), rounded to half (f16) or quantized per head row (q8_0, kv_quant.h), from ranges that cross
// block and K-tile boundaries, and sit in memory where the view's layout says; writes through one
// table touch no block outside it and no other layer; copy_slot moves one slot of every layer
// across blocks; blocks_in / block_bytes arithmetic; kv_run merges consecutive block ids into one
// run and splits the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16
#include "backend/k_tiles.h"
#include "backend/kv_quant.h"
#include "backend/kv_view.h"
#include "common/kv_stored.h"
#include "kv/paged_kv.h"

namespace specdec {
namespace {

constexpr int kLayers = 3, kKvHeads = 2, kHeadDim = 5;  // rows of 10 elements
constexpr int64_t kRow = kKvHeads * kHeadDim;
constexpr int32_t kBlocks = 8;
const std::vector<int32_t> kTable = {5, 2, 7, 3};   // scattered, one id going down
const std::vector<int32_t> kOthers = {0, 1, 4, 6};  // the blocks not in kTable

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

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

// K and V of all slots of `table` in `layer`: [table.size() * block_slots, kRow] each.
struct Rows {
  std::vector<float> k, v;
};
Rows read_all(const PagedKvStorage& kv, int layer, const std::vector<int32_t>& table) {
  const int64_t n = static_cast<int64_t>(table.size()) * kv.block_slots();
  Rows r;
  r.k.resize(static_cast<size_t>(n * kRow));
  r.v.resize(static_cast<size_t>(n * kRow));
  kv.read(layer, table, 0, n, r.k.data(), r.v.data());
  return r;
}

// Element (slot, head, dim) of `layer` as the view's layout says it is stored: slot s in block
// table[s / block_slots] at local slot s % block_slots, K in rows (f32) or tiles (f16).
float raw_k(const KvView& view, int64_t slot, int h, int d) {
  const int32_t block = view.table[slot / view.block_slots];
  const int64_t local = slot % view.block_slots;
  const uint8_t* base = view.k + block * view.k_block_bytes;
  if (view.type == KvType::kQ8) {  // codes in tiles, scales [n_kv_heads, block_slots] per block
    const float scale =
        view.k_scale[block * view.scale_block_floats + h * view.block_slots + local];
    return dequantize_kv(
        reinterpret_cast<const int8_t*>(base)[k_tile_index(local, h, d, kKvHeads, kHeadDim)],
        scale);
  }
  if (view.type == KvType::kF16) {
    return fp16_to_fp32(
        reinterpret_cast<const uint16_t*>(base)[k_tile_index(local, h, d, kKvHeads, kHeadDim)]);
  }
  return reinterpret_cast<const float*>(base)[local * kRow + h * kHeadDim + d];
}
float raw_v(const KvView& view, int64_t slot, int h, int d) {
  const int32_t block = view.table[slot / view.block_slots];
  const int64_t local = slot % view.block_slots;
  const uint8_t* base = view.v + block * view.v_block_bytes;
  const int64_t e = local * kRow + h * kHeadDim + d;
  if (view.type == KvType::kQ8) {
    const float scale =
        view.v_scale[block * view.scale_block_floats + h * view.block_slots + local];
    return dequantize_kv(reinterpret_cast<const int8_t*>(base)[e], scale);
  }
  return view.type == KvType::kF16 ? fp16_to_fp32(reinterpret_cast<const uint16_t*>(base)[e])
                                   : reinterpret_cast<const float*>(base)[e];
}

struct Param {
  KvType type;
  int64_t block_slots;
};

class PagedKvTest : public ::testing::TestWithParam<Param> {};

// Writes every layer in three pieces that cross block (and, for block_slots 32, tile)
// boundaries; reads the rows back whole and in other odd pieces; checks the raw layout.
TEST_P(PagedKvTest, WriteReadRoundTripThroughScatteredTable) {
  const auto [t, bs] = GetParam();
  std::mt19937 gen(1);
  PagedKvStorage kv(kLayers, kKvHeads, kHeadDim, kBlocks, bs, t);
  EXPECT_EQ(kv.type(), t);
  EXPECT_EQ(kv.block_slots(), bs);
  EXPECT_EQ(kv.row_elems(), kRow);
  const int64_t n = static_cast<int64_t>(kTable.size()) * bs;  // every slot of the table
  const int64_t cuts[] = {0, bs / 2 + 3, 2 * bs + 7, n};       // piece ends, none on a block edge
  std::vector<std::vector<float>> k(kLayers), v(kLayers);      // [n, kRow] per layer
  for (int l = 0; l < kLayers; ++l) {
    k[l] = random_rows(gen, n);
    v[l] = random_rows(gen, n);
    for (int p = 0; p + 1 < 4; ++p) {
      kv.write(l, kTable, cuts[p], cuts[p + 1] - cuts[p], k[l].data() + cuts[p] * kRow,
               v[l].data() + cuts[p] * kRow);
    }
  }
  for (int l = 0; l < kLayers; ++l) {
    const Rows all = read_all(kv, l, kTable);
    const std::vector<float> sk = stored(t, k[l]), sv = stored(t, v[l]);
    for (int64_t e = 0; e < n * kRow; ++e) {
      ASSERT_TRUE(same_bits(all.k[e], sk[e]))
          << "layer " << l << " slot " << e / kRow << " K " << all.k[e] << " vs " << k[l][e];
      ASSERT_TRUE(same_bits(all.v[e], sv[e]))
          << "layer " << l << " slot " << e / kRow << " V " << all.v[e] << " vs " << v[l][e];
    }
    // Other pieces: one crossing two block boundaries, one inside a block, K or V alone.
    const int64_t first = bs - 3, count = bs + 6;
    std::vector<float> kr(static_cast<size_t>(count * kRow)), vr(kr.size());
    kv.read(l, kTable, first, count, kr.data(), nullptr);
    kv.read(l, kTable, first, count, nullptr, vr.data());
    for (int64_t e = 0; e < count * kRow; ++e) {
      ASSERT_TRUE(same_bits(kr[e], all.k[first * kRow + e])) << "layer " << l << " K piece " << e;
      ASSERT_TRUE(same_bits(vr[e], all.v[first * kRow + e])) << "layer " << l << " V piece " << e;
    }
    kv.read(l, kTable, 2 * bs + 1, 2, kr.data(), vr.data());
    for (int64_t e = 0; e < 2 * kRow; ++e) {
      ASSERT_TRUE(same_bits(kr[e], all.k[(2 * bs + 1) * kRow + e]));
      ASSERT_TRUE(same_bits(vr[e], all.v[(2 * bs + 1) * kRow + e]));
    }
    // The raw memory behind the view holds each element where the layout says.
    const KvView view = kv.view(l, kTable.data());
    EXPECT_EQ(view.type, t);
    EXPECT_EQ(view.block_slots, bs);
    for (int64_t s = 0; s < n; ++s) {
      for (int h = 0; h < kKvHeads; ++h) {
        for (int d = 0; d < kHeadDim; ++d) {
          const int64_t e = s * kRow + h * kHeadDim + d;
          ASSERT_TRUE(same_bits(raw_k(view, s, h, d), sk[e]))
              << "layer " << l << " slot " << s << " head " << h << " dim " << d;
          ASSERT_TRUE(same_bits(raw_v(view, s, h, d), sv[e]))
              << "layer " << l << " slot " << s << " head " << h << " dim " << d;
        }
      }
    }
  }
}

// Writes through one table leave every block outside it, and every other layer, as they were.
TEST_P(PagedKvTest, WritesTouchOnlyTheTablesBlocksAndLayer) {
  const auto [t, bs] = GetParam();
  std::mt19937 gen(2);
  PagedKvStorage kv(kLayers, kKvHeads, kHeadDim, kBlocks, bs, t);
  // A fresh storage is zeroed.
  std::vector<int32_t> every(kBlocks);
  for (int32_t b = 0; b < kBlocks; ++b) every[b] = b;
  for (int l = 0; l < kLayers; ++l) {
    const Rows r = read_all(kv, l, every);
    for (size_t e = 0; e < r.k.size(); ++e) {
      ASSERT_EQ(r.k[e], 0.0f);
      ASSERT_EQ(r.v[e], 0.0f);
    }
  }
  // Fill every block of every layer with a known pattern, through the table of all blocks.
  const int64_t all_slots = kBlocks * bs;
  std::vector<std::vector<float>> base_k(kLayers), base_v(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    base_k[l] = random_rows(gen, all_slots);
    base_v[l] = random_rows(gen, all_slots);
    kv.write(l, every, 0, all_slots, base_k[l].data(), base_v[l].data());
  }
  std::vector<Rows> before;
  for (int l = 0; l < kLayers; ++l) before.push_back(read_all(kv, l, every));

  // Overwrite all slots of kTable in layer 1 only.
  const int64_t n = static_cast<int64_t>(kTable.size()) * bs;
  const std::vector<float> k = random_rows(gen, n), v = random_rows(gen, n);
  kv.write(1, kTable, 0, n, k.data(), v.data());

  const std::vector<float> sk = stored(t, k), sv = stored(t, v);
  for (int l = 0; l < kLayers; ++l) {
    const Rows after = read_all(kv, l, every);
    for (int32_t b = 0; b < kBlocks; ++b) {
      const bool in_table = l == 1 && std::find(kTable.begin(), kTable.end(), b) != kTable.end();
      for (int64_t e = b * bs * kRow; e < (b + 1) * bs * kRow; ++e) {
        if (in_table) {
          // Block b is table entry i: its slots are the sequence's slots i * bs ...
          const auto i = std::find(kTable.begin(), kTable.end(), b) - kTable.begin();
          const int64_t se = i * bs * kRow + (e - b * bs * kRow);
          ASSERT_TRUE(same_bits(after.k[e], sk[se])) << "block " << b;
          ASSERT_TRUE(same_bits(after.v[e], sv[se])) << "block " << b;
        } else {
          ASSERT_TRUE(same_bits(after.k[e], before[l].k[e]))
              << "layer " << l << " block " << b << " changed by a write through another table";
          ASSERT_TRUE(same_bits(after.v[e], before[l].v[e]))
              << "layer " << l << " block " << b << " changed by a write through another table";
        }
      }
    }
  }
  // The blocks outside kTable, read through their own table, still hold the pattern.
  for (int l = 0; l < kLayers; ++l) {
    const Rows others = read_all(kv, l, kOthers);
    const std::vector<float> bk = stored(t, base_k[l]), bv = stored(t, base_v[l]);
    for (size_t i = 0; i < kOthers.size(); ++i) {
      for (int64_t e = 0; e < bs * kRow; ++e) {
        const int64_t we = kOthers[i] * bs * kRow + e;
        ASSERT_TRUE(same_bits(others.k[i * bs * kRow + e], bk[we]));
        ASSERT_TRUE(same_bits(others.v[i * bs * kRow + e], bv[we]));
      }
    }
  }
}

// copy_slot moves one slot's K and V in every layer, across blocks, inside a block and inside a
// K tile; nothing else changes; from == to changes nothing.
TEST_P(PagedKvTest, CopySlotAcrossBlocksInEveryLayer) {
  const auto [t, bs] = GetParam();
  std::mt19937 gen(3);
  PagedKvStorage kv(kLayers, kKvHeads, kHeadDim, kBlocks, bs, t);
  const int64_t n = static_cast<int64_t>(kTable.size()) * bs;
  for (int l = 0; l < kLayers; ++l) {
    const std::vector<float> k = random_rows(gen, n), v = random_rows(gen, n);
    kv.write(l, kTable, 0, n, k.data(), v.data());
  }
  struct Copy {
    int64_t from, to;
  };
  const Copy copies[] = {
      {3, 3 * bs + 7},       // block 5 -> block 3 (a later table entry)
      {2 * bs + 9, bs + 1},  // block 7 -> block 2 (an earlier one)
      {bs + 4, bs + 20},     // inside block 2 (two tiles apart for bs 32)
      {17, 18},              // inside one tile (bs 32) / blocks 2 -> 2 (bs 16)
      {n - 1, 0},            // last slot to the first
      {5, 5},                // no-op
  };
  for (const Copy& c : copies) {
    std::vector<Rows> before;
    for (int l = 0; l < kLayers; ++l) before.push_back(read_all(kv, l, kTable));
    kv.copy_slot(kTable, c.from, c.to);
    for (int l = 0; l < kLayers; ++l) {
      const Rows after = read_all(kv, l, kTable);
      for (int64_t s = 0; s < n; ++s) {
        const int64_t src = s == c.to ? c.from : s;
        for (int64_t e = 0; e < kRow; ++e) {
          ASSERT_TRUE(same_bits(after.k[s * kRow + e], before[l].k[src * kRow + e]))
              << "copy " << c.from << " -> " << c.to << " layer " << l << " slot " << s;
          ASSERT_TRUE(same_bits(after.v[s * kRow + e], before[l].v[src * kRow + e]))
              << "copy " << c.from << " -> " << c.to << " layer " << l << " slot " << s;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TypesAndBlocks, PagedKvTest,
                         ::testing::Values(Param{KvType::kF32, 16}, Param{KvType::kF32, 32},
                                           Param{KvType::kF16, 16}, Param{KvType::kF16, 32},
                                           Param{KvType::kQ8, 16}, Param{KvType::kQ8, 32}),
                         [](const auto& info) {
                           return std::string(kv_type_name(info.param.type)) + "_bs" +
                                  std::to_string(info.param.block_slots);
                         });

// Rounding to half happens on write (nearest even) and is exact on read: a value halfway
// between two halves comes back as the even one.
TEST(PagedKv, F16RoundsToNearestEven) {
  PagedKvStorage kv(1, 1, 4, 2, 16, KvType::kF16);
  const float k[4] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65504.0f, -0.0f};  // ties, max
  const float v[4] = {0.1f, 1e-8f, 1e6f, 3.0f};
  const int32_t table[1] = {1};
  kv.write(0, table, 9, 1, k, v);
  float kr[4], vr[4];
  kv.read(0, table, 9, 1, kr, vr);
  EXPECT_EQ(kr[0], 1.0f);
  EXPECT_EQ(kr[1], 1.0f + 4.0f / 2048);
  EXPECT_EQ(kr[2], 65504.0f);
  EXPECT_TRUE(std::signbit(kr[3]));
  EXPECT_EQ(vr[0], fp16_to_fp32(fp32_to_fp16(0.1f)));
  EXPECT_NE(vr[0], 0.1f);
  EXPECT_EQ(vr[1], 0.0f);
  EXPECT_TRUE(std::isinf(vr[2]));
  EXPECT_EQ(vr[3], 3.0f);
}

TEST(PagedKv, BlocksInAndBytes) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8}) {
    for (int64_t bs : {16, 32, 256}) {
      const PagedKvStorage kv(kLayers, kKvHeads, kHeadDim, 3, bs, t);
      // q8_0: a code per element and a float scale per (slot, KV head) row.
      const int64_t per_block =
          t == KvType::kQ8 ? 2 * kLayers * bs * (kRow + 4 * kKvHeads)
                           : 2 * kLayers * bs * kRow * static_cast<int64_t>(kv_type_bytes(t));
      EXPECT_EQ(kv.block_bytes(), per_block) << kv_type_name(t) << " bs " << bs;
      EXPECT_EQ(kv.bytes(), 3 * per_block);
      auto in = [&](int64_t bytes) {
        return PagedKvStorage::blocks_in(bytes, kLayers, kKvHeads, kHeadDim, bs, t);
      };
      EXPECT_EQ(in(0), 0);
      EXPECT_EQ(in(-5), 0);
      EXPECT_EQ(in(per_block - 1), 0);
      EXPECT_EQ(in(per_block), 1);
      EXPECT_EQ(in(7 * per_block + per_block / 2), 7);
      EXPECT_EQ(in(kv.bytes()), 3);
      EXPECT_EQ(in(INT64_MAX), INT32_MAX);  // clamped
    }
  }
  // An f16 block is half an f32 one; SmolLM2-135M's shape (30 layers, 3 KV heads of 64).
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(PagedKvStorage::blocks_in(gib, 30, 3, 64, 16, KvType::kF16),
            static_cast<int32_t>(gib / (2 * 30 * 16 * 3 * 64 * 2)));
  EXPECT_EQ(PagedKvStorage::blocks_in(gib, 30, 3, 64, 16, KvType::kF16),
            2 * PagedKvStorage::blocks_in(gib, 30, 3, 64, 16, KvType::kF32));
  // q8_0: 68 bytes per head row of 64 instead of 128.
  EXPECT_EQ(PagedKvStorage::blocks_in(gib, 30, 3, 64, 16, KvType::kQ8),
            static_cast<int32_t>(gib / (2 * 30 * 16 * 3 * 68)));
}

// --- KvView / kv_run ----------------------------------------------------------------------------

struct RunSeen {
  int64_t offset;
  KvRun run;
};

std::vector<RunSeen> runs_of(const KvView& view, int64_t slot, int64_t n) {
  std::vector<RunSeen> out;
  for_kv_runs(view, slot, n, [&](int64_t offset, const KvRun& run) {
    out.push_back({offset, run});
  });
  return out;
}

TEST(KvView, ConsecutiveBlocksMergeIntoOneRun) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8}) {
    const int64_t bs = 16;
    PagedKvStorage kv(1, kKvHeads, kHeadDim, 12, bs, t);
    const std::vector<int32_t> table = {4, 5, 6, 2, 9, 10, 3};
    const KvView view = kv.view(0, table.data());
    const int64_t kb = view.k_block_bytes, vb = view.v_block_bytes;
    EXPECT_EQ(kb, bs * kRow * static_cast<int64_t>(kv_type_bytes(t)));
    EXPECT_EQ(vb, kb);

    // From slot 0: blocks 4, 5, 6 are one run of 48 slots.
    KvRun r = kv_run(view, 0, 7 * bs);
    EXPECT_EQ(r.k, view.k + 4 * kb);
    EXPECT_EQ(r.v, view.v + 4 * vb);
    EXPECT_EQ(r.local, 0);
    EXPECT_EQ(r.n, 48);
    // From inside block 5: the run goes on through block 6, addressed from block 5.
    r = kv_run(view, 20, 100);
    EXPECT_EQ(r.k, view.k + 5 * kb);
    EXPECT_EQ(r.local, 4);
    EXPECT_EQ(r.n, 28);
    // At most n slots.
    r = kv_run(view, 20, 3);
    EXPECT_EQ(r.n, 3);
    EXPECT_EQ(r.local, 4);
    r = kv_run(view, 5, 30);  // 4 -> 5 merged, stops at n
    EXPECT_EQ(r.k, view.k + 4 * kb);
    EXPECT_EQ(r.local, 5);
    EXPECT_EQ(r.n, 30);

    // All slots: runs {4,5,6}, {2}, {9,10}, {3}.
    const std::vector<RunSeen> all = runs_of(view, 0, 7 * bs);
    ASSERT_EQ(all.size(), 4u);
    const int32_t first_block[] = {4, 2, 9, 3};
    const int64_t offsets[] = {0, 48, 64, 96};
    const int64_t lengths[] = {48, 16, 32, 16};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(all[i].offset, offsets[i]) << "run " << i;
      EXPECT_EQ(all[i].run.k, view.k + first_block[i] * kb) << "run " << i;
      EXPECT_EQ(all[i].run.v, view.v + first_block[i] * vb) << "run " << i;
      if (t == KvType::kQ8) {  // the scales of the run's first block
        EXPECT_EQ(all[i].run.k_scale, view.k_scale + first_block[i] * kKvHeads * bs) << i;
        EXPECT_EQ(all[i].run.v_scale, view.v_scale + first_block[i] * kKvHeads * bs) << i;
      } else {
        EXPECT_EQ(all[i].run.k_scale, nullptr);
      }
      EXPECT_EQ(all[i].run.local, 0) << "run " << i;
      EXPECT_EQ(all[i].run.n, lengths[i]) << "run " << i;
    }
    // A range starting and ending inside blocks.
    const std::vector<RunSeen> mid = runs_of(view, 40, 40);  // slots 40..79
    ASSERT_EQ(mid.size(), 3u);
    EXPECT_EQ(mid[0].run.k, view.k + 6 * kb);  // from the range's first block
    EXPECT_EQ(mid[0].run.local, 8);
    EXPECT_EQ(mid[0].run.n, 8);
    EXPECT_EQ(mid[1].offset, 8);
    EXPECT_EQ(mid[1].run.k, view.k + 2 * kb);
    EXPECT_EQ(mid[1].run.n, 16);
    EXPECT_EQ(mid[2].offset, 24);
    EXPECT_EQ(mid[2].run.k, view.k + 9 * kb);
    EXPECT_EQ(mid[2].run.local, 0);
    EXPECT_EQ(mid[2].run.n, 16);
  }
}

// for_run_scales gives each slot of a run the scale of its (block, KV head), block by block,
// for a run over three consecutive blocks entered and left inside blocks.
TEST(KvView, RunScalesFollowTheBlocks) {
  const int64_t bs = 16;
  PagedKvStorage kv(2, kKvHeads, kHeadDim, 8, bs, KvType::kQ8);
  const std::vector<int32_t> table = {3, 4, 5, 0};
  // Row (slot s, head h) of layer 1 holds the value 100 s + h + 1 in every dim, so its scale is
  // (100 s + h + 1) / 127.
  const int64_t n = 3 * bs;
  std::vector<float> rows(static_cast<size_t>(n * kRow));
  for (int64_t sl = 0; sl < n; ++sl) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) rows[sl * kRow + h * kHeadDim + d] = 100.0f * sl + h + 1;
    }
  }
  kv.write(1, table, 0, n, rows.data(), rows.data());
  const KvView view = kv.view(1, table.data());
  const KvRun run = kv_run(view, 5, 40);  // slots 5 .. 44 over blocks 3, 4, 5
  ASSERT_EQ(run.n, 40);
  ASSERT_EQ(run.local, 5);
  for (int h = 0; h < kKvHeads; ++h) {
    int64_t seen = 0;
    for_run_scales(view, run.k_scale, run, h, [&](int64_t j, const float* d, int64_t count) {
      EXPECT_EQ(j, seen);
      EXPECT_LE(count, bs);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t slot = 5 + j + i;
        EXPECT_EQ(d[i], (100.0f * slot + h + 1) / 127.0f) << "slot " << slot << " head " << h;
      }
      seen += count;
    });
    EXPECT_EQ(seen, 40);
  }
}

TEST(KvView, NonConsecutiveBlocksSplit) {
  const int64_t bs = 32;
  PagedKvStorage kv(1, kKvHeads, kHeadDim, kBlocks, bs, KvType::kF16);
  const KvView view = kv.view(0, kTable.data());  // {5, 2, 7, 3}: no two consecutive
  const std::vector<RunSeen> runs = runs_of(view, 3, 4 * bs - 3);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].run.local, 3);
  EXPECT_EQ(runs[0].run.n, bs - 3);
  int64_t covered = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].offset, covered);
    EXPECT_EQ(runs[i].run.k, view.k + kTable[i] * view.k_block_bytes);
    if (i > 0) {
      EXPECT_EQ(runs[i].run.local, 0);
    }
    covered += runs[i].run.n;
  }
  EXPECT_EQ(covered, 4 * bs - 3);
  // Descending neighbours (3, 2) are not one run either.
  const std::vector<int32_t> down = {3, 2};
  EXPECT_EQ(runs_of(kv.view(0, down.data()), 0, 2 * bs).size(), 2u);
  const std::vector<int32_t> up = {2, 3};
  EXPECT_EQ(runs_of(kv.view(0, up.data()), 0, 2 * bs).size(), 1u);
}

// A run's memory is the storage's: slot (offset + i) of the range is row local + i from run.k /
// run.v (f32 rows), as read() returns it.
TEST(KvView, RunsAddressTheStoredRows) {
  std::mt19937 gen(4);
  const int64_t bs = 16;
  PagedKvStorage kv(2, kKvHeads, kHeadDim, 12, bs, KvType::kF32);
  const std::vector<int32_t> table = {7, 8, 1, 2, 3, 11};
  const int64_t n = static_cast<int64_t>(table.size()) * bs;
  const std::vector<float> k = random_rows(gen, n), v = random_rows(gen, n);
  kv.write(1, table, 0, n, k.data(), v.data());
  const KvView view = kv.view(1, table.data());
  const int64_t first = 9, count = n - 15;
  int64_t seen = 0;
  for_kv_runs(view, first, count, [&](int64_t offset, const KvRun& run) {
    EXPECT_EQ(offset, seen);
    for (int64_t i = 0; i < run.n; ++i) {
      const float* kr = reinterpret_cast<const float*>(run.k) + (run.local + i) * kRow;
      const float* vr = reinterpret_cast<const float*>(run.v) + (run.local + i) * kRow;
      const int64_t s = first + offset + i;
      for (int64_t e = 0; e < kRow; ++e) {
        ASSERT_EQ(kr[e], k[s * kRow + e]) << "slot " << s;
        ASSERT_EQ(vr[e], v[s * kRow + e]) << "slot " << s;
      }
    }
    seen += run.n;
  });
  EXPECT_EQ(seen, count);
}

TEST(KvView, ContiguousViewIsOneRun) {
  std::vector<float> k(100 * kRow), v(100 * kRow);
  const KvView view = KvView::contiguous(k.data(), v.data(), KvType::kF32, 100);
  EXPECT_EQ(view.table, nullptr);
  EXPECT_EQ(view.block_slots, 112);  // whole K tiles
  const std::vector<RunSeen> runs = runs_of(view, 7, 93);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].offset, 0);
  EXPECT_EQ(runs[0].run.k, reinterpret_cast<const uint8_t*>(k.data()));
  EXPECT_EQ(runs[0].run.v, reinterpret_cast<const uint8_t*>(v.data()));
  EXPECT_EQ(runs[0].run.local, 7);
  EXPECT_EQ(runs[0].run.n, 93);
  EXPECT_EQ(KvView::contiguous(k.data(), v.data(), KvType::kF16, 0).block_slots, 16);
}

// Negative control of the layout checks above: swapping two blocks of the table moves the rows.
TEST(PagedKv, SwappedTableReadsOtherRows) {
  std::mt19937 gen(5);
  PagedKvStorage kv(1, kKvHeads, kHeadDim, kBlocks, 16, KvType::kF16);
  const int64_t n = static_cast<int64_t>(kTable.size()) * 16;
  const std::vector<float> k = random_rows(gen, n), v = random_rows(gen, n);
  kv.write(0, kTable, 0, n, k.data(), v.data());
  std::vector<int32_t> swapped = kTable;
  std::swap(swapped[1], swapped[2]);
  const Rows a = read_all(kv, 0, kTable), b = read_all(kv, 0, swapped);
  int64_t differ = 0;
  for (size_t e = 0; e < a.k.size(); ++e) differ += a.k[e] != b.k[e];
  EXPECT_GT(differ, 0);
  for (int64_t e = 0; e < 16 * kRow; ++e) {
    EXPECT_EQ(a.k[16 * kRow + e], b.k[32 * kRow + e]);  // block 2 is now table entry 2
  }
}

TEST(PagedKvDeathTest, OutOfRangeStops) {
  PagedKvStorage kv(kLayers, kKvHeads, kHeadDim, kBlocks, 16, KvType::kF16);
  std::vector<float> rows(2 * kRow, 1.0f);
  EXPECT_DEATH(kv.write(0, kTable, 4 * 16 - 1, 2, rows.data(), rows.data()),
               "outside the sequence's blocks");
  EXPECT_DEATH(kv.read(kLayers, kTable, 0, 1, rows.data(), nullptr),
               "outside the sequence's blocks");
  EXPECT_DEATH(kv.copy_slot(kTable, 0, 4 * 16), "outside the sequence's blocks");
  EXPECT_DEATH(PagedKvStorage(1, 1, 8, 4, 24), "multiple of 16");
}

}  // namespace
}  // namespace specdec
