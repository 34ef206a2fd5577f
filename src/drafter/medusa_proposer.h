// Medusa as a Proposer: from the target's hidden state before the root, the K heads' top-ranked
// tokens fill a static sparse tree (drafter/medusa_tree.h), nodes in the tree's order until the
// draft budget is spent. Drafts are deterministic, so the verifier's rules for deterministic
// tree drafts keep greedy output identical and sampled output exact, as for ReDrafter.
#pragma once

#include <vector>

#include "drafter/medusa_heads.h"
#include "drafter/medusa_tree.h"
#include "speculative/proposer.h"

namespace specdec {

class ThreadPool;

class MedusaProposer final : public Proposer {
 public:
  // Throws specdec::Error when the tree needs more heads than there are.
  MedusaProposer(const MedusaHeads& heads, MedusaTree tree, ThreadPool* pool);
  const char* name() const override { return "medusa"; }
  bool wants_hidden() const override { return true; }
  void propose(const DraftRequest& request, TokenTree* tree) override;

 private:
  const MedusaHeads& heads_;
  MedusaTree shape_;
  ThreadPool* pool_;
  std::vector<float> logits_;              // [K, V_d]
  std::vector<float> scratch_;
  std::vector<std::vector<int32_t>> top_;  // [K][max rank] draft indices, best first
  std::vector<int32_t> node_of_path_;      // [paths] tree node of each path (-1: not added)
};

}  // namespace specdec
