// ReDrafter as a Proposer: from the target's hidden state before the root (DraftRequest::
// target_hidden) the head's beam search drafts M beams of C tokens, packed into one prefix tree
// that the target verifies in one pass. The verifier then walks the tree: greedy follows the
// target's own choice (the longest accepted beam prefix is kept, plus the target's token);
// sampled decoding treats the beams as deterministic drafts (accept x with probability p(x),
// else remove x and renormalize), which is exactly the target's distribution - unlike
// Apple's acceptance rule, which uses the beams' draft probabilities although beams are not
// samples. The proposer keeps no state between steps: the hidden state carries everything.
#pragma once

#include <memory>
#include <vector>

#include "drafter/beam_search.h"
#include "drafter/beam_tree.h"
#include "drafter/redrafter_head.h"
#include "speculative/proposer.h"

namespace specdec {

class Model;
class ThreadPool;

class ReDrafterProposer final : public Proposer {
 public:
  // head and target outlive the proposer; pool may be null. beams.length is the deepest draft.
  ReDrafterProposer(const ReDrafterHead& head, const Model& target, ThreadPool* pool,
                    const BeamSearchConfig& beams);
  const char* name() const override { return "redrafter"; }
  bool wants_hidden() const override { return true; }
  // Drafts at most request.max_tokens tree nodes (beams cut to fit, best beams first); nothing
  // without a hidden state.
  void propose(const DraftRequest& request, TokenTree* tree) override;

 private:
  ThreadPool* pool_;
  BeamSearchConfig config_;
  ReDrafterBeamSearch search_;
  Beams beams_;
};

}  // namespace specdec
