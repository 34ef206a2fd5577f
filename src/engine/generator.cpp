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

std::vector<float> prefill(Model& model, KvCache& kv, std::span<const int32_t> prompt, int chunk,
                           ThreadPool* pool) {
  SPECDEC_CHECK(kv.size() == 0, "prefill needs an empty cache");
  SPECDEC_CHECK(chunk > 0, "prefill chunk must be positive");
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> positions;
  std::vector<float> last_logits;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min<int64_t>(chunk, n - begin);
    positions.resize(len);
    for (int64_t i = 0; i < len; ++i) positions[i] = static_cast<int32_t>(begin + i);
    const bool last = begin + len == n;
    const int32_t last_row = static_cast<int32_t>(len - 1);
    ForwardBatch batch;
    batch.tokens = prompt.subspan(begin, len);
    batch.positions = positions;
    if (last) batch.output_rows = {&last_row, 1};
    ForwardResult r = model.forward(kv, batch, pool);
    if (last) last_logits.assign(r.logits.begin(), r.logits.end());
  }
  return last_logits;
}

Generator::Generator(Model& model, ThreadPool* pool, int64_t ctx_size)
    : model_(model), pool_(pool), kv_(model.make_kv_cache(ctx_size)) {}

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
  config.sampling.validate();
  Sampler sampler(config.sampling);
  kv_.clear();
  st.n_prompt = n_prompt;

  std::vector<int32_t> history(prompt.begin(), prompt.end());  // prompt + generated
  std::vector<int32_t> out;
  double t0 = now_seconds();
  std::vector<float> logits = prefill(model_, kv_, prompt, config.prefill_chunk, pool_);
  st.prefill_seconds = now_seconds() - t0;

  t0 = now_seconds();
  const int32_t zero_row = 0;
  st.finish = FinishReason::kLength;
  while (static_cast<int>(out.size()) < config.max_new_tokens) {
    const int32_t token = sampler.sample(logits, history);
    out.push_back(token);
    history.push_back(token);
    const bool keep_going = !on_token || on_token(token);
    if (std::find(config.stop_tokens.begin(), config.stop_tokens.end(), token) !=
        config.stop_tokens.end()) {
      st.finish = FinishReason::kStop;
      break;
    }
    if (!keep_going) {
      st.finish = FinishReason::kCancelled;
      break;
    }
    if (static_cast<int>(out.size()) >= config.max_new_tokens) break;
    if (kv_.size() >= kv_.capacity()) {
      st.finish = FinishReason::kContext;
      break;
    }
    const int32_t position = static_cast<int32_t>(kv_.size());
    ForwardBatch batch;
    batch.tokens = {&token, 1};
    batch.positions = {&position, 1};
    batch.output_rows = {&zero_row, 1};
    ForwardResult r = model_.forward(kv_, batch, pool_);
    std::copy(r.logits.begin(), r.logits.end(), logits.begin());
    ++st.n_forward_passes;
  }
  st.decode_seconds = now_seconds() - t0;
  st.n_generated = static_cast<int64_t>(out.size());
  return out;
}

}  // namespace specdec
