// Attention over a paged KV cache: for every variant the machine supports, f16, f32 and q8_0
// caches, decode (1 new token), verification (8, causal and tree masks) and prefill (100) over 0 to
// 513 cached slots, GQA groups of 2 and 4, head_dim 64 and 48, one and two threads, attention
// through a block table - a random permutation of blocks of 16 or 32 slots, or a table of short
// runs of consecutive blocks - gives bitwise the output of attention over a contiguous KvCache
// holding the same K/V. The blocks outside the table, the unused slots and the other layer hold
// NaN, so a read of anything the table does not name shows. Each output is also checked against a
// naive double attention over the stored values (tolerance as test_ops.cpp), and a table with two
// blocks swapped must change the output (the comparison can fail).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16
#include "backend/cpu/thread_pool.h"
#include "common/attention_cases.h"
#include "kv/kv_cache.h"
#include "kv/paged_kv.h"

namespace specdec {
namespace {

// Unit roundoff of float.
constexpr double kU = FLT_EPSILON / 2;

using test::attention_naive;
using test::attention_variants;
using test::first_bitwise_difference;
using test::make_shape;
using test::random_vector;
using test::tree_mask;

// --- block tables --------------------------------------------------------------------------------

enum class Layout {
  kPermuted16,  // a random choice of blocks of 16 slots in random order
  kPermuted32,  // the same with blocks of 32 slots
  kRuns16,      // runs of 1-3 consecutive blocks of 16, the runs in random order
};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kPermuted16:
      return "permuted/16";
    case Layout::kPermuted32:
      return "permuted/32";
    case Layout::kRuns16:
      return "runs/16";
  }
  return "?";
}

int64_t layout_block_slots(Layout l) {
  return l == Layout::kPermuted32 ? 32 : 16;
}

struct Table {
  std::vector<int32_t> blocks;  // the sequence's block table
  int32_t n_blocks = 0;         // blocks in the storage
};

Table make_table(Layout layout, int64_t n_slots, std::mt19937& gen) {
  const int64_t bs = layout_block_slots(layout);
  const auto needed = static_cast<int32_t>((n_slots + bs - 1) / bs);
  Table t;
  if (layout != Layout::kRuns16) {
    t.n_blocks = 2 * needed + 3;
    std::vector<int32_t> ids(static_cast<size_t>(t.n_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), gen);
    t.blocks.assign(ids.begin(), ids.begin() + needed);
    return t;
  }
  // Groups of 3 consecutive ids, in random order; from each a run of its first 1-3 ids.
  const int32_t n_groups = needed + 1;
  t.n_blocks = 3 * n_groups;
  std::vector<int32_t> groups(static_cast<size_t>(n_groups));
  std::iota(groups.begin(), groups.end(), 0);
  std::shuffle(groups.begin(), groups.end(), gen);
  std::uniform_int_distribution<int> run_len(1, 3);
  for (int32_t g : groups) {
    const int len = run_len(gen);
    for (int i = 0; i < len && static_cast<int32_t>(t.blocks.size()) < needed; ++i) {
      t.blocks.push_back(3 * g + i);
    }
  }
  return t;
}

// --- the comparison ------------------------------------------------------------------------------

// The inputs of one case and a paged storage holding its K/V in layer 1 through a table.
struct PagedInputs {
  PagedKvStorage storage;
  Table table;
};

// A paged storage for the case's K/V (k, v: [n_kv, kv_row] floats): every slot of every block
// of both layers NaN first, then the rows written into layer 1 through the table, the cached
// prefix and the new tokens in two writes (as a forward pass does).
PagedInputs make_paged(const AttentionShape& s, KvType type, Layout layout,
                       const std::vector<float>& k, const std::vector<float>& v,
                       std::mt19937& gen) {
  const int64_t n_kv = s.n_past + s.n_new;
  const int64_t bs = layout_block_slots(layout);
  Table table = make_table(layout, n_kv, gen);
  PagedKvStorage storage(2, s.n_kv_heads, s.head_dim, table.n_blocks, bs, type);
  const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  std::vector<int32_t> every(static_cast<size_t>(table.n_blocks));
  std::iota(every.begin(), every.end(), 0);
  const std::vector<float> nan_rows(static_cast<size_t>(table.n_blocks * bs * kv_row), NAN);
  for (int l = 0; l < 2; ++l) {
    storage.write(l, every, 0, table.n_blocks * bs, nan_rows.data(), nan_rows.data());
  }
  storage.write(1, table.blocks, 0, s.n_past, k.data(), v.data());
  storage.write(1, table.blocks, s.n_past, s.n_new, k.data() + s.n_past * kv_row,
                v.data() + s.n_past * kv_row);
  return {std::move(storage), std::move(table)};
}

struct Case {
  AttentionShape s;
  bool tree = false;  // a tree mask over the new tokens (else causal)
};

std::string describe(Isa isa, KvType type, const Case& c) {
  return std::string(isa_name(isa)) + " " + kv_type_name(type) + " n_past " +
         std::to_string(c.s.n_past) + " n_new " + std::to_string(c.s.n_new) + " heads " +
         std::to_string(c.s.n_heads) + "/" + std::to_string(c.s.n_kv_heads) + " hd " +
         std::to_string(c.s.head_dim) + (c.tree ? " tree" : " causal");
}

// For each supported variant: attention over the contiguous KvCache (one thread) is the
// reference; attention over each layout's paged storage, with one and two threads, must give the
// same bits; the reference must be within the test_ops.cpp tolerance of the naive double result
// over the stored values.
void check_paged(const Case& c, KvType type, ThreadPool* pool2, std::mt19937& gen) {
  const AttentionShape& s = c.s;
  const int64_t n_kv = s.n_past + s.n_new;
  const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  const int64_t n_out = s.n_new * s.n_heads * s.head_dim;
  const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -1, 1);
  std::vector<float> k = random_vector(gen, n_kv * kv_row, -1, 1);  // [n_kv, kv_row]
  std::vector<float> v = random_vector(gen, n_kv * kv_row, -1, 1);
  const std::vector<uint8_t> mask_bytes = c.tree ? tree_mask(gen, s.n_new) : std::vector<uint8_t>{};
  const uint8_t* mask = mask_bytes.empty() ? nullptr : mask_bytes.data();

  KvCache contiguous(1, s.n_kv_heads, s.head_dim, n_kv, type);
  contiguous.write(0, 0, n_kv, k.data(), v.data());
  contiguous.append(n_kv);
  // The values the caches hold (f16: rounded; q8_0: d · c), for the naive reference. q8_0 applies
  // d to each score and each p instead of to the values: the same products, one more rounding
  // each, within the same tolerance.
  contiguous.read(0, 0, n_kv, k.data(), v.data());
  const std::vector<double> naive = attention_naive(s, q, k, v, mask);
  const double delta = static_cast<double>(s.head_dim) * s.head_dim * kU * s.scale;
  const double tol = 2 * delta + (2.0 * n_kv + 8) * kU;

  std::vector<PagedInputs> paged;
  for (Layout layout : {Layout::kPermuted16, Layout::kPermuted32, Layout::kRuns16}) {
    paged.push_back(make_paged(s, type, layout, k, v, gen));
  }
  const SeqKv whole = contiguous.seq();
  const KvView contiguous_view = whole.storage->view(0, whole.table.data());
  for (Isa isa : attention_variants()) {
    std::vector<float> want(static_cast<size_t>(n_out));
    if (type == KvType::kQ8) {  // no raw-pointer form (its scales live in the storage)
      attention_isa(isa, s, q.data(), contiguous_view, mask, want.data(), nullptr);
    } else {
      attention_isa(isa, s, q.data(), contiguous.k(0), contiguous.v(0), type, mask, want.data(),
                    nullptr);
    }
    for (int64_t e = 0; e < n_out; ++e) {
      ASSERT_NEAR(want[e], naive[e], tol) << describe(isa, type, c) << " contiguous, element " << e;
    }
    for (size_t li = 0; li < paged.size(); ++li) {
      const Layout layout = static_cast<Layout>(li);
      const KvView view = paged[li].storage.view(1, paged[li].table.blocks.data());
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), pool2}) {
        std::vector<float> got(static_cast<size_t>(n_out) + 1, 7.0f);  // + guard
        attention_isa(isa, s, q.data(), view, mask, got.data(), pool);
        const int64_t e = first_bitwise_difference(want.data(), got.data(), n_out);
        ASSERT_EQ(e, -1) << describe(isa, type, c) << " " << layout_name(layout) << " threads "
                         << (pool == nullptr ? 1 : pool->size()) << ": element " << e
                         << " contiguous " << want[e] << " paged " << got[e];
        EXPECT_EQ(got.back(), 7.0f) << "wrote past the end";
      }
    }
  }
}

struct Gqa {
  int n_heads, n_kv_heads, head_dim;
};
const Gqa kGqa[] = {{8, 4, 64}, {8, 2, 64}, {8, 4, 48}, {8, 2, 48}};

void run_cases(int64_t n_new, bool tree, std::initializer_list<int64_t> pasts, uint32_t seed) {
  std::mt19937 gen(seed);
  ThreadPool pool2(2);
  for (KvType type : {KvType::kF16, KvType::kF32, KvType::kQ8}) {
    for (const Gqa& g : kGqa) {
      for (int64_t n_past : pasts) {
        check_paged({make_shape(n_past, n_new, g.n_heads, g.n_kv_heads, g.head_dim), tree}, type,
                    &pool2, gen);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(PagedAttention, DecodeEqualsContiguous) {
  run_cases(1, false, {0, 5, 16, 63, 64, 200, 513}, 1);
}

TEST(PagedAttention, VerifyCausalEqualsContiguous) {
  run_cases(8, false, {0, 5, 16, 63, 64, 200, 513}, 2);
}

TEST(PagedAttention, VerifyTreeEqualsContiguous) {
  run_cases(8, true, {0, 5, 16, 63, 64, 200, 513}, 3);
}

TEST(PagedAttention, PrefillEqualsContiguous) {
  run_cases(100, false, {0, 5, 16, 63, 64, 200, 513}, 4);
}

// The comparisons above can fail: the same storage read through its table with two blocks
// swapped (or through the right table but the other layer) gives other outputs.
TEST(PagedAttention, SwappedBlocksChangeTheOutput) {
  std::mt19937 gen(5);
  ThreadPool pool2(2);
  for (KvType type : {KvType::kF16, KvType::kF32, KvType::kQ8}) {
    for (bool tree : {false, true}) {
      const AttentionShape s = make_shape(200, tree ? 8 : 1, 8, 2, 64);
      const int64_t n_kv = s.n_past + s.n_new;
      const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
      const int64_t n_out = s.n_new * s.n_heads * s.head_dim;
      const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -1, 1);
      const std::vector<float> k = random_vector(gen, n_kv * kv_row, -1, 1);
      const std::vector<float> v = random_vector(gen, n_kv * kv_row, -1, 1);
      const std::vector<uint8_t> mask = tree ? tree_mask(gen, s.n_new) : std::vector<uint8_t>{};
      PagedInputs p = make_paged(s, type, Layout::kPermuted16, k, v, gen);
      for (Isa isa : attention_variants()) {
        std::vector<float> good(static_cast<size_t>(n_out)), bad(good.size());
        const uint8_t* m = mask.empty() ? nullptr : mask.data();
        attention_isa(isa, s, q.data(), p.storage.view(1, p.table.blocks.data()), m, good.data(),
                      &pool2);
        std::vector<int32_t> swapped = p.table.blocks;
        std::swap(swapped[1], swapped[4]);
        attention_isa(isa, s, q.data(), p.storage.view(1, swapped.data()), m, bad.data(), &pool2);
        EXPECT_NE(first_bitwise_difference(good.data(), bad.data(), n_out), -1)
            << isa_name(isa) << " " << kv_type_name(type)
            << ": swapping two blocks changed nothing";
        attention_isa(isa, s, q.data(), p.storage.view(0, p.table.blocks.data()), m, bad.data(),
                      &pool2);
        EXPECT_TRUE(std::isnan(bad[0])) << isa_name(isa) << ": layer 0 holds NaN";
      }
    }
  }
}

// The table layouts are what they claim: the runs layout has both consecutive and
// non-consecutive neighbours, the permuted ones hold distinct ids inside the storage.
TEST(PagedAttention, TableLayouts) {
  std::mt19937 gen(6);
  for (Layout layout : {Layout::kPermuted16, Layout::kPermuted32, Layout::kRuns16}) {
    const Table t = make_table(layout, 613, gen);
    const int64_t bs = layout_block_slots(layout);
    ASSERT_EQ(static_cast<int64_t>(t.blocks.size()), (613 + bs - 1) / bs);
    std::vector<int32_t> sorted = t.blocks;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << layout_name(layout);
    EXPECT_GE(sorted.front(), 0);
    EXPECT_LT(sorted.back(), t.n_blocks);
    int consecutive = 0, split = 0;
    for (size_t i = 1; i < t.blocks.size(); ++i) {
      (t.blocks[i] == t.blocks[i - 1] + 1 ? consecutive : split) += 1;
    }
    EXPECT_GT(split, 0) << layout_name(layout);
    if (layout == Layout::kRuns16) {
      EXPECT_GT(consecutive, 5) << layout_name(layout);
    }
  }
}

}  // namespace
}  // namespace specdec
