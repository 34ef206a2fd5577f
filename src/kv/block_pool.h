// The block allocator of the paged KV cache, with prefix reuse (vLLM's KV cache manager,
// TensorRT-LLM's block reuse). It knows block ids, reference counts and which token prefix a
// block holds; the memory behind a block is PagedKvStorage's (kv/paged_kv.h).
//
// Every block is in exactly one of three states:
//   free    - refcount 0, holds nothing anyone may reuse (on the free list);
//   used    - refcount > 0, referenced by the block tables of live sequences;
//   cached  - refcount 0 but registered in the prefix cache: it holds the K/V of a known prefix
//             and waits on an LRU list, to be reused by a later request or evicted when the pool
//             needs a block.
// allocate() takes a free block first and evicts the least recently released cached block only
// when none is free. A registered block's key is a hash of (its parent block's key, its
// block_size token ids), so a key names a whole prefix; the tokens and the parent key are kept
// too and compared on lookup, so a hash collision can never hand out the wrong K/V.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace specdec {

class BlockPool {
 public:
  // Key of the empty prefix: the parent key of a sequence's first block.
  static constexpr uint64_t kRootKey = 0x5bd1e9955bd1e995ull;

  // n_blocks >= 1 blocks of block_size >= 1 token slots. prefix_cache = false: register_block
  // and match_prefix do nothing (every released block becomes free).
  BlockPool(int32_t n_blocks, int32_t block_size, bool prefix_cache = true);

  int32_t num_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  bool prefix_cache() const { return prefix_cache_; }

  // Blocks allocate() can hand out now: free + cached.
  int32_t num_available() const { return num_free() + num_cached(); }
  int32_t num_free() const;    // refcount 0, not registered
  int32_t num_cached() const;  // refcount 0, registered (evictable)
  int32_t num_used() const;    // refcount > 0

  // A block with refcount 1: a free one (lowest id first on a fresh pool, so that a new
  // sequence's blocks tend to be consecutive in memory), else the least recently released cached
  // block, whose registration is dropped. nullopt when every block is used.
  std::optional<int32_t> allocate();
  // n blocks appended to *out, all or nothing (false: nothing taken, *out unchanged).
  bool allocate_n(int32_t n, std::vector<int32_t>* out);

  // One more holder of a used or cached block (a cached block becomes used, leaves the LRU).
  void ref(int32_t block);
  // One holder fewer. At refcount 0 a registered block goes to the LRU list's most recent end,
  // any other block to the free list.
  void release(int32_t block);
  int32_t refcount(int32_t block) const;

  // Key of a block holding `tokens` (block_size ids) after the prefix whose last block has key
  // parent_key (kRootKey for the first block). XXH3-64 of the tokens seeded with parent_key.
  static uint64_t block_key(uint64_t parent_key, std::span<const int32_t> tokens);

  // Registers used block `block`, full with `tokens` (block_size ids) after the prefix ending in
  // parent_key, and returns its key. If another block is already registered under that key (the
  // same prefix computed twice), `block` stays unregistered and the earlier one keeps the key.
  // Registering a block twice is a no-op. Nothing happens (the key is still returned) when the
  // prefix cache is off.
  uint64_t register_block(int32_t block, uint64_t parent_key, std::span<const int32_t> tokens);
  bool is_registered(int32_t block) const;

  // The longest prefix of `tokens` made of whole registered blocks, at most max_blocks of them:
  // their ids are appended to *blocks in order, each one ref()'d (cached ones become used);
  // returns how many, and sets *last_key to the key of the last one (kRootKey if none). Counts
  // one query per call and, per block found, one hit (stats below). Always 0 with the cache off.
  int32_t match_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                       std::vector<int32_t>* blocks, uint64_t* last_key);

  // Statistics: match_prefix calls, blocks asked for (whole blocks of tokens, capped by
  // max_blocks) and blocks found.
  int64_t num_queries() const { return n_queries_; }
  int64_t num_blocks_queried() const { return n_blocks_queried_; }
  int64_t num_blocks_hit() const { return n_blocks_hit_; }

  // Checks every invariant (SPECDEC_CHECK): each block in exactly one state, the free list and
  // LRU list hold exactly the free / cached blocks, the key map and the blocks' keys agree, the
  // counts add up to num_blocks. For tests; O(num_blocks).
  void check_invariants() const;

 private:
  void check_block(int32_t block) const;  // 0 <= block < n_blocks
  // Tokens of registered block `block`: [block_size].
  std::span<const int32_t> stored_tokens(int32_t block) const;
  // Forgets `block`'s key (it leaves by_key_ if it holds the key there).
  void drop_registration(int32_t block);

  struct BlockInfo {
    int32_t refcount = 0;
    bool registered = false;
    uint64_t key = 0;
    uint64_t parent_key = 0;
    std::list<int32_t>::iterator lru_pos;  // valid while cached
  };
  int32_t n_blocks_;
  int32_t block_size_;
  bool prefix_cache_;
  std::vector<BlockInfo> info_;                   // [n_blocks]
  std::vector<int32_t> tokens_;                   // [n_blocks, block_size] of registered blocks
  std::vector<int32_t> free_;                     // free block ids, popped from the back
  std::list<int32_t> lru_;                        // cached blocks, least recent first
  std::unordered_map<uint64_t, int32_t> by_key_;  // key -> registered block
  int32_t n_used_ = 0;
  int64_t n_queries_ = 0;
  int64_t n_blocks_queried_ = 0;
  int64_t n_blocks_hit_ = 0;
};

}  // namespace specdec
