// Plain autoregressive generation for one sequence: prefill the prompt in chunks, then one
// forward pass per new token, sampling with the sequence's own seeded Sampler.
// Speculative decoding (src/spec/) builds on the same pieces and must produce the same tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sample/sampler.h"

namespace specdec {

class ThreadPool;

struct GenerationConfig {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids (emitted, then generation stops)
  int prefill_chunk = 512;           // prompt tokens per forward pass
};

enum class FinishReason { kStop, kLength, kContext, kCancelled };
const char* finish_reason_name(FinishReason r);

struct GenerationStats {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  int64_t n_forward_passes = 0;  // target passes after prefill
  double prefill_seconds = 0;
  double decode_seconds = 0;
  FinishReason finish = FinishReason::kLength;
};

// Called with each new token as soon as it is chosen; return false to stop generating.
using TokenCallback = std::function<bool(int32_t token)>;

class Generator {
 public:
  // ctx_size: KV capacity (prompt + generated tokens). pool may be null.
  Generator(Model& model, ThreadPool* pool, int64_t ctx_size);

  // Throws specdec::Error if the prompt is empty or does not leave room for one new token.
  std::vector<int32_t> generate(std::span<const int32_t> prompt, const GenerationConfig& config,
                                const TokenCallback& on_token, GenerationStats* stats);

  KvCache& kv() { return kv_; }

 private:
  Model& model_;
  ThreadPool* pool_;
  KvCache kv_;
};

// Runs prompt tokens [0, n) through the model into kv (which must be empty), in chunks, and
// returns the logits of the last prompt token: [n_vocab]. Shared with the speculative decoder.
std::vector<float> prefill(Model& model, KvCache& kv, std::span<const int32_t> prompt,
                           int chunk, ThreadPool* pool);

}  // namespace specdec
