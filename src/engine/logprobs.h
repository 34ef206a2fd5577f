// Log-probabilities of emitted tokens for a request that asks for them (Request::logprobs):
// log softmax of the target's raw logits at the position that produced the token, and the k
// most likely tokens there.
#pragma once

#include <cstdint>
#include <span>

#include "specdec/engine.h"

namespace specdec {

inline constexpr int kMaxTopLogprobs = 20;

// logits: [n_vocab]; top_k in [0, kMaxTopLogprobs]. Ties in the top list: the lower id first.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_k);

}  // namespace specdec
