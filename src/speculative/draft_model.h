// Draft-model proposer: a second, smaller GGUF model with the target's vocabulary and its own KV
// cache drafts a chain token by token (greedy, or sampled while keeping q for lossless
// rejection sampling). It stops early when its confidence falls below p_min and can branch the
// top-k alternatives at the first levels into a tree (as leaf siblings of the chain).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "speculative/proposer.h"

namespace specdec {

class ThreadPool;

struct DraftModelConfig {
  float p_min = 0.0f;      // stop drafting when the draft's top probability falls below this
  bool sample = false;     // sample drafts from q (kept for verification) instead of greedy
  SamplingParams sampling; // the draft's own sampling when `sample` (temperature, filters);
                           // its seed is derived per sequence from the seed given to begin()
  int branch_top_k = 1;    // > 1: also add the next-best k-1 tokens as leaf siblings ...
  int branch_levels = 0;   // ... at the first branch_levels depths of the chain
};

class DraftModelProposer final : public Proposer {
 public:
  // Throws specdec::Error if the draft's vocabulary differs from the target's.
  DraftModelProposer(Model& draft, const Model& target, ThreadPool* pool, int64_t ctx_size,
                     const DraftModelConfig& config);
  const char* name() const override { return "draft"; }
  void begin(std::span<const int32_t> prompt, uint64_t seed) override;
  void propose(const DraftRequest& request, TokenTree* tree) override;

 private:
  // Brings the draft cache to hold exactly tokens[0, n-1) and runs tokens[n-1]; returns logits.
  std::span<const float> sync(std::span<const int32_t> tokens);
  std::span<const float> step(int32_t token);  // runs one token after the cache

  Model& draft_;
  ThreadPool* pool_;
  DraftModelConfig config_;
  KvCache kv_;
  Sampler sampler_;                // draft sampling (its Rng is the draft's own)
  std::vector<int32_t> cached_;    // tokens in kv_, slot order
  std::vector<int32_t> positions_;
  std::vector<float> q_;           // [n_vocab]
  std::vector<int32_t> order_;     // scratch for top-k
};

// Throws specdec::Error naming both files if the two models' vocabularies differ.
void check_same_vocabulary(const Model& draft, const Model& target);

}  // namespace specdec
