#include "speculative/draft_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/cpu/ops.h"
#include "model/gguf.h"
#include "util/check.h"

namespace specdec {

void check_same_vocabulary(const Model& draft, const Model& target) {
  const auto* dt = draft.file().get_string_array("tokenizer.ggml.tokens");
  const auto* tt = target.file().get_string_array("tokenizer.ggml.tokens");
  const std::string where =
      fmt::format("draft model {} and target model {}", draft.file().path(), target.file().path());
  if (!dt || !tt) throw Error(where + ": both need a token list to be compared");
  if (dt->size() != tt->size()) {
    throw Error(fmt::format("{} have different vocabularies ({} vs {} tokens); a draft model must "
                            "share the target's tokenizer",
                            where, dt->size(), tt->size()));
  }
  for (size_t i = 0; i < dt->size(); ++i) {
    if ((*dt)[i] != (*tt)[i]) {
      throw Error(fmt::format("{} have different vocabularies (token {} is '{}' vs '{}'); a draft "
                              "model must share the target's tokenizer",
                              where, i, (*dt)[i], (*tt)[i]));
    }
  }
}

DraftModelProposer::DraftModelProposer(Model& draft, const Model& target, ThreadPool* pool,
                                       int64_t ctx_size, const DraftModelConfig& config)
    : draft_(draft),
      pool_(pool),
      config_(config),
      kv_(draft.make_kv_cache(std::min<int64_t>(ctx_size, draft.config().n_ctx_train))),
      sampler_(config.sampling) {
  check_same_vocabulary(draft, target);
  if (config.p_min < 0 || config.p_min > 1) throw Error("--draft-p-min must be in [0, 1]");
  if (config.branch_top_k < 1) throw Error("draft branch top-k must be >= 1");
}

void DraftModelProposer::begin(std::span<const int32_t> prompt, uint64_t seed) {
  kv_.clear();
  cached_.clear();
  SamplingParams params = config_.sampling;
  uint64_t x = seed ^ 0xd1b54a32d192ed03ull;  // a stream of its own, distinct from the target's
  params.seed = Rng::splitmix64(&x);
  sampler_ = Sampler(params);
}

std::span<const float> DraftModelProposer::step(int32_t token) {
  const int32_t pos = static_cast<int32_t>(kv_.size());
  const int32_t row = 0;
  ForwardBatch b;
  b.tokens = {&token, 1};
  b.positions = {&pos, 1};
  b.output_rows = {&row, 1};
  cached_.push_back(token);
  return draft_.forward(kv_, b, pool_).logits;
}

std::span<const float> DraftModelProposer::sync(std::span<const int32_t> tokens) {
  const size_t n = tokens.size();
  size_t common = 0;
  while (common < cached_.size() && common + 1 < n && cached_[common] == tokens[common]) ++common;
  kv_.truncate(static_cast<int64_t>(common));
  cached_.resize(common);
  const int64_t len = static_cast<int64_t>(n - common);
  positions_.resize(len);
  for (int64_t i = 0; i < len; ++i) positions_[i] = static_cast<int32_t>(common + i);
  const int32_t last = static_cast<int32_t>(len - 1);
  ForwardBatch b;
  b.tokens = tokens.subspan(common);
  b.positions = positions_;
  b.output_rows = {&last, 1};
  cached_.insert(cached_.end(), tokens.begin() + common, tokens.end());
  return draft_.forward(kv_, b, pool_).logits;
}

void DraftModelProposer::propose(const DraftRequest& request, TokenTree* tree) {
  const int64_t n = static_cast<int64_t>(request.tokens.size());
  // Room in the draft's own (possibly shorter) context for the history and the drafts.
  const int64_t room = kv_.capacity() - n;
  const int max_tokens = static_cast<int>(std::min<int64_t>(request.max_tokens, room));
  if (max_tokens <= 0) return;
  std::span<const float> logits = sync(request.tokens);
  const int n_vocab = draft_.config().n_vocab;
  std::vector<int32_t>& hist = cached_;  // the draft's view of the sequence, drafts appended
  int parent = 0;
  int added = 0;
  for (int depth = 1; added < max_tokens; ++depth) {
    // q: what a sampled draft is drawn from; for greedy drafting, the draft's plain softmax,
    // which measures its confidence and orders the branch alternatives.
    if (config_.sample) {
      sampler_.distribution(logits, hist, &q_);
    } else {
      q_.assign(logits.begin(), logits.end());
      softmax(q_.data(), n_vocab);
    }
    const int32_t best = static_cast<int32_t>(std::max_element(q_.begin(), q_.end()) - q_.begin());
    if (q_[best] < config_.p_min) break;
    int32_t token;
    int node;
    if (config_.sample) {
      token = sampler_.sample(logits, hist);
      node = tree->add(parent, token, tree->add_dist(q_));
    } else {
      token = best;
      node = tree->add(parent, token);
    }
    ++added;
    if (depth <= config_.branch_levels && config_.branch_top_k > 1) {
      // Next-best alternatives as deterministic leaf siblings.
      order_.resize(n_vocab);
      for (int i = 0; i < n_vocab; ++i) order_[i] = i;
      const int k = std::min(config_.branch_top_k, n_vocab);
      std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                        [&](int32_t a, int32_t b) { return q_[a] > q_[b] || (q_[a] == q_[b] && a < b); });
      for (int i = 0; i < k && added < max_tokens; ++i) {
        if (order_[i] == token || q_[order_[i]] <= 0) continue;
        tree->add(parent, order_[i]);
        ++added;
      }
    }
    parent = node;
    if (added >= max_tokens) break;
    logits = step(token);
  }
  // The cache now holds the history and the chain's drafts but the last; sync() on the next call
  // keeps whatever prefix the target accepted.
}

}  // namespace specdec
