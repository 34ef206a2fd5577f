#include "kv/block_pool.h"

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "util/check.h"

namespace specdec {

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, bool prefix_cache)
    : n_blocks_(n_blocks), block_size_(block_size), prefix_cache_(prefix_cache) {
  SPECDEC_CHECK(n_blocks >= 1, "block pool needs n_blocks >= 1");
  SPECDEC_CHECK(block_size >= 1, "block pool needs block_size >= 1");
  info_.resize(static_cast<size_t>(n_blocks));
  if (prefix_cache_) {
    tokens_.resize(static_cast<size_t>(n_blocks) * static_cast<size_t>(block_size));
  }
  // Descending, so that popping from the back hands out 0, 1, 2, ... on a fresh pool.
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  by_key_.reserve(static_cast<size_t>(n_blocks));
}

int32_t BlockPool::num_free() const {
  return static_cast<int32_t>(free_.size());
}
int32_t BlockPool::num_cached() const {
  return static_cast<int32_t>(lru_.size());
}
int32_t BlockPool::num_used() const {
  return n_used_;
}

void BlockPool::check_block(int32_t block) const {
  SPECDEC_CHECK(block >= 0 && block < n_blocks_,
                "block id " + std::to_string(block) + " outside the pool");
}

std::span<const int32_t> BlockPool::stored_tokens(int32_t block) const {
  return std::span<const int32_t>(tokens_).subspan(
      static_cast<size_t>(block) * static_cast<size_t>(block_size_),
      static_cast<size_t>(block_size_));
}

void BlockPool::drop_registration(int32_t block) {
  BlockInfo& info = info_[block];
  if (!info.registered) return;
  auto it = by_key_.find(info.key);
  if (it != by_key_.end() && it->second == block) by_key_.erase(it);
  info.registered = false;
  info.key = 0;
  info.parent_key = 0;
}

std::optional<int32_t> BlockPool::allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    block = lru_.front();
    lru_.pop_front();
    drop_registration(block);
  } else {
    return std::nullopt;
  }
  BlockInfo& info = info_[block];
  SPECDEC_CHECK(info.refcount == 0, "allocate found a block with holders");
  info.refcount = 1;
  ++n_used_;
  return block;
}

bool BlockPool::allocate_n(int32_t n, std::vector<int32_t>* out) {
  SPECDEC_CHECK(n >= 0, "allocate_n of a negative count");
  SPECDEC_CHECK(out != nullptr, "allocate_n needs an output vector");
  if (n > num_available()) return false;
  out->reserve(out->size() + static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out->push_back(*allocate());
  return true;
}

void BlockPool::ref(int32_t block) {
  check_block(block);
  BlockInfo& info = info_[block];
  SPECDEC_CHECK(info.refcount > 0 || info.registered, "ref of a free block");
  if (info.refcount == 0) {  // cached -> used
    lru_.erase(info.lru_pos);
    ++n_used_;
  }
  ++info.refcount;
}

void BlockPool::release(int32_t block) {
  check_block(block);
  BlockInfo& info = info_[block];
  SPECDEC_CHECK(info.refcount > 0, "release of a block with refcount 0");
  if (--info.refcount > 0) return;
  --n_used_;
  if (info.registered) {
    info.lru_pos = lru_.insert(lru_.end(), block);
  } else {
    free_.push_back(block);
  }
}

int32_t BlockPool::refcount(int32_t block) const {
  check_block(block);
  return info_[block].refcount;
}

uint64_t BlockPool::block_key(uint64_t parent_key, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_key);
}

uint64_t BlockPool::register_block(int32_t block, uint64_t parent_key,
                                   std::span<const int32_t> tokens) {
  check_block(block);
  SPECDEC_CHECK(static_cast<int64_t>(tokens.size()) == block_size_,
                "register_block needs block_size tokens");
  const uint64_t key = block_key(parent_key, tokens);
  if (!prefix_cache_) return key;
  BlockInfo& info = info_[block];
  SPECDEC_CHECK(info.refcount > 0, "register_block of a block that is not used");
  if (info.registered) {
    SPECDEC_CHECK(info.key == key, "block registered again under a different prefix");
    return key;
  }
  if (!by_key_.try_emplace(key, block).second) return key;  // an earlier block holds the key
  info.registered = true;
  info.key = key;
  info.parent_key = parent_key;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(block) * block_size_);
  return key;
}

bool BlockPool::is_registered(int32_t block) const {
  check_block(block);
  return info_[block].registered;
}

int32_t BlockPool::match_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                                std::vector<int32_t>* blocks, uint64_t* last_key) {
  SPECDEC_CHECK(blocks != nullptr && last_key != nullptr, "match_prefix needs outputs");
  SPECDEC_CHECK(max_blocks >= 0, "match_prefix of a negative max_blocks");
  *last_key = kRootKey;
  if (!prefix_cache_) return 0;
  const int64_t n_whole = static_cast<int64_t>(tokens.size()) / block_size_;
  const int32_t n_asked = static_cast<int32_t>(std::min<int64_t>(n_whole, max_blocks));
  ++n_queries_;
  n_blocks_queried_ += n_asked;
  uint64_t parent = kRootKey;
  int32_t n_found = 0;
  for (; n_found < n_asked; ++n_found) {
    const auto block_tokens =
        tokens.subspan(static_cast<size_t>(n_found) * static_cast<size_t>(block_size_),
                       static_cast<size_t>(block_size_));  // [block_size]
    const uint64_t key = block_key(parent, block_tokens);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) break;
    const int32_t block = it->second;
    const BlockInfo& info = info_[block];
    // The key is only a hash: the parent and the tokens decide.
    if (info.parent_key != parent) break;
    const auto stored = stored_tokens(block);
    if (!std::equal(stored.begin(), stored.end(), block_tokens.begin())) break;
    ref(block);
    blocks->push_back(block);
    parent = key;
  }
  n_blocks_hit_ += n_found;
  *last_key = parent;
  return n_found;
}

void BlockPool::check_invariants() const {
  const size_t n = static_cast<size_t>(n_blocks_);
  SPECDEC_CHECK(info_.size() == n, "block info size differs from n_blocks");
  SPECDEC_CHECK(tokens_.size() == (prefix_cache_ ? n * static_cast<size_t>(block_size_) : 0),
                "token store size differs from n_blocks * block_size");

  // Each block in exactly one state, and counted once on the list of that state.
  std::vector<int8_t> on_free(n, 0), on_lru(n, 0);  // [n_blocks]
  for (const int32_t b : free_) {
    check_block(b);
    SPECDEC_CHECK(on_free[b] == 0, "block " + std::to_string(b) + " twice on the free list");
    on_free[b] = 1;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const int32_t b = *it;
    check_block(b);
    SPECDEC_CHECK(on_lru[b] == 0, "block " + std::to_string(b) + " twice on the LRU list");
    on_lru[b] = 1;
    SPECDEC_CHECK(info_[b].refcount == 0 && info_[b].registered,
                  "block " + std::to_string(b) + " on the LRU list but not cached");
    SPECDEC_CHECK(info_[b].lru_pos == it,
                  "block " + std::to_string(b) + " has a stale LRU position");
  }

  int32_t n_free = 0, n_cached = 0, n_used = 0, n_registered = 0;
  for (int32_t b = 0; b < n_blocks_; ++b) {
    const BlockInfo& info = info_[b];
    const std::string name = "block " + std::to_string(b);
    SPECDEC_CHECK(info.refcount >= 0, name + " has a negative refcount");
    const bool is_used = info.refcount > 0;
    const bool is_cached = !is_used && info.registered;
    const bool is_free = !is_used && !info.registered;
    n_used += is_used;
    n_cached += is_cached;
    n_free += is_free;
    SPECDEC_CHECK(on_free[b] == (is_free ? 1 : 0), name + ": free state and free list disagree");
    SPECDEC_CHECK(on_lru[b] == (is_cached ? 1 : 0), name + ": cached state and LRU list disagree");
    if (info.registered) {
      ++n_registered;
      SPECDEC_CHECK(prefix_cache_, name + " registered with the prefix cache off");
      const auto it = by_key_.find(info.key);
      SPECDEC_CHECK(it != by_key_.end() && it->second == b, name + "'s key is not mapped to it");
      SPECDEC_CHECK(info.key == block_key(info.parent_key, stored_tokens(b)),
                    name + "'s key is not the hash of its parent key and tokens");
    }
  }
  for (const auto& [key, b] : by_key_) {
    check_block(b);
    SPECDEC_CHECK(info_[b].registered && info_[b].key == key,
                  "key map names block " + std::to_string(b) + " which does not hold the key");
  }
  SPECDEC_CHECK(static_cast<int32_t>(by_key_.size()) == n_registered,
                "key map size differs from the registered blocks");
  SPECDEC_CHECK(n_free == num_free() && n_cached == num_cached() && n_used == n_used_,
                "state counts disagree with the lists");
  SPECDEC_CHECK(n_free + n_cached + n_used == n_blocks_, "state counts do not add up");
}

}  // namespace specdec
