// The interface every speculative method plugs into (DESIGN §2, spec/).
//
// Each decoding step the engine resets a TokenTree to the root (the token the target produced
// last) and asks the sequence's proposer to grow it with up to `max_tokens` draft tokens. After
// the target verified the tree in one pass, the proposer is told which drafts were accepted and
// which token the target added, so that it can update its own state (a draft model's KV cache,
// an n-gram index, a drafter's RNN input).
#pragma once

#include <cstdint>
#include <span>

#include "speculative/token_tree.h"

namespace specdec {

struct DraftRequest {
  // Prompt + generated tokens so far; the last one is the tree's root.
  std::span<const int32_t> tokens;
  int max_tokens = 0;  // draft nodes to add at most (the root is not counted)
  // Target's final-normed hidden state at the token before the root ([dim]); empty unless the
  // proposer asked for it with wants_hidden().
  std::span<const float> target_hidden;
  // What one more draft token adds to the cost of this step, in target passes of this sequence
  // alone (the cost model, never a clock); 0: unknown. A proposer that knows how likely each
  // of its drafts is (ReDrafter's beam scores) keeps only those worth their cost.
  double node_cost = 0.0;
  // What one more step of a draft model costs, in target passes of this sequence alone (the
  // cost model); 0: no such stop. A draft model drafts on while its chain is likely enough to
  // pay it and node_cost (DraftDecoder's cost rules).
  double draft_step_cost = 0.0;
  // What a cost counted in target passes of this sequence alone weighs in this step: 1 alone;
  // in a batch of B tokens, where the sequence's progress is one token of a pass that costs
  // P(B) solo passes (engine/pass_cost.h; 1 + c·(B - 1) on the line), B / P(B) (node_cost is
  // what a token adds to the pass times it). A proposer that pays for its own drafting
  // (ReDrafter's beam search) scales that cost by it.
  double cost_scale = 1.0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual const char* name() const = 0;
  virtual bool wants_hidden() const { return false; }

  // A new sequence starts (its prompt tokens); drop any state from the previous one. `seed` is
  // the sequence's sampling seed: a proposer that draws random drafts must derive its stream
  // from it, so that drafts are fresh draws for every sequence yet replay exactly.
  virtual void begin(std::span<const int32_t> prompt, uint64_t seed) {}

  // Adds drafts to `tree` (already reset to request.tokens.back()). Adding nothing is allowed.
  virtual void propose(const DraftRequest& request, TokenTree* tree) = 0;

  // The verification outcome: `accepted` drafts (in order) followed the root, then the target's
  // own `bonus` token, which becomes the next root.
  virtual void observe(std::span<const int32_t> accepted, int32_t bonus) {}
};

}  // namespace specdec
