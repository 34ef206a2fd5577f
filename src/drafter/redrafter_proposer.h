// ReDrafter as a Proposer: from the target's hidden state before the root (DraftRequest::
// target_hidden) the head's beam search drafts M beams of C tokens, packed into one prefix tree
// that the target verifies in one pass. The verifier then walks the tree: greedy follows the
// target's own choice (the longest accepted beam prefix is kept, plus the target's token);
// sampled decoding treats the beams as deterministic drafts (accept x with probability p(x),
// else remove x and renormalize), which is exactly the target's distribution - unlike
// Apple's acceptance rule, which uses the beams' draft probabilities although beams are not
// samples.
//
// Which nodes are worth verifying (the adaptive tree; deterministic, no clock): node i's chance
// of being accepted is estimated as p_i = exp(prefix score) * calib[depth], calib being the
// running ratio of accepted to predicted per depth (observe()). With the request's node cost c
// (one more token in the pass, in target passes) and the beam search's own cost d, the tree
// that maximises expected tokens / cost takes nodes by decreasing p while
//   p_i > c * (1 + sum of p taken) / (1 + d + c * nodes taken)
// (a node raises the ratio exactly when its p/c beats the ratio so far). In an engine batch, d
// is weighed by the step's DraftRequest::cost_scale, as c is. When no node is worth it, or the
// ratio ends at or below 1 (the search and its nodes cost more than their expected tokens:
// plain decoding would do better), several times in a row, drafting pauses for a while
// (doubling up to 64 steps) and then
// probes with at least its best node, so that the calibration keeps learning. The search itself
// goes one step deeper than the deepest node kept in the last 8 drafting steps (at most C),
// so that its cost follows what the tree uses.
//
// Prompt lookup in the same tree (policy.lookup_max > 0): the head has not learned to copy, so
// where the answer repeats the input (summaries, retrieval-augmented answers, a small model's
// "translation", code edits) it drafts little. The continuation of the longest recent suffix
// match (n-gram, n = 4 down to 1; find_ngram_continuation) enters the same candidate tree,
// sharing nodes with beams that draft the same tokens, and competes for the same budget by the
// same rule: a lookup node at depth d has the chance prod_{i<=d} a[n][i], a being the running
// rate at which the lookup's draft at depth i was accepted after its parent was, for matches of
// n tokens (a shared node takes the larger of its two chances). Lookup costs no search, so it
// also runs while the beam search pauses. The beams' calibration counts only acceptances of beam
// nodes; a probe forces the best beam node.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "drafter/beam_search.h"
#include "drafter/beam_tree.h"
#include "drafter/redrafter_head.h"
#include "speculative/proposer.h"

namespace specdec {

class Model;
class ThreadPool;

struct ReDrafterPolicy {
  bool prune = true;  // the adaptive tree above (off: every beam node, up to the budget)
  int lookup_max = 8;  // prompt-lookup drafts at most (0: none); with the adaptive tree only
};

class ReDrafterProposer final : public Proposer {
 public:
  // head and target outlive the proposer; pool may be null. beams.length is the deepest draft.
  ReDrafterProposer(const ReDrafterHead& head, const Model& target, ThreadPool* pool,
                    const BeamSearchConfig& beams, const ReDrafterPolicy& policy = {});
  const char* name() const override { return "redrafter"; }
  bool wants_hidden() const override { return true; }
  void begin(std::span<const int32_t> prompt, uint64_t seed) override;
  // Drafts at most request.max_tokens tree nodes; nothing without a hidden state.
  // = prepare(), the search if it asks for one, finish().
  void propose(const DraftRequest& request, TokenTree* tree) override;

  // propose() in two halves, so that an engine can run the searches of many sequences as one
  // batch (ReDrafterBeamSearch::run_batch): prepare() decides whether this step searches and
  // fills *job (its out: this proposer's own beams) if so; the caller runs the job with the
  // same head, then calls finish() with the same request. Exactly propose()'s drafts.
  bool prepare(const DraftRequest& request, BeamJob* job);
  void finish(const DraftRequest& request, TokenTree* tree);
  void observe(std::span<const int32_t> accepted, int32_t bonus) override;

  // The beam search's cost in target passes (head bytes streamed over C steps / target bytes).
  double draft_cost() const { return draft_cost_; }

 private:
  static constexpr int kMaxDepth = 16;
  static constexpr int kLookupMaxN = 4;        // longest suffix matched
  static constexpr double kLookupPrior = 0.4;  // a[n][i] before any observation
  static constexpr double kLookupEma = 0.1;

  // Adds the lookup chain under full_'s root, after the beams' nodes: a token a beam drafted
  // marks that node, the others become new nodes (no beam score).
  void add_lookup(std::span<const int32_t> tokens, int max_len);
  static constexpr int kEmptyBeforePause = 3;
  static constexpr int kMaxPause = 64;
  static constexpr double kEma = 0.05;

  ThreadPool* pool_;
  BeamSearchConfig config_;
  // prepare()'s decisions for finish(): whether this step drafts at all, whether it searched,
  // the search's shape, and whether the tree is pruned.
  bool active_ = false, search_step_ = false, prune_step_ = false;
  BeamSearchConfig step_config_;
  ReDrafterPolicy policy_;
  double draft_cost_ = 0.0;
  ReDrafterBeamSearch search_;
  Beams beams_;
  TokenTree full_;                  // every beam node
  std::vector<float> node_scores_;  // [full_ nodes] prefix log-probabilities
  std::vector<double> chance_;         // [full_ nodes] calibrated chance of acceptance
  std::vector<int32_t> order_, take_;  // nodes by chance; those taken
  std::vector<int32_t> kept_;          // [full_ nodes] node in the output tree, -1: not taken
  std::vector<uint8_t> is_beam_, is_lookup_;  // [full_ nodes] which sources drafted the node
  // Prompt lookup: how much of the last chain the tree kept (a prefix of it), the match's n,
  // and the acceptance rates [n][depth].
  int lookup_kept_ = 0, lookup_n_ = 0;
  std::array<std::array<double, kMaxDepth + 1>, kLookupMaxN + 1> lookup_accept_{};
  // The last tree's drafts: [depth] sum of raw p (for the calibration), and whether any.
  std::array<double, kMaxDepth + 1> predicted_{};
  bool drafted_ = false;
  // Calibration: [depth] running sums of predicted and accepted.
  std::array<double, kMaxDepth + 1> pred_sum_{}, acc_sum_{};
  int empty_streak_ = 0, pause_left_ = 0, pause_ = 4;
  static constexpr int kDepthWindow = 8;
  std::array<int, kDepthWindow> kept_depth_{};  // deepest node kept, last drafting steps
  int kept_depth_pos_ = 0;
  bool probe_ = false;
};

}  // namespace specdec
