#include "speculative/draft_decoder.h"

#include <algorithm>

#include "backend/cpu/ops.h"
#include "util/check.h"

namespace specdec {

void DraftDecoder::validate(const DraftModelConfig& config) {
  config.sampling.validate();
  if (config.p_min < 0 || config.p_min > 1) throw Error("--draft-p-min must be in [0, 1]");
  if (config.branch_top_k < 1) throw Error("draft branch top-k must be >= 1");
}

DraftDecoder::DraftDecoder(const DraftModelConfig& config)
    : config_(config), sampler_(config.sampling) {
  validate(config);
}

void DraftDecoder::begin(uint64_t seed) {
  SamplingParams params = config_.sampling;
  uint64_t x = seed ^ 0xd1b54a32d192ed03ull;  // a stream of its own, distinct from the target's
  params.seed = Rng::splitmix64(&x);
  sampler_ = Sampler(params);
}

void DraftDecoder::start(int max_tokens, double step_cost, double node_cost) {
  SPECDEC_CHECK(max_tokens >= 1, "a draft tree needs room for one token");
  max_tokens_ = max_tokens;
  const bool rules = step_cost > 0;
  min_gain_ = rules ? step_cost + node_cost : 0.0;
  min_node_gain_ = rules ? node_cost : 0.0;
  reach_ = 1.0;
  parent_ = 0;
  added_ = 0;
  depth_ = 0;
}

int32_t DraftDecoder::next(std::span<const float> logits, std::span<const int32_t> history,
                           TokenTree* tree) {
  if (added_ >= max_tokens_) return kStop;
  const int n_vocab = static_cast<int>(logits.size());
  ++depth_;
  // q: what a sampled draft is drawn from; for greedy drafting, the draft's plain softmax,
  // which measures its confidence and orders the branch alternatives.
  if (config_.sample) {
    sampler_.distribution(logits, history, &q_);
  } else {
    q_.assign(logits.begin(), logits.end());
    softmax(q_.data(), n_vocab);
  }
  const int32_t best = static_cast<int32_t>(std::max_element(q_.begin(), q_.end()) - q_.begin());
  if (q_[best] < config_.p_min) return kStop;
  int32_t token;
  int node;
  if (config_.sample) {
    token = sampler_.sample(logits, history);
    node = tree->add(parent_, token, tree->add_dist(q_));
  } else {
    token = best;
    node = tree->add(parent_, token);
  }
  ++added_;
  if (depth_ <= config_.branch_levels && config_.branch_top_k > 1) {
    // Next-best alternatives as deterministic leaf siblings.
    order_.resize(n_vocab);
    for (int i = 0; i < n_vocab; ++i) order_[i] = i;
    const int k = std::min(config_.branch_top_k, n_vocab);
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), [&](int32_t a, int32_t b) {
      return q_[a] > q_[b] || (q_[a] == q_[b] && a < b);
    });
    for (int i = 0; i < k && added_ < max_tokens_; ++i) {
      if (order_[i] == token || q_[order_[i]] <= 0) continue;
      // In order of q: the first one not worth its node ends the alternatives (reach_ is the
      // parent's here).
      if (min_node_gain_ > 0 && reach_ * q_[order_[i]] < min_node_gain_) break;
      tree->add(parent_, order_[i]);
      ++added_;
    }
  }
  parent_ = node;
  if (added_ >= max_tokens_) return kStop;
  reach_ *= q_[token];
  if (min_gain_ > 0 && reach_ * q_[token] < min_gain_) return kStop;
  return token;
}

int draft_room(int64_t capacity, size_t n_tokens, int max_tokens) {
  return static_cast<int>(std::min<int64_t>(max_tokens, capacity - static_cast<int64_t>(n_tokens)));
}

int64_t draft_cache_keeps(std::span<const int32_t> cached, std::span<const int32_t> tokens) {
  const size_t n = tokens.size();
  size_t common = 0;
  while (common < cached.size() && common + 1 < n && cached[common] == tokens[common]) ++common;
  return static_cast<int64_t>(common);
}

int64_t plan_draft_catch_up(DraftCache* cache, std::span<const int32_t> tokens, int64_t n_prompt,
                            int window, std::vector<int32_t>* run) {
  SPECDEC_CHECK(!tokens.empty(), "a draft catch-up needs a history");
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t keep = draft_cache_keeps(cache->tokens, tokens);
  // A gap reaching past what stays is cut at it (or vanishes).
  if (cache->gap_end > keep) cache->gap_end = std::max(cache->gap_begin, keep);
  if (cache->gap_end == cache->gap_begin) cache->gap_begin = cache->gap_end = 0;
  int64_t run_begin = keep;  // positions [run_begin, skip_begin) and [skip_end, n) are run
  int64_t skip_begin = n, skip_end = n;
  const int64_t first_generated = std::max(keep, n_prompt);
  if (window > 0 && n - first_generated > window) {
    skip_end = n - window;
    if (cache->gap_end > cache->gap_begin) {
      // One gap at most: the old one grows over the tokens read after it and the new skip.
      keep = cache->gap_begin;
      skip_begin = cache->gap_begin;
      run_begin = skip_end;
    } else {
      skip_begin = first_generated;
    }
    cache->gap_begin = skip_begin;
    cache->gap_end = skip_end;
  }
  run->clear();
  for (int64_t p = run_begin; p < n; ++p) {
    if (p == skip_begin) p = skip_end;
    run->push_back(static_cast<int32_t>(p));
  }
  cache->tokens.assign(tokens.begin(), tokens.end());
  // The slots of positions [0, keep) outside the gap.
  return keep - std::max<int64_t>(0, std::min(cache->gap_end, keep) - cache->gap_begin);
}

}  // namespace specdec
