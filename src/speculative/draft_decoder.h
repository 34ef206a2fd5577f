// The drafting decision of a draft model, one depth at a time, shared by the single-sequence
// DraftModelProposer and the BatchedDraftModel (which runs many sequences' draft passes at once):
// both only run the draft model and hand each depth's logits to a sequence's DraftDecoder.
//
// Per depth, given the draft's logits at the current chain node and the tokens leading to it:
//   q = the draft's sampling distribution (sampled drafts) or its plain softmax (greedy);
//   stop if max q < p_min;
//   add the drafted token under the current node (sampled: drawn from q, q kept in the tree for
//   lossless rejection sampling; greedy: argmax q);
//   at the first branch_levels depths, add the next-best branch_top_k - 1 tokens of q as leaf
//   siblings (with cost rules, only those with reach(parent) * q(alternative) >= node_cost:
//   likely enough to pay their verification);
//   stop when max_tokens nodes were added, or (cost rules) when reach * q(token) <
//   step_cost + node_cost, where reach is the product of q over the chain's drafted tokens (the
//   chance, by the draft's own probabilities, that the whole chain is accepted) and q(token)
//   stands for the next token's chance: another draft step and its verified token would not
//   pay; else the drafted token is the one to run next.
// The cost rules apply when start() is given a draft step cost > 0 (costs in target passes of
// the sequence alone: DraftRequest::draft_step_cost / node_cost, DraftJob's in the engine).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sample/sampler.h"
#include "speculative/token_tree.h"

namespace specdec {

struct DraftModelConfig {
  float p_min = 0.0f;       // stop drafting when the draft's top probability falls below this
  bool sample = false;      // sample drafts from q (kept for verification) instead of greedy
  SamplingParams sampling;  // the draft's own sampling when `sample` (temperature, filters);
                            // its seed is derived per sequence from the seed given to begin()
  int branch_top_k = 1;     // > 1: also add the next-best k-1 tokens as leaf siblings ...
  int branch_levels = 0;    // ... at the first branch_levels depths of the chain
  // Generated tokens the draft reads at most to catch up with the history before drafting
  // (0: all). After a pause in speculation of more than this many tokens, the draft skips all
  // but the last catch_up_window (see plan_draft_catch_up); the prompt is always read whole.
  int catch_up_window = 32;
};

class DraftDecoder {
 public:
  static constexpr int32_t kStop = -1;

  // Throws specdec::Error if the configuration is out of range (p_min, branch_top_k, the
  // sampling parameters).
  explicit DraftDecoder(const DraftModelConfig& config);
  static void validate(const DraftModelConfig& config);

  const DraftModelConfig& config() const { return config_; }

  // A new sequence: the draft sampler's stream is derived from the sequence's seed (a stream of
  // its own, distinct from the target's), so drafts are fresh per sequence yet replay exactly.
  void begin(uint64_t seed);

  // A new tree (already reset to its root) that may receive up to max_tokens >= 1 drafts; with
  // step_cost > 0 the cost rules above decide where chains end and which alternatives stay.
  void start(int max_tokens, double step_cost = 0.0, double node_cost = 0.0);

  // One depth: `logits` ([n_vocab]) are the draft's at the current chain node, `history` the
  // tokens up to and including that node (the sequence, then the chain's drafts). Adds the
  // drafted token (and any branch siblings) under the node; returns the drafted token, which
  // becomes the current node and must be run next, or kStop when drafting ends.
  int32_t next(std::span<const float> logits, std::span<const int32_t> history, TokenTree* tree);

 private:
  DraftModelConfig config_;
  Sampler sampler_;             // draft sampling (its Rng is the draft's own)
  std::vector<float> q_;        // [n_vocab]
  std::vector<int32_t> order_;  // [n_vocab] scratch for top-k
  int max_tokens_ = 0;
  int parent_ = 0;  // the current chain node
  int added_ = 0;   // nodes added to the tree
  int depth_ = 0;   // depth of the current chain node
  double min_gain_ = 0.0;       // step_cost + node_cost (0: no chain rule)
  double min_node_gain_ = 0.0;  // node_cost (0: every alternative)
  double reach_ = 1.0;  // product of q over the chain's drafted tokens
};

// Drafts a tree may get for a history of n_tokens when the draft's cache holds `capacity` slots
// (the history and the chain's drafts but the last): min(max_tokens, capacity - n_tokens);
// <= 0: none.
int draft_room(int64_t capacity, size_t n_tokens, int max_tokens);

// How many leading tokens of a draft cache holding `cached` (slot order) stay valid for the
// history `tokens`: their longest common prefix, short of the history's last token (which is run
// again for its logits).
int64_t draft_cache_keeps(std::span<const int32_t> cached, std::span<const int32_t> tokens);

// What a sequence's draft cache has read: the tokens of positions [0, tokens.size()), in order,
// except the positions [gap_begin, gap_end), which were skipped (never run: their K/V is not in
// the cache, and the tokens after them attend to the rest). Its K/V slots hold the positions
// outside the gap in order. DraftModelProposer and BatchedDraftModel keep one per sequence and
// plan every catch-up with plan_draft_catch_up, so both read the same tokens at the same
// positions and draft the same trees.
struct DraftCache {
  std::vector<int32_t> tokens;  // [positions read or skipped] the history, then chain drafts
  int64_t gap_begin = 0;
  int64_t gap_end = 0;  // == gap_begin: no gap
  int64_t slots() const {
    return static_cast<int64_t>(tokens.size()) - (gap_end - gap_begin);
  }
  void clear() {
    tokens.clear();
    gap_begin = gap_end = 0;
  }
};

// Brings `cache` up to the history `tokens` (n >= 1; tokens[n-1] is run again for its logits):
// keeps its longest common prefix with the history (draft_cache_keeps), then reads the rest. At
// most `window` > 0 generated tokens are read: when more are uncached (speculation paused for a
// while), the positions from max(kept, n_prompt) to n - window are skipped and become the cache's
// gap (an older gap is extended to it, dropping the slots after it, so a cache has one gap at
// most); the prompt's tokens [0, n_prompt) are always read. window <= 0 reads everything.
// Returns the slots to keep (the caller truncates its K/V to them) and fills `run` with the
// positions to run, increasing, ending with n - 1; cache->tokens becomes `tokens`.
int64_t plan_draft_catch_up(DraftCache* cache, std::span<const int32_t> tokens, int64_t n_prompt,
                            int window, std::vector<int32_t>* run);

}  // namespace specdec
