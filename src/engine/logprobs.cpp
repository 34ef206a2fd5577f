#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>

#include "util/check.h"

namespace specdec {

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_k) {
  const auto n = static_cast<int64_t>(logits.size());
  SPECDEC_CHECK(n > 0 && token >= 0 && token < n, "token_logprob: token outside the logits");
  SPECDEC_CHECK(top_k >= 0 && top_k <= kMaxTopLogprobs, "token_logprob: top_k out of range");
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double log_z = max + std::log(sum);  // log Σ exp(logit)
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(logits[token] - log_z);
  // The top_k best (logit desc, id asc), by one pass keeping a sorted list of k.
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(top_k) + 1);
  for (int32_t id = 0; id < n && top_k > 0; ++id) {
    if (static_cast<int>(best.size()) == top_k && !better(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, better), id);
    if (static_cast<int>(best.size()) > top_k) best.pop_back();
  }
  for (int32_t id : best) out.top.emplace_back(id, static_cast<float>(logits[id] - log_z));
  return out;
}

}  // namespace specdec
