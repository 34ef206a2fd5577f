// A draft model drafting for many sequences at once (the engine's): one paged KV pool of the
// draft model shared by the sequences, and per propose() call one Model::forward that catches
// every sequence's draft cache up with its history, then one forward per depth over the
// sequences still drafting. Each sequence's decisions are its own DraftDecoder's, seeded as
// DraftModelProposer::begin seeds it, and every row of a pass is bitwise the one it gets alone,
// so each tree is exactly the one DraftModelProposer makes for the same history and seed.
//
// A sequence's draft cache holds, like DraftModelProposer's, the history and the last chain's
// drafts but the last; the next call keeps its longest common prefix with the new history (the
// accepted drafts need not be run again) and runs the rest, reading at most the config's
// catch_up_window generated tokens (plan_draft_catch_up, as DraftModelProposer does). The draft's context per sequence is
// min(the sequence's context, the draft's training context): a history that leaves no room gets
// no drafts.
//
// When the pool cannot hold a job's slots, the caches of sequences that are not in this call are
// evicted, least recently drafted first; if that is not enough, the job's own cache is evicted
// and it gets no drafts this call. An evicted cache keeps its record of what it read (its
// DraftCache) and reads exactly that again when it next drafts, so eviction changes no tree. A
// request never fails for want of draft blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/paged_kv.h"
#include "model/model.h"
#include "speculative/draft_decoder.h"
#include "speculative/token_tree.h"

namespace specdec {

class ThreadPool;

// One sequence's drafting in a propose() call.
struct DraftJob {
  int64_t seq = -1;                 // the handle given to add()
  std::span<const int32_t> tokens;  // [n] the history (prompt + generated); tokens[n-1] = root
  int max_tokens = 0;               // draft nodes to add at most
  TokenTree* tree = nullptr;        // reset to tokens[n-1]; receives the drafts
  int64_t n_prompt = 0;             // tokens[0, n_prompt) are the prompt (always read whole)
  double draft_step_cost = 0.0;     // DraftDecoder::start's (0: no cost rules)
  double node_cost = 0.0;           // DraftDecoder::start's
};

struct BatchedDraftStats {
  int64_t calls = 0;         // propose() calls with at least one job
  int64_t passes = 0;        // draft forward passes
  int64_t tokens_run = 0;    // tokens through the draft model (catch-up and chain steps)
  int64_t tokens_skipped = 0;  // history tokens a catch-up skipped (its window)
  int64_t evictions = 0;     // caches of idle sequences dropped for a job's blocks
  int64_t jobs_dropped = 0;  // jobs without drafts because the pool could not hold them
};

class BatchedDraftModel {
 public:
  // A pool of n_blocks >= 1 blocks of block_size slots (a multiple of 16) of the draft model's
  // K/V, stored as f16 like DraftModelProposer's cache. `draft` and `pool` must outlive it.
  BatchedDraftModel(Model& draft, ThreadPool* pool, int32_t n_blocks, int32_t block_size);

  // A new sequence with handle `seq` (not present) of context ctx_size tokens; its drafts are
  // seeded from `seed` as DraftModelProposer::begin(prompt, seed) does. Throws specdec::Error for
  // a configuration out of range (nothing added).
  void add(int64_t seq, int64_t ctx_size, uint64_t seed, const DraftModelConfig& config);
  // The sequence ends: its blocks go back to the pool. Unknown handles are ignored.
  void remove(int64_t seq);
  bool contains(int64_t seq) const { return seqs_.count(seq) != 0; }

  // Grows each job's tree (each sequence at most once per call). A job may get no drafts: no
  // room in the draft's context, p_min, or no blocks for it (see above). Throws specdec::Error
  // only if a forward pass does (the jobs' caches are dropped and their trees reset).
  void propose(std::span<const DraftJob> jobs);

  // Slots of K/V the sequence's draft cache holds (0 for an unknown handle).
  int64_t cached_tokens(int64_t seq) const;
  const BlockPool& block_pool() const { return *pool_; }
  const BatchedDraftStats& stats() const { return stats_; }
  // Checks the pool's invariants and that every block used is held by exactly one table and
  // covers its sequence's cached tokens. For tests; O(num_blocks).
  void check_invariants() const;

 private:
  struct SeqState {
    BlockTable table;
    DraftCache cache;             // what it read: the table holds cache.slots() (unless evicted)
    bool evicted = false;         // the blocks were taken back (the record stays)
    int64_t capacity = 0;         // the draft's context for this sequence
    int64_t last_call = -1;       // the propose() call that last drafted for it
    DraftDecoder decoder;
    explicit SeqState(const DraftModelConfig& config) : decoder(config) {}
  };
  // A job being drafted in this call.
  struct Work {
    SeqState* state = nullptr;
    TokenTree* tree = nullptr;
    std::vector<int32_t> positions;  // [tokens of this pass] their RoPE positions
    std::vector<int32_t> run;        // [tokens of the catch-up pass] their ids
    int32_t token = 0;               // the chain token to run next
    int32_t row = 0;                 // its output row in its batch
  };

  // Grows the table to n slots, dropping idle sequences' caches if needed; false: no room.
  bool reserve(SeqState* s, int64_t n);
  void evict(SeqState* s);  // frees the blocks; the record stays (read again when drafting)
  void reset(SeqState* s);  // frees the blocks and forgets the record (after an error)
  // Runs batches_ (one per entry of running_) and hands each its logits: its decoder's next
  // token; the ones that go on stay in running_.
  void run_and_decide();

  Model& draft_;
  ThreadPool* thread_pool_;
  std::unique_ptr<PagedKvStorage> storage_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvBlockManager> kv_;
  std::unordered_map<int64_t, std::unique_ptr<SeqState>> seqs_;
  ForwardScratch scratch_;
  std::vector<Work> work_;         // [jobs of this call]
  std::vector<Work*> running_;     // the jobs in this pass
  DraftCache planned_;             // a job's record while its catch-up is planned
  std::vector<SeqBatch> batches_;  // [running_] this pass
  int64_t n_calls_ = 0;
  BatchedDraftStats stats_;
};

}  // namespace specdec
