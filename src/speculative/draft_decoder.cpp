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

void DraftDecoder::start(int max_tokens) {
  SPECDEC_CHECK(max_tokens >= 1, "a draft tree needs room for one token");
  max_tokens_ = max_tokens;
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
      tree->add(parent_, order_[i]);
      ++added_;
    }
  }
  parent_ = node;
  if (added_ >= max_tokens_) return kStop;
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

}  // namespace specdec
