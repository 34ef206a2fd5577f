#include "kv/block_table.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {

int64_t KvBlockManager::admit(std::span<const int32_t> tokens, int64_t limit, BlockTable* table) {
  SPECDEC_CHECK(table->blocks.empty(), "admit: the sequence already has blocks");
  const int64_t bs = block_size();
  const int64_t usable = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size()));
  const auto max_blocks = static_cast<int32_t>(usable / bs);
  table->n_registered = 0;
  table->last_key = BlockPool::kRootKey;
  if (max_blocks == 0) return 0;
  const int32_t found = pool_->match_prefix(tokens.first(static_cast<size_t>(max_blocks * bs)),
                                            max_blocks, &table->blocks, &table->last_key);
  table->n_registered = found;
  return static_cast<int64_t>(found) * bs;
}

bool KvBlockManager::reserve(BlockTable* table, int64_t n) {
  const int32_t need = blocks_for(n) - static_cast<int32_t>(table->blocks.size());
  if (need <= 0) return true;
  return pool_->allocate_n(need, &table->blocks);
}

void KvBlockManager::shrink(BlockTable* table, int64_t n) {
  const int32_t keep = blocks_for(n);
  SPECDEC_CHECK(keep >= table->n_registered, "shrink: would drop registered blocks");
  while (static_cast<int32_t>(table->blocks.size()) > keep) {
    pool_->release(table->blocks.back());
    table->blocks.pop_back();
  }
}

void KvBlockManager::free(BlockTable* table) {
  // Last block first: the LRU list then evicts a prefix's tail before its head, which more
  // requests are likely to share.
  for (auto it = table->blocks.rbegin(); it != table->blocks.rend(); ++it) pool_->release(*it);
  table->blocks.clear();
  table->n_registered = 0;
  table->last_key = BlockPool::kRootKey;
}

void KvBlockManager::commit(BlockTable* table, std::span<const int32_t> tokens,
                            int64_t n_computed) {
  const int64_t bs = block_size();
  SPECDEC_CHECK(n_computed <= static_cast<int64_t>(tokens.size()), "commit past the tokens");
  while ((table->n_registered + 1) * bs <= n_computed &&
         table->n_registered < static_cast<int32_t>(table->blocks.size())) {
    const int32_t b = table->n_registered;
    table->last_key = pool_->register_block(table->blocks[static_cast<size_t>(b)], table->last_key,
                                            tokens.subspan(static_cast<size_t>(b * bs),
                                                           static_cast<size_t>(bs)));
    ++table->n_registered;
  }
}

}  // namespace specdec
