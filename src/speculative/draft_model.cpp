#include "speculative/draft_model.h"

#include <algorithm>

#include <fmt/format.h>

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

int64_t draft_context(const Model& draft, int64_t ctx_size) {
  return std::min<int64_t>(ctx_size, draft.config().n_ctx_train);
}

DraftModelProposer::DraftModelProposer(Model& draft, const Model& target, ThreadPool* pool,
                                       int64_t ctx_size, const DraftModelConfig& config)
    : draft_(draft),
      pool_(pool),
      kv_(draft.make_kv_cache(draft_context(draft, ctx_size))),
      decoder_(config) {
  check_same_vocabulary(draft, target);
}

void DraftModelProposer::begin(std::span<const int32_t> prompt, uint64_t seed) {
  kv_.clear();
  cached_.clear();
  decoder_.begin(seed);
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
  const int64_t common = draft_cache_keeps(cached_, tokens);
  kv_.truncate(common);
  cached_.resize(static_cast<size_t>(common));
  const int64_t len = static_cast<int64_t>(tokens.size()) - common;
  positions_.resize(len);
  for (int64_t i = 0; i < len; ++i) positions_[i] = static_cast<int32_t>(common + i);
  const int32_t last = static_cast<int32_t>(len - 1);
  ForwardBatch b;
  b.tokens = tokens.subspan(static_cast<size_t>(common));
  b.positions = positions_;
  b.output_rows = {&last, 1};
  cached_.insert(cached_.end(), tokens.begin() + common, tokens.end());
  return draft_.forward(kv_, b, pool_).logits;
}

void DraftModelProposer::propose(const DraftRequest& request, TokenTree* tree) {
  const int max_tokens = draft_room(kv_.capacity(), request.tokens.size(), request.max_tokens);
  if (max_tokens <= 0) return;
  std::span<const float> logits = sync(request.tokens);
  decoder_.start(max_tokens);
  // cached_ is the draft's view of the sequence, with the chain's drafts appended.
  for (int32_t token; (token = decoder_.next(logits, cached_, tree)) != DraftDecoder::kStop;) {
    logits = step(token);
  }
  // The cache now holds the history and the chain's drafts but the last; sync() on the next call
  // keeps whatever prefix the target accepted.
}

}  // namespace specdec
