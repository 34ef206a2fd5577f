// BlockPool: allocation order and exhaustion, allocate_n all or nothing, refcounts, released
// blocks going to the free list or the LRU list, LRU eviction order, the key formula and its
// chaining, match_prefix (longest prefix, caps, token verification, refs), duplicate
// registration, the cache switched off, statistics, misuse stopping, and a randomized run against
// a reference model with check_invariants() after every operation.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace specdec {
namespace {

// Keys of the successive whole blocks of `tokens`, chained from kRootKey.
std::vector<uint64_t> chain_keys(std::span<const int32_t> tokens, int32_t block_size) {
  std::vector<uint64_t> keys;
  uint64_t parent = BlockPool::kRootKey;
  for (size_t i = 0; i + block_size <= tokens.size(); i += block_size) {
    parent = BlockPool::block_key(parent, tokens.subspan(i, block_size));
    keys.push_back(parent);
  }
  return keys;
}

// Allocates one block per whole block of `tokens` and registers the chain; returns the blocks.
std::vector<int32_t> allocate_and_register(BlockPool* pool, std::span<const int32_t> tokens) {
  const int32_t bs = pool->block_size();
  std::vector<int32_t> blocks;
  uint64_t parent = BlockPool::kRootKey;
  for (size_t i = 0; i + bs <= tokens.size(); i += bs) {
    const std::optional<int32_t> b = pool->allocate();
    EXPECT_TRUE(b.has_value());
    if (!b) return blocks;
    parent = pool->register_block(*b, parent, tokens.subspan(i, bs));
    blocks.push_back(*b);
  }
  return blocks;
}

void release_all(BlockPool* pool, const std::vector<int32_t>& blocks) {
  for (const int32_t b : blocks) pool->release(b);
}

// --- Allocation and refcounts ------------------------------------------------------------------

TEST(BlockPool, FreshPoolAllocatesInOrderThenRunsOut) {
  BlockPool pool(4, 2);
  EXPECT_EQ(pool.num_blocks(), 4);
  EXPECT_EQ(pool.block_size(), 2);
  EXPECT_TRUE(pool.prefix_cache());
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.num_available(), 4);
  for (int32_t expected = 0; expected < 4; ++expected) {
    const std::optional<int32_t> b = pool.allocate();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(*b, expected);
    EXPECT_EQ(pool.refcount(*b), 1);
    pool.check_invariants();
  }
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.num_used(), 4);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_available(), 0);
  pool.release(2);
  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(2));
  pool.check_invariants();
}

TEST(BlockPool, AllocateNIsAllOrNothing) {
  BlockPool pool(5, 4);
  std::vector<int32_t> out = {99};
  ASSERT_TRUE(pool.allocate_n(3, &out));
  EXPECT_EQ(out, (std::vector<int32_t>{99, 0, 1, 2}));
  EXPECT_FALSE(pool.allocate_n(3, &out));  // only 2 left
  EXPECT_EQ(out, (std::vector<int32_t>{99, 0, 1, 2}));
  EXPECT_EQ(pool.num_available(), 2);
  EXPECT_EQ(pool.num_used(), 3);
  EXPECT_TRUE(pool.allocate_n(0, &out));
  EXPECT_EQ(out.size(), 4u);
  ASSERT_TRUE(pool.allocate_n(2, &out));
  EXPECT_EQ(out, (std::vector<int32_t>{99, 0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.num_available(), 0);
  pool.check_invariants();
}

TEST(BlockPool, AllocateNCountsCachedBlocksAsAvailable) {
  BlockPool pool(3, 1);
  const std::vector<int32_t> t = {7, 8};
  std::vector<int32_t> held = allocate_and_register(&pool, t);  // blocks 0, 1
  release_all(&pool, held);
  EXPECT_EQ(pool.num_cached(), 2);
  std::vector<int32_t> out;
  ASSERT_TRUE(pool.allocate_n(3, &out));  // 1 free + 2 evicted
  EXPECT_EQ(out, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_FALSE(pool.is_registered(0));
  EXPECT_FALSE(pool.is_registered(1));
  pool.check_invariants();
}

TEST(BlockPool, RefcountsCountHolders) {
  BlockPool pool(3, 2);
  const int32_t b = *pool.allocate();
  pool.ref(b);
  pool.ref(b);
  EXPECT_EQ(pool.refcount(b), 3);
  EXPECT_EQ(pool.num_used(), 1);
  pool.release(b);
  pool.release(b);
  EXPECT_EQ(pool.refcount(b), 1);
  EXPECT_EQ(pool.num_used(), 1);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(b);
  EXPECT_EQ(pool.refcount(b), 0);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.num_free(), 3);
  pool.check_invariants();
}

TEST(BlockPool, ReleaseSendsRegisteredBlocksToCacheOthersToFreeList) {
  BlockPool pool(3, 2);
  const int32_t a = *pool.allocate();
  const int32_t b = *pool.allocate();
  const std::vector<int32_t> t = {1, 2};
  pool.register_block(a, BlockPool::kRootKey, t);
  EXPECT_TRUE(pool.is_registered(a));
  EXPECT_FALSE(pool.is_registered(b));
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_TRUE(pool.is_registered(a));  // a cached block keeps its registration
  pool.check_invariants();
  // A free block goes first: the cached one survives two allocations.
  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(b));
  EXPECT_NE(pool.allocate(), std::optional<int32_t>(a));
  EXPECT_TRUE(pool.is_registered(a));
  EXPECT_EQ(pool.num_cached(), 1);
  // Now the cached one is evicted.
  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(a));
  EXPECT_FALSE(pool.is_registered(a));
  EXPECT_EQ(pool.num_cached(), 0);
  pool.check_invariants();
}

TEST(BlockPool, RefOfCachedBlockMakesItUsed) {
  BlockPool pool(2, 2);
  const int32_t a = *pool.allocate();
  const std::vector<int32_t> t = {3, 4};
  pool.register_block(a, BlockPool::kRootKey, t);
  pool.release(a);
  EXPECT_EQ(pool.num_cached(), 1);
  pool.ref(a);
  EXPECT_EQ(pool.refcount(a), 1);
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_used(), 1);
  pool.check_invariants();
  // It is no longer evictable: the pool runs out after the one free block.
  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(1));
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_TRUE(pool.is_registered(a));
}

TEST(BlockPool, EvictsLeastRecentlyReleasedFirst) {
  BlockPool pool(3, 2);
  const std::vector<std::vector<int32_t>> toks = {{10, 11}, {20, 21}, {30, 31}};
  for (int32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(pool.allocate(), std::optional<int32_t>(i));
    pool.register_block(i, BlockPool::kRootKey, toks[i]);
  }
  pool.release(1);
  pool.release(0);
  pool.release(2);
  // Reusing 1 and releasing it again moves it to the most recent end: LRU order is 0, 2, 1.
  pool.ref(1);
  pool.release(1);
  pool.check_invariants();
  std::vector<int32_t> matched;
  uint64_t last_key = 0;

  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(0));
  EXPECT_FALSE(pool.is_registered(0));
  EXPECT_EQ(pool.match_prefix(toks[0], 1, &matched, &last_key), 0);  // its key is gone
  EXPECT_EQ(last_key, BlockPool::kRootKey);
  EXPECT_TRUE(pool.is_registered(1));
  EXPECT_TRUE(pool.is_registered(2));
  pool.check_invariants();

  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(2));
  EXPECT_EQ(pool.match_prefix(toks[2], 1, &matched, &last_key), 0);
  EXPECT_TRUE(pool.is_registered(1));

  EXPECT_EQ(pool.allocate(), std::optional<int32_t>(1));
  EXPECT_EQ(pool.match_prefix(toks[1], 1, &matched, &last_key), 0);
  EXPECT_TRUE(matched.empty());
  EXPECT_EQ(pool.allocate(), std::nullopt);
  pool.check_invariants();
}

TEST(BlockPool, EvictedBlockCanBeRegisteredAgain) {
  BlockPool pool(1, 2);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  pool.register_block(*pool.allocate(), BlockPool::kRootKey, a);
  pool.release(0);
  ASSERT_EQ(pool.allocate(), std::optional<int32_t>(0));  // evicts a
  pool.register_block(0, BlockPool::kRootKey, b);
  pool.release(0);
  pool.check_invariants();
  std::vector<int32_t> matched;
  uint64_t last_key;
  EXPECT_EQ(pool.match_prefix(a, 1, &matched, &last_key), 0);
  EXPECT_EQ(pool.match_prefix(b, 1, &matched, &last_key), 1);
  EXPECT_EQ(matched, std::vector<int32_t>{0});
  pool.check_invariants();
}

// --- Keys --------------------------------------------------------------------------------------

TEST(BlockPool, BlockKeyIsXxh3OfTokensSeededWithParent) {
  const std::vector<int32_t> t = {1, 2, 3, 4};
  EXPECT_EQ(BlockPool::block_key(BlockPool::kRootKey, t),
            XXH3_64bits_withSeed(t.data(), t.size() * sizeof(int32_t), BlockPool::kRootKey));
  EXPECT_EQ(BlockPool::block_key(12345, t),
            XXH3_64bits_withSeed(t.data(), t.size() * sizeof(int32_t), 12345));
  EXPECT_NE(BlockPool::block_key(BlockPool::kRootKey, t), BlockPool::block_key(12345, t));
  const std::vector<int32_t> u = {1, 2, 3, 5};
  EXPECT_NE(BlockPool::block_key(BlockPool::kRootKey, t),
            BlockPool::block_key(BlockPool::kRootKey, u));
}

TEST(BlockPool, RegisterReturnsChainedKey) {
  BlockPool pool(2, 2);
  const std::vector<int32_t> t = {5, 6, 7, 8};
  const std::vector<uint64_t> keys = chain_keys(t, 2);
  const int32_t a = *pool.allocate(), b = *pool.allocate();
  EXPECT_EQ(pool.register_block(a, BlockPool::kRootKey, std::span(t).subspan(0, 2)), keys[0]);
  EXPECT_EQ(pool.register_block(b, keys[0], std::span(t).subspan(2, 2)), keys[1]);
  EXPECT_NE(keys[1], BlockPool::block_key(BlockPool::kRootKey, std::span(t).subspan(2, 2)));
}

// --- match_prefix ------------------------------------------------------------------------------

TEST(BlockPool, MatchFindsLongestRegisteredPrefix) {
  BlockPool pool(8, 4);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<int32_t> held = allocate_and_register(&pool, t);  // blocks 0, 1, 2
  ASSERT_EQ(held, (std::vector<int32_t>{0, 1, 2}));
  release_all(&pool, held);
  EXPECT_EQ(pool.num_cached(), 3);
  const std::vector<uint64_t> keys = chain_keys(t, 4);

  // The whole prefix, with a partial block after it that is never matched.
  std::vector<int32_t> query = t;
  query.insert(query.end(), {13, 14});
  std::vector<int32_t> matched = {42};
  uint64_t last_key = 0;
  EXPECT_EQ(pool.match_prefix(query, 100, &matched, &last_key), 3);
  EXPECT_EQ(matched, (std::vector<int32_t>{42, 0, 1, 2}));  // appended
  EXPECT_EQ(last_key, keys[2]);
  for (const int32_t b : held) EXPECT_EQ(pool.refcount(b), 1);
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_used(), 3);
  pool.check_invariants();

  // Diverging inside block 2 stops at 2 blocks; a second holder on each.
  query = t;
  query[9] = 99;
  matched.clear();
  EXPECT_EQ(pool.match_prefix(query, 100, &matched, &last_key), 2);
  EXPECT_EQ(matched, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(last_key, keys[1]);
  EXPECT_EQ(pool.refcount(0), 2);
  EXPECT_EQ(pool.refcount(1), 2);
  EXPECT_EQ(pool.refcount(2), 1);

  // Block 2 cut short: only two whole blocks to look at.
  query.assign(t.begin(), t.end() - 1);
  matched.clear();
  EXPECT_EQ(pool.match_prefix(query, 100, &matched, &last_key), 2);
  EXPECT_EQ(last_key, keys[1]);

  // Diverging in block 0: nothing.
  query = t;
  query[0] = 0;
  matched.clear();
  EXPECT_EQ(pool.match_prefix(query, 100, &matched, &last_key), 0);
  EXPECT_TRUE(matched.empty());
  EXPECT_EQ(last_key, BlockPool::kRootKey);
  pool.check_invariants();
}

TEST(BlockPool, MatchStopsAtMaxBlocks) {
  BlockPool pool(4, 2);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6};
  release_all(&pool, allocate_and_register(&pool, t));
  const std::vector<uint64_t> keys = chain_keys(t, 2);
  std::vector<int32_t> matched;
  uint64_t last_key = 0;
  EXPECT_EQ(pool.match_prefix(t, 2, &matched, &last_key), 2);
  EXPECT_EQ(matched, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(last_key, keys[1]);
  EXPECT_EQ(pool.refcount(2), 0);
  EXPECT_EQ(pool.num_cached(), 1);
  matched.clear();
  last_key = 0;
  EXPECT_EQ(pool.match_prefix(t, 0, &matched, &last_key), 0);
  EXPECT_TRUE(matched.empty());
  EXPECT_EQ(last_key, BlockPool::kRootKey);
  pool.check_invariants();
}

TEST(BlockPool, SameTokensAfterDifferentPrefixDoNotMatch) {
  BlockPool pool(4, 2);
  const std::vector<int32_t> ab = {1, 1, 2, 2};  // blocks A, B
  const std::vector<int32_t> cb = {3, 3, 2, 2};  // blocks C, B
  const std::vector<int32_t> b_first = {2, 2};
  release_all(&pool, allocate_and_register(&pool, ab));
  std::vector<int32_t> matched;
  uint64_t last_key;
  EXPECT_EQ(pool.match_prefix(cb, 10, &matched, &last_key), 0);
  EXPECT_EQ(pool.match_prefix(b_first, 10, &matched, &last_key), 0);  // B is not a first block
  // With C registered too, [C, B] finds C and stops: the B held is A's child.
  const int32_t c = *pool.allocate();
  pool.register_block(c, BlockPool::kRootKey, std::span(cb).subspan(0, 2));
  pool.release(c);
  EXPECT_EQ(pool.match_prefix(cb, 10, &matched, &last_key), 1);
  EXPECT_EQ(matched, std::vector<int32_t>{c});
  EXPECT_EQ(last_key, BlockPool::block_key(BlockPool::kRootKey, std::span(cb).subspan(0, 2)));
  pool.check_invariants();
}

TEST(BlockPool, MatchComparesTokensNotOnlyKeys) {
  // A collision cannot be forged; check instead that every token of a block takes part: a prefix
  // differing in any single token of a registered block is never matched.
  BlockPool pool(2, 8);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  release_all(&pool, allocate_and_register(&pool, t));
  for (size_t i = 0; i < t.size(); ++i) {
    std::vector<int32_t> query = t;
    query[i] += 1000;
    std::vector<int32_t> matched;
    uint64_t last_key = 0;
    EXPECT_EQ(pool.match_prefix(query, 1, &matched, &last_key), 0) << "token " << i;
    EXPECT_EQ(last_key, BlockPool::kRootKey);
  }
  std::vector<int32_t> matched;
  uint64_t last_key = 0;
  EXPECT_EQ(pool.match_prefix(t, 1, &matched, &last_key), 1);
  pool.check_invariants();
}

TEST(BlockPool, DuplicateRegistrationKeepsFirstBlock) {
  BlockPool pool(3, 2);
  const std::vector<int32_t> t = {4, 2};
  const int32_t a = *pool.allocate(), b = *pool.allocate();
  const uint64_t key_a = pool.register_block(a, BlockPool::kRootKey, t);
  const uint64_t key_b = pool.register_block(b, BlockPool::kRootKey, t);
  EXPECT_EQ(key_a, key_b);
  EXPECT_TRUE(pool.is_registered(a));
  EXPECT_FALSE(pool.is_registered(b));
  // Registering a block twice is a no-op.
  EXPECT_EQ(pool.register_block(a, BlockPool::kRootKey, t), key_a);
  EXPECT_TRUE(pool.is_registered(a));
  pool.check_invariants();
  pool.release(b);  // unregistered: free, not cached
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_cached(), 1);
  std::vector<int32_t> matched;
  uint64_t last_key;
  EXPECT_EQ(pool.match_prefix(t, 1, &matched, &last_key), 1);
  EXPECT_EQ(matched, std::vector<int32_t>{a});
  pool.check_invariants();
}

TEST(BlockPool, PrefixCacheOffRegistersAndMatchesNothing) {
  BlockPool pool(2, 2, /*prefix_cache=*/false);
  EXPECT_FALSE(pool.prefix_cache());
  const std::vector<int32_t> t = {1, 2};
  const int32_t a = *pool.allocate();
  EXPECT_EQ(pool.register_block(a, BlockPool::kRootKey, t),
            BlockPool::block_key(BlockPool::kRootKey, t));
  EXPECT_FALSE(pool.is_registered(a));
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_cached(), 0);
  std::vector<int32_t> matched = {7};
  uint64_t last_key = 0;
  EXPECT_EQ(pool.match_prefix(t, 1, &matched, &last_key), 0);
  EXPECT_EQ(matched, std::vector<int32_t>{7});
  EXPECT_EQ(last_key, BlockPool::kRootKey);
  EXPECT_EQ(pool.refcount(a), 0);
  EXPECT_EQ(pool.num_queries(), 0);  // the cache was not consulted
  pool.check_invariants();
}

TEST(BlockPool, StatsCountQueriesAskedAndHits) {
  BlockPool pool(8, 2);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6};
  release_all(&pool, allocate_and_register(&pool, t));
  EXPECT_EQ(pool.num_queries(), 0);
  std::vector<int32_t> matched;
  uint64_t last_key;
  std::vector<int32_t> query = t;
  query.insert(query.end(), {7, 8, 9});                // 4 whole blocks + 1 token
  pool.match_prefix(query, 100, &matched, &last_key);  // asks 4, finds 3
  EXPECT_EQ(pool.num_queries(), 1);
  EXPECT_EQ(pool.num_blocks_queried(), 4);
  EXPECT_EQ(pool.num_blocks_hit(), 3);
  pool.match_prefix(query, 2, &matched, &last_key);  // asks 2, finds 2
  EXPECT_EQ(pool.num_queries(), 2);
  EXPECT_EQ(pool.num_blocks_queried(), 6);
  EXPECT_EQ(pool.num_blocks_hit(), 5);
  const std::vector<int32_t> miss = {9, 9, 9, 9};
  pool.match_prefix(miss, 100, &matched, &last_key);  // asks 2, finds 0
  const std::vector<int32_t> short_query = {1};
  pool.match_prefix(short_query, 100, &matched, &last_key);  // asks 0
  EXPECT_EQ(pool.num_queries(), 4);
  EXPECT_EQ(pool.num_blocks_queried(), 8);
  EXPECT_EQ(pool.num_blocks_hit(), 5);
}

// --- Misuse ------------------------------------------------------------------------------------

TEST(BlockPoolDeathTest, MisuseStops) {
  BlockPool pool(2, 2);
  const std::vector<int32_t> t = {1, 2}, too_short = {1};
  EXPECT_DEATH(pool.release(0), "release of a block with refcount 0");
  EXPECT_DEATH(pool.ref(0), "ref of a free block");
  EXPECT_DEATH(pool.register_block(0, BlockPool::kRootKey, t), "not used");
  EXPECT_DEATH(pool.ref(2), "outside the pool");
  EXPECT_DEATH(pool.refcount(-1), "outside the pool");
  const int32_t a = *pool.allocate();
  EXPECT_DEATH(pool.register_block(a, BlockPool::kRootKey, too_short), "block_size tokens");
  pool.register_block(a, BlockPool::kRootKey, t);
  const std::vector<int32_t> other = {2, 1};
  EXPECT_DEATH(pool.register_block(a, BlockPool::kRootKey, other), "different prefix");
  pool.release(a);
  EXPECT_DEATH(pool.release(a), "release of a block with refcount 0");
  EXPECT_DEATH(BlockPool(0, 2), "n_blocks");
  EXPECT_DEATH(BlockPool(2, 0), "block_size");
}

// --- Randomized, against a reference model ------------------------------------------------------

// What the pool should hold: refcounts, registrations and the LRU order, kept the obvious way.
struct Model {
  explicit Model(int32_t n)
      : refcount(n, 0), registered(n, false), key(n, 0), parent(n, 0), tokens(n) {}
  std::vector<int32_t> refcount;             // [n_blocks]
  std::vector<bool> registered;              // [n_blocks]
  std::vector<uint64_t> key;                 // [n_blocks]
  std::vector<uint64_t> parent;              // [n_blocks]
  std::vector<std::vector<int32_t>> tokens;  // [n_blocks][block_size]
  std::map<uint64_t, int32_t> by_key;
  std::vector<int32_t> lru;  // cached blocks, least recent first
  int64_t n_queries = 0, n_blocks_queried = 0, n_blocks_hit = 0;

  int32_t num_free() const {
    int32_t n = 0;
    for (size_t b = 0; b < refcount.size(); ++b) n += refcount[b] == 0 && !registered[b];
    return n;
  }
  void take(int32_t b) {  // one more holder
    if (refcount[b] == 0) lru.erase(std::find(lru.begin(), lru.end(), b));
    ++refcount[b];
  }
  void drop(int32_t b) {  // one holder fewer
    if (--refcount[b] == 0 && registered[b]) lru.push_back(b);
  }
  void unregister(int32_t b) {
    by_key.erase(key[b]);
    registered[b] = false;
  }
};

void expect_pool_matches_model(const BlockPool& pool, const Model& m) {
  pool.check_invariants();
  for (int32_t b = 0; b < pool.num_blocks(); ++b) {
    ASSERT_EQ(pool.refcount(b), m.refcount[b]) << "block " << b;
    ASSERT_EQ(pool.is_registered(b), m.registered[b]) << "block " << b;
  }
  ASSERT_EQ(pool.num_free(), m.num_free());
  ASSERT_EQ(pool.num_cached(), static_cast<int32_t>(m.lru.size()));
  ASSERT_EQ(pool.num_used(), pool.num_blocks() - m.num_free() - static_cast<int32_t>(m.lru.size()));
  ASSERT_EQ(pool.num_queries(), m.n_queries);
  ASSERT_EQ(pool.num_blocks_queried(), m.n_blocks_queried);
  ASSERT_EQ(pool.num_blocks_hit(), m.n_blocks_hit);
}

class BlockPoolRandomTest : public ::testing::TestWithParam<bool> {};

TEST_P(BlockPoolRandomTest, AgreesWithReferenceModel) {
  const bool prefix_cache = GetParam();
  constexpr int32_t kBlocks = 8, kBlockSize = 2, kOps = 4000;
  int64_t n_evictions = 0, n_duplicates = 0, n_deep_matches = 0;
  for (const uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 gen(seed);
    auto uniform = [&gen](int32_t lo, int32_t hi) {  // [lo, hi]
      return std::uniform_int_distribution<int32_t>(lo, hi)(gen);
    };
    // Tokens from {0, 1}: 4 possible blocks, so prefixes are shared often.
    auto random_tokens = [&](int32_t n) {
      std::vector<int32_t> v(n);
      for (int32_t& x : v) x = uniform(0, 1);
      return v;
    };
    BlockPool pool(kBlocks, kBlockSize, prefix_cache);
    Model m(kBlocks);
    std::vector<int32_t> held;  // one entry per reference taken
    for (int op = 0; op < kOps; ++op) {
      SCOPED_TRACE(testing::Message() << "op " << op);
      const int32_t kind = uniform(0, 15);
      if (kind < 3) {  // allocate
        const int32_t n_free = m.num_free();
        const std::optional<int32_t> b = pool.allocate();
        if (n_free == 0 && m.lru.empty()) {
          ASSERT_EQ(b, std::nullopt);
        } else {
          ASSERT_TRUE(b.has_value());
          ASSERT_EQ(m.refcount[*b], 0);
          if (n_free > 0) {
            ASSERT_FALSE(m.registered[*b]) << "evicted while a free block was left";
          } else {
            ASSERT_EQ(*b, m.lru.front()) << "not the least recently released";
            m.lru.erase(m.lru.begin());
            m.unregister(*b);
            ++n_evictions;
          }
          m.refcount[*b] = 1;
          held.push_back(*b);
        }
      } else if (kind < 4) {  // another holder of a held block
        if (held.empty()) continue;
        const int32_t b = held[uniform(0, static_cast<int32_t>(held.size()) - 1)];
        pool.ref(b);
        m.take(b);
        held.push_back(b);
      } else if (kind < 5) {  // reuse a cached block
        if (m.lru.empty()) continue;
        const int32_t b = m.lru[uniform(0, static_cast<int32_t>(m.lru.size()) - 1)];
        pool.ref(b);
        m.take(b);
        held.push_back(b);
      } else if (kind < 10) {  // release
        if (held.empty()) continue;
        const size_t i = uniform(0, static_cast<int32_t>(held.size()) - 1);
        const int32_t b = held[i];
        held[i] = held.back();
        held.pop_back();
        pool.release(b);
        m.drop(b);
      } else if (kind < 13) {  // register a held block
        if (held.empty()) continue;
        const int32_t b = held[uniform(0, static_cast<int32_t>(held.size()) - 1)];
        if (m.registered[b]) {  // again, the same way: a no-op
          ASSERT_EQ(pool.register_block(b, m.parent[b], m.tokens[b]), m.key[b]);
        } else {
          // After the root, or after a registered block, so that chains form.
          uint64_t parent = BlockPool::kRootKey;
          if (!m.by_key.empty() && uniform(0, 2) > 0) {
            auto it = m.by_key.begin();
            std::advance(it, uniform(0, static_cast<int32_t>(m.by_key.size()) - 1));
            parent = it->first;
          }
          const std::vector<int32_t> t = random_tokens(kBlockSize);
          const uint64_t key = pool.register_block(b, parent, t);
          ASSERT_EQ(key, BlockPool::block_key(parent, t));
          if (!prefix_cache) {
            // nothing
          } else if (m.by_key.count(key) > 0) {
            ++n_duplicates;
          } else {
            m.registered[b] = true;
            m.key[b] = key;
            m.parent[b] = parent;
            m.tokens[b] = t;
            m.by_key[key] = b;
          }
        }
      } else {  // match a random prefix
        const std::vector<int32_t> t = random_tokens(uniform(0, 4 * kBlockSize + 1));
        const int32_t max_blocks = uniform(0, 4);
        std::vector<int32_t> expected;
        uint64_t expected_key = BlockPool::kRootKey;
        if (prefix_cache) {
          const int32_t n_asked = std::min(static_cast<int32_t>(t.size()) / kBlockSize, max_blocks);
          for (int32_t i = 0; i < n_asked; ++i) {
            const std::vector<int32_t> blk(t.begin() + i * kBlockSize,
                                           t.begin() + (i + 1) * kBlockSize);
            const uint64_t key = BlockPool::block_key(expected_key, blk);
            const auto it = m.by_key.find(key);
            if (it == m.by_key.end() || m.parent[it->second] != expected_key ||
                m.tokens[it->second] != blk) {
              break;
            }
            expected.push_back(it->second);
            expected_key = key;
          }
          ++m.n_queries;
          m.n_blocks_queried += n_asked;
          m.n_blocks_hit += static_cast<int64_t>(expected.size());
        }
        std::vector<int32_t> matched;
        uint64_t last_key = 0;
        const int32_t n = pool.match_prefix(t, max_blocks, &matched, &last_key);
        ASSERT_EQ(n, static_cast<int32_t>(matched.size()));
        ASSERT_EQ(matched, expected);
        ASSERT_EQ(last_key, expected_key);
        n_deep_matches += n >= 2;
        for (const int32_t b : matched) {
          m.take(b);
          held.push_back(b);
        }
      }
      ASSERT_NO_FATAL_FAILURE(expect_pool_matches_model(pool, m));
    }
    while (!held.empty()) {  // everything back: nothing used
      pool.release(held.back());
      m.drop(held.back());
      held.pop_back();
    }
    ASSERT_NO_FATAL_FAILURE(expect_pool_matches_model(pool, m));
    EXPECT_EQ(pool.num_used(), 0);
  }
  if (prefix_cache) {  // the run reached the interesting cases
    EXPECT_GT(n_evictions, 50);
    EXPECT_GT(n_duplicates, 10);
    EXPECT_GT(n_deep_matches, 10);
  }
}

INSTANTIATE_TEST_SUITE_P(PrefixCache, BlockPoolRandomTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "On" : "Off";
                         });

}  // namespace
}  // namespace specdec
