// Draft-model proposer for one sequence: a second, smaller GGUF model with the target's
// vocabulary and its own contiguous KV cache drafts a chain token by token (greedy, or sampled
// while keeping q for lossless rejection sampling). It stops early when its confidence falls
// below p_min and can branch the top-k alternatives at the first levels into a tree (as leaf
// siblings of the chain); the decisions are DraftDecoder's (draft_decoder.h). The engine drafts
// for all its sequences at once with BatchedDraftModel (batched_draft.h), which makes the same
// trees.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "speculative/draft_decoder.h"
#include "speculative/proposer.h"

namespace specdec {

class ThreadPool;

class DraftModelProposer final : public Proposer {
 public:
  // Throws specdec::Error if the draft's vocabulary differs from the target's.
  DraftModelProposer(Model& draft, const Model& target, ThreadPool* pool, int64_t ctx_size,
                     const DraftModelConfig& config);
  const char* name() const override { return "draft"; }
  // Also reads the prompt into the draft's cache (all of it; the first propose() runs only the
  // tokens after it): the draft's share of the prompt processing, before the first token.
  void begin(std::span<const int32_t> prompt, uint64_t seed) override;
  void propose(const DraftRequest& request, TokenTree* tree) override;

 private:
  // Brings the draft cache up to tokens[0, n-1) (plan_draft_catch_up: at most the config's
  // catch_up_window generated tokens are read) and runs tokens[n-1]; returns its logits.
  std::span<const float> sync(std::span<const int32_t> tokens);
  std::span<const float> step(int32_t token);  // runs one token after the cache

  Model& draft_;
  ThreadPool* pool_;
  KvCache kv_;
  DraftDecoder decoder_;            // the drafting decision per depth
  DraftCache cache_;                // what kv_ has read: kv_.size() == cache_.slots()
  int64_t n_prompt_ = 0;            // the sequence's prompt tokens (always read whole)
  std::vector<int32_t> positions_;  // [tokens of a sync()] their positions
  std::vector<int32_t> run_;        // [tokens of a sync()] their ids
};

// Slots of the draft's own cache for a sequence whose context is ctx_size tokens (the draft's
// training context may be shorter).
int64_t draft_context(const Model& draft, int64_t ctx_size);

// Throws specdec::Error naming both files if the two models' vocabularies differ.
void check_same_vocabulary(const Model& draft, const Model& target);

}  // namespace specdec
