#include "drafter/beam_search.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec {

namespace {

// The k largest entries of x[n] as (value, index), best first, ties to the lower index.
void top_k(const float* x, int n, int k, std::vector<std::pair<float, int32_t>>* out) {
  out->clear();
  for (int i = 0; i < n; ++i) {
    if (static_cast<int>(out->size()) == k && x[i] <= out->back().first) continue;
    auto it = std::upper_bound(out->begin(), out->end(), x[i],
                               [](float v, const std::pair<float, int32_t>& e) { return v > e.first; });
    out->insert(it, {x[i], i});
    if (static_cast<int>(out->size()) > k) out->pop_back();
  }
}

}  // namespace

ReDrafterBeamSearch::ReDrafterBeamSearch(const ReDrafterHead& head, const Model& target)
    : head_(head), target_(target) {}

void ReDrafterBeamSearch::run(std::span<const float> h, int32_t root, const BeamSearchConfig& c,
                              Beams* out, ThreadPool* pool) {
  const ReDrafterShape& sh = head_.shape();
  const int dim = sh.dim, s = sh.state_dim, vd = sh.n_draft_vocab;
  const int in_w = dim + s;
  const int m = std::max(1, std::min(c.beams, vd));
  const int len = std::max(0, c.length);
  out->n = 0;
  out->length = len;
  out->tokens.clear();
  out->scores.clear();
  if (len == 0) return;
  const std::span<const int32_t> vocab = head_.draft_vocab();
  in_.assign(static_cast<size_t>(m) * in_w, 0.0f);
  s_out_.resize(static_cast<size_t>(m) * s);
  logits_.resize(static_cast<size_t>(m) * vd);
  state_.assign(static_cast<size_t>(m) * s, 0.0f);
  next_state_.resize(static_cast<size_t>(m) * s);
  draft_.assign(static_cast<size_t>(m) * len, 0);
  next_draft_.resize(static_cast<size_t>(m) * len);
  score_.assign(static_cast<size_t>(m), 0.0f);
  prefix_.assign(static_cast<size_t>(m) * len, 0.0f);
  next_prefix_.resize(static_cast<size_t>(m) * len);
  last_tok_.assign(static_cast<size_t>(m), root);
  std::vector<std::pair<float, int32_t>> best;
  int live = 1;  // rows of the current step
  for (int k = 0; k < len; ++k) {
    for (int r = 0; r < live; ++r) {
      float* row = in_.data() + static_cast<size_t>(r) * in_w;
      target_.embed_tokens({&last_tok_[r], 1}, row);
      std::copy_n(state_.data() + static_cast<size_t>(r) * s, s, row + dim);
    }
    head_.step(h, in_.data(), live, s_out_.data(), logits_.data(), &scratch_, pool);
    cands_.clear();
    for (int r = 0; r < live; ++r) {
      float* lg = logits_.data() + static_cast<size_t>(r) * vd;
      top_k(lg, vd, m, &best);
      const float lse = log_sum_exp_inplace(lg, vd);  // the row is spent after this
      for (const auto& [v, idx] : best) cands_.push_back({score_[r] + (v - lse), r, idx});
    }
    std::stable_sort(cands_.begin(), cands_.end(),
                     [](const Cand& a, const Cand& b) { return a.score > b.score; });
    const int next = std::min<int>(m, static_cast<int>(cands_.size()));
    for (int b = 0; b < next; ++b) {
      const Cand& cd = cands_[b];
      std::copy_n(draft_.data() + static_cast<size_t>(cd.row) * len, k,
                  next_draft_.data() + static_cast<size_t>(b) * len);
      next_draft_[static_cast<size_t>(b) * len + k] = cd.v;
      std::copy_n(prefix_.data() + static_cast<size_t>(cd.row) * len, k,
                  next_prefix_.data() + static_cast<size_t>(b) * len);
      next_prefix_[static_cast<size_t>(b) * len + k] = cd.score;
      std::copy_n(s_out_.data() + static_cast<size_t>(cd.row) * s, s,
                  next_state_.data() + static_cast<size_t>(b) * s);
      score_[b] = cd.score;
      last_tok_[b] = vocab[cd.v];
    }
    std::swap(draft_, next_draft_);
    std::swap(prefix_, next_prefix_);
    std::swap(state_, next_state_);
    live = next;
  }
  out->n = live;
  out->tokens.resize(static_cast<size_t>(live) * len);
  for (int i = 0; i < live * len; ++i) out->tokens[i] = vocab[draft_[i]];
  out->scores.assign(score_.begin(), score_.begin() + live);
  out->prefix_scores.assign(prefix_.begin(), prefix_.begin() + static_cast<size_t>(live) * len);
}

}  // namespace specdec
