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
  const BeamJob job{h, root, c, out};
  run_batch({&job, 1}, pool);
}

void ReDrafterBeamSearch::run_batch(std::span<const BeamJob> jobs, ThreadPool* pool) {
  const ReDrafterShape& sh = head_.shape();
  const int dim = sh.dim, s = sh.state_dim, vd = sh.n_draft_vocab;
  const int in_w = dim + s;
  jobs_.resize(jobs.size());
  int max_len = 0, max_rows = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const BeamJob& job = jobs[j];
    SPECDEC_CHECK(static_cast<int>(job.h.size()) == dim, "ReDrafterBeamSearch: hidden size");
    JobState& js = jobs_[j];
    js.m = std::max(1, std::min(job.config.beams, vd));
    js.len = std::max(0, job.config.length);
    js.live = 1;
    js.state.assign(static_cast<size_t>(js.m) * s, 0.0f);
    js.draft.assign(static_cast<size_t>(js.m) * js.len, 0);
    js.score.assign(static_cast<size_t>(js.m), 0.0f);
    js.prefix.assign(static_cast<size_t>(js.m) * js.len, 0.0f);
    js.last_tok.assign(static_cast<size_t>(js.m), job.root);
    max_len = std::max(max_len, js.len);
    max_rows += js.m;
  }
  in_.resize(static_cast<size_t>(max_rows) * in_w);
  h_rows_.resize(static_cast<size_t>(max_rows));
  s_out_.resize(static_cast<size_t>(max_rows) * s);
  logits_.resize(static_cast<size_t>(max_rows) * vd);
  for (int k = 0; k < max_len; ++k) {
    // This step's rows: the live beams of every job at least k + 1 deep, job by job.
    int rows = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      JobState& js = jobs_[j];
      js.row0 = rows;
      if (k >= js.len) continue;
      for (int r = 0; r < js.live; ++r, ++rows) {
        float* row = in_.data() + static_cast<size_t>(rows) * in_w;
        target_.embed_tokens({&js.last_tok[r], 1}, row);
        std::copy_n(js.state.data() + static_cast<size_t>(r) * s, s, row + dim);
        h_rows_[static_cast<size_t>(rows)] = jobs[j].h.data();
      }
    }
    head_.step_rows(h_rows_.data(), in_.data(), rows, s_out_.data(), logits_.data(), &scratch_,
                    pool);
    for (JobState& js : jobs_) {
      if (k < js.len) advance(js, k);
    }
  }
  const std::span<const int32_t> vocab = head_.draft_vocab();
  for (size_t j = 0; j < jobs.size(); ++j) {
    const JobState& js = jobs_[j];
    Beams* out = jobs[j].out;
    out->length = js.len;
    out->n = js.len == 0 ? 0 : js.live;
    out->tokens.resize(static_cast<size_t>(out->n) * js.len);
    for (int i = 0; i < out->n * js.len; ++i) out->tokens[i] = vocab[js.draft[i]];
    out->scores.assign(js.score.begin(), js.score.begin() + out->n);
    out->prefix_scores.assign(js.prefix.begin(),
                              js.prefix.begin() + static_cast<size_t>(out->n) * js.len);
  }
}

void ReDrafterBeamSearch::advance(JobState& js, int k) {
  const ReDrafterShape& sh = head_.shape();
  const int s = sh.state_dim, vd = sh.n_draft_vocab, len = js.len, m = js.m;
  const std::span<const int32_t> vocab = head_.draft_vocab();
  cands_.clear();
  for (int r = 0; r < js.live; ++r) {
    float* lg = logits_.data() + static_cast<size_t>(js.row0 + r) * vd;
    top_k(lg, vd, m, &best_);
    const float lse = log_sum_exp_inplace(lg, vd);  // the row is spent after this
    for (const auto& [v, idx] : best_) cands_.push_back({js.score[r] + (v - lse), r, idx});
  }
  std::stable_sort(cands_.begin(), cands_.end(),
                   [](const Cand& a, const Cand& b) { return a.score > b.score; });
  const int next = std::min<int>(m, static_cast<int>(cands_.size()));
  next_draft_.resize(static_cast<size_t>(m) * len);
  next_prefix_.resize(static_cast<size_t>(m) * len);
  next_state_.resize(static_cast<size_t>(m) * s);
  for (int b = 0; b < next; ++b) {
    const Cand& cd = cands_[b];
    std::copy_n(js.draft.data() + static_cast<size_t>(cd.row) * len, k,
                next_draft_.data() + static_cast<size_t>(b) * len);
    next_draft_[static_cast<size_t>(b) * len + k] = cd.v;
    std::copy_n(js.prefix.data() + static_cast<size_t>(cd.row) * len, k,
                next_prefix_.data() + static_cast<size_t>(b) * len);
    next_prefix_[static_cast<size_t>(b) * len + k] = cd.score;
    std::copy_n(s_out_.data() + static_cast<size_t>(js.row0 + cd.row) * s, s,
                next_state_.data() + static_cast<size_t>(b) * s);
    js.score[b] = cd.score;
    js.last_tok[b] = vocab[cd.v];
  }
  std::swap(js.draft, next_draft_);
  std::swap(js.prefix, next_prefix_);
  std::swap(js.state, next_state_);
  js.live = next;
}

}  // namespace specdec
