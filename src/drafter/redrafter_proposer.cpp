#include "drafter/redrafter_proposer.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "util/check.h"

namespace specdec {

ReDrafterProposer::ReDrafterProposer(const ReDrafterHead& head, const Model& target,
                                     ThreadPool* pool, const BeamSearchConfig& beams,
                                     const ReDrafterPolicy& policy)
    : pool_(pool), config_(beams), policy_(policy), search_(head, target) {
  draft_cost_ = static_cast<double>(head.weight_bytes()) * std::max(1, beams.length) /
                static_cast<double>(std::max<int64_t>(1, target.weight_bytes()));
  kept_depth_.fill(kMaxDepth);
}

void ReDrafterProposer::begin(std::span<const int32_t> prompt, uint64_t seed) {
  (void)prompt;
  (void)seed;
  predicted_.fill(0.0);
  drafted_ = false;
  pred_sum_.fill(0.0);
  acc_sum_.fill(0.0);
  empty_streak_ = 0;
  pause_left_ = 0;
  pause_ = 4;
  probe_ = false;
  kept_depth_.fill(kMaxDepth);  // the full length until the tree says otherwise
  kept_depth_pos_ = 0;
}

void ReDrafterProposer::propose(const DraftRequest& request, TokenTree* tree) {
  drafted_ = false;
  if (request.target_hidden.empty() || request.max_tokens <= 0 || request.tokens.empty()) return;
  const bool prune = policy_.prune && request.node_cost > 0.0;
  if (prune && pause_left_ > 0) {
    if (--pause_left_ == 0) probe_ = true;
    return;
  }
  BeamSearchConfig c = config_;
  c.length = std::min(c.length, request.max_tokens);
  if (prune) {
    const int deepest = *std::max_element(kept_depth_.begin(), kept_depth_.end());
    c.length = std::min(c.length, deepest + 1);
  }
  search_.run(request.target_hidden, request.tokens.back(), c, &beams_, pool_);
  if (!prune) {
    pack_beams(beams_.tokens, beams_.n, beams_.length, request.max_tokens, tree);
    return;
  }
  full_.reset(request.tokens.back());
  pack_beams(beams_.tokens, beams_.n, beams_.length, beams_.n * beams_.length, &full_, nullptr,
             beams_.prefix_scores, &node_scores_);
  // Each node's calibrated chance, once; nodes by decreasing chance (ties: lower index first).
  const int n = full_.size();
  chance_.resize(static_cast<size_t>(n));
  for (int i = 1; i < n; ++i) {
    const int d = std::min(full_.depth(i), kMaxDepth);
    const double calib = pred_sum_[d] > 0.5 ? std::clamp(acc_sum_[d] / pred_sum_[d], 0.02, 2.0) : 1.0;
    chance_[i] = std::exp(static_cast<double>(node_scores_[i])) * calib;
  }
  order_.clear();
  for (int i = 1; i < n; ++i) order_.push_back(i);
  std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) { return chance_[a] > chance_[b]; });
  const double cost = request.node_cost;
  double gain = 1.0;
  double spent = 1.0 + draft_cost_ * c.length / std::max(1, config_.length);
  kept_.assign(static_cast<size_t>(n), -1);  // [full_ node] >= 0 once taken; -1: not taken
  kept_[0] = 0;
  take_.clear();
  for (int i : order_) {
    if (static_cast<int>(take_.size()) >= request.max_tokens) break;
    const double p = chance_[i];
    const bool forced = probe_ && take_.empty();
    if (!forced && p <= cost * gain / spent) break;
    // A deeper depth's calibration can lift a child above its parent: it waits for the parent.
    if (kept_[full_.parent(i)] < 0) continue;
    kept_[i] = 0;
    take_.push_back(i);
    gain += p;
    spent += cost;
  }
  probe_ = false;
  int depth = 0;
  for (int i : take_) depth = std::max(depth, full_.depth(i));
  kept_depth_[kept_depth_pos_] = depth;
  kept_depth_pos_ = (kept_depth_pos_ + 1) % kDepthWindow;
  if (take_.empty()) {
    if (++empty_streak_ >= kEmptyBeforePause) {
      pause_left_ = pause_;
      pause_ = std::min(2 * pause_, kMaxPause);
      empty_streak_ = 0;
    }
    return;
  }
  empty_streak_ = 0;
  pause_ = 4;
  // Into `tree` in the full tree's (topological) order, kept_ becoming each node's place there;
  // the raw predictions per depth.
  std::sort(take_.begin(), take_.end());
  predicted_.fill(0.0);
  for (int i : take_) {
    kept_[i] = tree->add(kept_[full_.parent(i)], full_.token(i));
    predicted_[std::min(full_.depth(i), kMaxDepth)] += std::exp(static_cast<double>(node_scores_[i]));
  }
  drafted_ = true;
}

void ReDrafterProposer::observe(std::span<const int32_t> accepted, int32_t bonus) {
  (void)bonus;
  if (!drafted_) return;
  const int a = static_cast<int>(accepted.size());
  for (int d = 1; d <= kMaxDepth; ++d) {
    if (predicted_[d] <= 0.0) continue;
    pred_sum_[d] = (1.0 - kEma) * pred_sum_[d] + predicted_[d];
    acc_sum_[d] = (1.0 - kEma) * acc_sum_[d] + (a >= d ? 1.0 : 0.0);
  }
  drafted_ = false;
}

}  // namespace specdec
