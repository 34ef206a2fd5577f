#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "util/check.h"

namespace specdec {
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

Generator::Generator(Model& model, ThreadPool* pool, int64_t ctx_size, KvType kv_type)
    : model_(model), pool_(pool), kv_(model.make_kv_cache(ctx_size, kv_type)) {}

std::vector<int32_t> Generator::generate(std::span<const int32_t> prompt,
                                         const GenerationConfig& config,
                                         const TokenCallback& on_token, GenerationStats* stats) {
  GenerationStats local;
  GenerationStats& st = stats ? *stats : local;
  st = GenerationStats{};
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0) throw Error("the prompt is empty (no tokens)");
  if (n_prompt >= kv_.capacity()) {
    throw Error(fmt::format("the prompt has {} tokens but the context holds {} (prompt plus at "
                            "least one generated token); shorten the prompt or raise --ctx-size",
                            n_prompt, kv_.capacity()));
  }
  Sampler sampler(config.sampling);
  Proposer* proposer = config.proposer;
  DraftLengthController draft_length(config.draft);
  const bool want_hidden = proposer && proposer->wants_hidden();
  const int n_vocab = model_.config().n_vocab;
  kv_.clear();
  st.n_prompt = n_prompt;
  // The proposer's own prompt processing (a draft model reads the prompt) is part of the
  // prefill: it is timed with it.
  double t0 = now_seconds();
  if (proposer) proposer->begin(prompt, config.sampling.seed);

  std::vector<int32_t> history(prompt.begin(), prompt.end());  // prompt + generated
  std::vector<int32_t> out;
  std::vector<float> logits =
      prefill(model_, kv_, prompt, config.prefill_chunk, pool_, want_hidden ? &hidden_ : nullptr);
  st.prefill_seconds = now_seconds() - t0;
  t0 = now_seconds();
  if (config.max_new_tokens <= 0) return out;

  // Emits one token; returns false when generation must end with it.
  auto emit = [&](int32_t token) {
    out.push_back(token);
    history.push_back(token);
    const bool keep_going = !on_token || on_token(token);
    if (std::find(config.stop_tokens.begin(), config.stop_tokens.end(), token) !=
        config.stop_tokens.end()) {
      st.finish = FinishReason::kStop;
      return false;
    }
    if (!keep_going) {
      st.finish = FinishReason::kCancelled;
      return false;
    }
    if (static_cast<int>(out.size()) >= config.max_new_tokens) {
      st.finish = FinishReason::kLength;
      return false;
    }
    return true;
  };

  // The first token comes from the prompt's logits, exactly as in plain decoding.
  bool running = emit(sampler.sample(logits, history));
  while (running) {
    const int64_t past = kv_.size();
    if (past >= kv_.capacity()) {
      st.finish = FinishReason::kContext;
      break;
    }
    // 1. Draft under the root (the last emitted token, not yet in the cache).
    tree_.reset(history.back());
    int budget = proposer ? draft_length.next_length() : 0;
    budget = static_cast<int>(std::min<int64_t>(
        {budget, kv_.capacity() - past - 1, config.max_new_tokens - static_cast<int64_t>(out.size()) - 1}));
    const double td = now_seconds();
    if (budget > 0) {
      DraftRequest req;
      req.tokens = history;
      req.max_tokens = budget;
      if (want_hidden) req.target_hidden = hidden_;
      req.node_cost = config.verify_token_cost;
      if (config.draft.adaptive) req.draft_step_cost = config.draft_token_cost;
      proposer->propose(req, &tree_);
      SPECDEC_CHECK(tree_.num_drafts() <= budget, "proposer exceeded its draft budget");
    }
    st.draft_seconds += now_seconds() - td;  // reported only; no policy reads it

    // 2. One target pass over the whole tree.
    const int n = tree_.size();
    tree_.build_positions(past, &positions_);
    rows_.resize(n);
    for (int i = 0; i < n; ++i) rows_[i] = i;
    ForwardBatch batch;
    batch.tokens = tree_.tokens();
    batch.positions = positions_;
    if (!tree_.is_chain()) {
      tree_.build_mask(&mask_);
      batch.mask = mask_;
    }
    batch.output_rows = rows_;
    batch.want_hidden = want_hidden;
    const ForwardResult r = model_.forward(kv_, batch, pool_);
    ++st.n_forward_passes;

    // 3. Verify: accepted drafts plus the target's own token. An error here (non-finite logits)
    // leaves the cache as it was before the pass: the prompt and the tokens emitted so far.
    try {
      verifier_.verify(tree_, r.logits, n_vocab, history, sampler, &verdict_);
    } catch (...) {
      kv_.truncate(past);
      throw;
    }
    const int n_acc = static_cast<int>(verdict_.accepted_nodes.size());
    if (n > 1) {
      ++st.n_spec_passes;
      st.n_drafted += n - 1;
      st.n_accepted += n_acc;
      for (int p = 0; p < std::min(n_acc, GenerationStats::kPositions); ++p) ++st.accepted_at[p];
    }
    if (proposer) {
      const double pass_cost = 1.0 + config.verify_token_cost * (n - 1);
      draft_length.record(n - 1, n_acc, config.draft_token_cost * (n - 1), pass_cost,
                          tree_.max_depth());
    }

    // 4. The cache keeps the root and the accepted path, compacted into place.
    keep_.clear();
    keep_.push_back(past);
    for (int32_t node : verdict_.accepted_nodes) keep_.push_back(past + node);
    kv_.keep_slots(past, keep_);
    if (want_hidden) {
      const float* h = r.hidden.data() + static_cast<size_t>(verdict_.final_node) * model_.config().dim;
      hidden_.assign(h, h + model_.config().dim);
    }
    if (proposer) {
      proposer->observe({verdict_.tokens.data(), static_cast<size_t>(n_acc)}, verdict_.bonus);
    }
    for (int32_t token : verdict_.tokens) {
      running = emit(token);
      if (!running) break;
    }
  }
  st.decode_seconds = now_seconds() - t0;
  st.n_generated = static_cast<int64_t>(out.size());
  return out;
}

}  // namespace specdec
