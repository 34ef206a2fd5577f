// The blocks of each sequence (its block table) and the one place that moves blocks between
// sequences and the BlockPool: admission with prefix reuse, reservation of slots for a step,
// shrinking after rejected drafts, registering full blocks for reuse, freeing.
//
// Slots [0, n_computed) of a sequence hold the K/V of its tokens[0, n_computed); a table covers
// at least those slots. Only full blocks of computed tokens are registered (they are never
// written again), so a shared block is read-only: a sequence writes only into blocks past its
// last full one, which nobody else holds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "kv/paged_kv.h"

namespace specdec {

struct BlockTable {
  std::vector<int32_t> blocks;           // [blocks] ids in slot order
  int32_t n_registered = 0;              // leading blocks registered (or found) in the cache
  uint64_t last_key = BlockPool::kRootKey;  // key of block n_registered - 1
};

class KvBlockManager {
 public:
  KvBlockManager(PagedKvStorage* storage, BlockPool* pool) : storage_(storage), pool_(pool) {}

  int32_t block_size() const { return pool_->block_size(); }
  BlockPool& pool() { return *pool_; }
  const BlockPool& pool() const { return *pool_; }
  PagedKvStorage& storage() { return *storage_; }

  // Blocks that cover n slots.
  int32_t blocks_for(int64_t n) const {
    return static_cast<int32_t>((n + block_size() - 1) / block_size());
  }

  // A sequence starts (its table empty): takes the longest cached prefix of whole blocks of
  // tokens[0, limit) and returns how many tokens they hold (their K/V need not be computed).
  int64_t admit(std::span<const int32_t> tokens, int64_t limit, BlockTable* table);
  // An admission that kept its blocks (the scheduler may give them back when it cannot reserve
  // the rest): counts whole blocks looked up and found, for the prefix-cache hit rate (a request
  // retried every step while it waits is counted once, when it is admitted).
  void record_admission(int64_t tokens_looked_up, int64_t tokens_found) {
    blocks_queried_ += tokens_looked_up / block_size();
    blocks_hit_ += tokens_found / block_size();
  }
  int64_t prefix_blocks_queried() const { return blocks_queried_; }
  int64_t prefix_blocks_hit() const { return blocks_hit_; }

  // Grows the table to cover n slots; all or nothing (false: the pool has too few blocks).
  bool reserve(BlockTable* table, int64_t n);
  // Blocks past the first n slots go back to the pool.
  void shrink(BlockTable* table, int64_t n);
  // Every block goes back to the pool (registered ones stay cached for reuse).
  void free(BlockTable* table);
  // Registers the table's full blocks of tokens[0, n_computed) that are not registered yet.
  void commit(BlockTable* table, std::span<const int32_t> tokens, int64_t n_computed);
  // The sequence's view for a forward pass.
  SeqKv seq_kv(const BlockTable& table, int64_t n_past) {
    return SeqKv{storage_, table.blocks, n_past};
  }

 private:
  PagedKvStorage* storage_;
  BlockPool* pool_;
  int64_t blocks_queried_ = 0;
  int64_t blocks_hit_ = 0;
};

}  // namespace specdec
