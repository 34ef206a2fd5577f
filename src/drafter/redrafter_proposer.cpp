#include "drafter/redrafter_proposer.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "speculative/ngram.h"
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
  for (auto& by_depth : lookup_accept_) by_depth.fill(kLookupPrior);
  lookup_kept_ = lookup_n_ = 0;
}

void ReDrafterProposer::add_lookup(std::span<const int32_t> tokens, int max_len) {
  lookup_n_ = 0;
  const NgramMatch m = find_ngram_continuation(tokens, 1, kLookupMaxN, max_len);
  if (m.length == 0) return;
  lookup_n_ = m.n;
  int node = 0;
  for (int k = 0; k < m.length; ++k) {
    const int32_t token = tokens[static_cast<size_t>(m.start + k)];
    int next = full_.child(node, token);
    if (next < 0) {
      next = full_.add(node, token);
      is_beam_.push_back(0);
      is_lookup_.push_back(0);
    }
    is_lookup_[static_cast<size_t>(next)] = 1;
    node = next;
  }
}

void ReDrafterProposer::propose(const DraftRequest& request, TokenTree* tree) {
  BeamJob job;
  if (prepare(request, &job)) search_.run_batch({&job, 1}, pool_);
  finish(request, tree);
}

bool ReDrafterProposer::prepare(const DraftRequest& request, BeamJob* job) {
  drafted_ = false;
  active_ = search_step_ = false;
  if (request.target_hidden.empty() || request.max_tokens <= 0 || request.tokens.empty()) {
    return false;
  }
  const bool prune = policy_.prune && request.node_cost > 0.0;
  bool search = true;
  if (prune && pause_left_ > 0) {
    if (--pause_left_ == 0) probe_ = true;
    search = false;
    if (policy_.lookup_max <= 0) return false;
  }
  BeamSearchConfig c = config_;
  c.length = std::min(c.length, request.max_tokens);
  if (prune) {
    const int deepest = *std::max_element(kept_depth_.begin(), kept_depth_.end());
    c.length = std::min(c.length, deepest + 1);
  }
  active_ = true;
  search_step_ = search;
  prune_step_ = prune;
  step_config_ = c;
  if (search) *job = BeamJob{request.target_hidden, request.tokens.back(), c, &beams_};
  return search;
}

void ReDrafterProposer::finish(const DraftRequest& request, TokenTree* tree) {
  if (!active_) return;
  active_ = false;
  const bool search = search_step_, prune = prune_step_;
  const BeamSearchConfig& c = step_config_;
  if (!prune) {
    pack_beams(beams_.tokens, beams_.n, beams_.length, request.max_tokens, tree);
    return;
  }
  // The candidates: every beam node (with its prefix score), then the lookup chain.
  full_.reset(request.tokens.back());
  if (search) {
    pack_beams(beams_.tokens, beams_.n, beams_.length, beams_.n * beams_.length, &full_, nullptr,
               beams_.prefix_scores, &node_scores_);
  }
  is_beam_.assign(static_cast<size_t>(full_.size()), 1);
  is_beam_[0] = 0;
  is_lookup_.assign(static_cast<size_t>(full_.size()), 0);
  if (policy_.lookup_max > 0) {
    add_lookup(request.tokens,
               std::min(std::min(policy_.lookup_max, request.max_tokens), kMaxDepth));
  }
  // Each node's calibrated chance, once; nodes by decreasing chance (ties: lower index first).
  const int n = full_.size();
  chance_.assign(static_cast<size_t>(n), 0.0);
  for (int i = 1; i < n; ++i) {
    const int d = std::min(full_.depth(i), kMaxDepth);
    if (is_beam_[i]) {
      const double calib =
          pred_sum_[d] > 0.5 ? std::clamp(acc_sum_[d] / pred_sum_[d], 0.02, 2.0) : 1.0;
      chance_[i] = std::exp(static_cast<double>(node_scores_[i])) * calib;
    }
    if (is_lookup_[i]) {
      double p = 1.0;
      for (int k = 1; k <= d; ++k) p *= lookup_accept_[lookup_n_][k];
      chance_[i] = std::max(chance_[i], p);
    }
  }
  order_.clear();
  for (int i = 1; i < n; ++i) order_.push_back(i);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int a, int b) { return chance_[a] > chance_[b]; });
  const double cost = request.node_cost;
  double gain = 1.0;
  double spent = 1.0 + (search ? draft_cost_ * request.cost_scale * c.length /
                                     std::max(1, config_.length)
                              : 0.0);
  kept_.assign(static_cast<size_t>(n), -1);  // [full_ node] >= 0 once taken; -1: not taken
  kept_[0] = 0;
  take_.clear();
  bool beam_taken = false;
  for (int i : order_) {
    if (static_cast<int>(take_.size()) >= request.max_tokens) break;
    const double p = chance_[i];
    // A probe takes at least the best beam node, so that the beams' calibration keeps learning.
    const bool probing = probe_ && search && !beam_taken;
    const bool forced = probing && is_beam_[i];
    if (!forced && p <= cost * gain / spent) {
      if (probing) continue;
      break;
    }
    // A deeper depth's calibration can lift a child above its parent: it waits for the parent.
    if (kept_[full_.parent(i)] < 0) continue;
    kept_[i] = 0;
    take_.push_back(i);
    beam_taken = beam_taken || is_beam_[i];
    gain += p;
    spent += cost;
  }
  if (search) {
    probe_ = false;
    int depth = 0;
    for (int i : take_) {
      if (is_beam_[i]) depth = std::max(depth, full_.depth(i));
    }
    kept_depth_[kept_depth_pos_] = depth;
    kept_depth_pos_ = (kept_depth_pos_ + 1) % kDepthWindow;
    // The search paid when the tree's expected tokens beat its cost (gain / spent > 1, plain
    // decoding's rate); one that did not counts as empty towards a pause.
    if (!beam_taken || gain <= spent) {
      if (++empty_streak_ >= kEmptyBeforePause) {
        pause_left_ = pause_;
        pause_ = std::min(2 * pause_, kMaxPause);
        empty_streak_ = 0;
      }
    } else {
      empty_streak_ = 0;
      pause_ = 4;
    }
  }
  if (take_.empty()) return;
  // Into `tree` in the full tree's (topological) order, kept_ becoming each node's place there;
  // the beams' raw predictions per depth. full_, kept_ and the source marks stay as they are
  // until observe().
  std::sort(take_.begin(), take_.end());
  predicted_.fill(0.0);
  lookup_kept_ = 0;
  for (int i : take_) {
    kept_[i] = tree->add(kept_[full_.parent(i)], full_.token(i));
    if (is_beam_[i]) {
      predicted_[std::min(full_.depth(i), kMaxDepth)] +=
          std::exp(static_cast<double>(node_scores_[i]));
    }
    if (is_lookup_[i]) lookup_kept_ = std::max(lookup_kept_, full_.depth(i));
  }
  drafted_ = true;
}

void ReDrafterProposer::observe(std::span<const int32_t> accepted, int32_t bonus) {
  (void)bonus;
  if (!drafted_) return;
  const int a = static_cast<int>(accepted.size());
  // The accepted path through the drafted nodes of full_ (a token names at most one child):
  // whether its node at each depth came from a beam, and how far it followed the lookup chain.
  std::array<bool, kMaxDepth + 1> beam_at{};
  int lcp = 0;
  bool on_chain = true;
  int node = 0;
  for (int k = 0; k < a; ++k) {
    const int next = full_.child(node, accepted[static_cast<size_t>(k)]);
    if (next < 0 || kept_[next] < 0) break;  // not this tree's path (the verifier walks it)
    node = next;
    if (k + 1 <= kMaxDepth) beam_at[static_cast<size_t>(k + 1)] = is_beam_[node] != 0;
    on_chain = on_chain && is_lookup_[node] != 0;
    if (on_chain) ++lcp;
  }
  for (int d = 1; d <= kMaxDepth; ++d) {
    if (predicted_[d] <= 0.0) continue;
    pred_sum_[d] = (1.0 - kEma) * pred_sum_[d] + predicted_[d];
    acc_sum_[d] = (1.0 - kEma) * acc_sum_[d] + (a >= d && beam_at[d] ? 1.0 : 0.0);
  }
  // The lookup chain's kept prefix: depth i was tried when its parent was accepted.
  for (int i = 1; i <= std::min(lookup_kept_, lcp + 1); ++i) {
    double& r = lookup_accept_[lookup_n_][i];
    r = (1.0 - kLookupEma) * r + kLookupEma * (i <= lcp ? 1.0 : 0.0);
  }
  drafted_ = false;
}

}  // namespace specdec
