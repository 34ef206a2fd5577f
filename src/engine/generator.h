// Generation for one sequence, plain or speculative, in one loop:
//   prefill the prompt (chunks) → sample the first token (the root)
//   each step: the proposer grows a TokenTree under the root (no proposer, or a zero draft
//   length, leaves the root alone: plain decoding) → one target pass over the tree → the
//   Verifier keeps the longest acceptable path plus one token of the target's own → the KV cache
//   keeps exactly the root and the accepted path → the bonus token is the next root.
// Plain decoding is the special case of a one-node tree, so both share every line of code that
// decides tokens; greedy speculative output equals plain greedy output token for token.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/prefill.h"  // prefill(), used with the Generator
#include "sample/sampler.h"
#include "speculative/verifier.h"
#include "speculative/draft_length.h"
#include "speculative/proposer.h"
#include "speculative/token_tree.h"

namespace specdec {

class ThreadPool;

struct GenerationConfig {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids (emitted, then generation stops)
  int prefill_chunk = 512;           // prompt tokens per forward pass
  Proposer* proposer = nullptr;      // null: plain decoding
  DraftLengthConfig draft;           // draft length per step (fixed or adaptive)
  // The adaptive draft length's cost model, in one-token target passes (never a clock, so a run
  // replays exactly under any load): a pass over n tokens costs 1 + verify_token_cost·(n - 1)
  // (bench --calibrate measures it), a draft token draft_token_cost (a draft model: its weight
  // bytes over the target's; n-gram: 0).
  double verify_token_cost = 0.08;
  double draft_token_cost = 0.0;
};

enum class FinishReason { kStop, kLength, kContext, kCancelled };
const char* finish_reason_name(FinishReason r);

struct GenerationStats {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  int64_t n_forward_passes = 0;  // target passes after prefill
  int64_t n_spec_passes = 0;     // passes that verified at least one draft token
  int64_t n_drafted = 0;         // draft tokens verified
  int64_t n_accepted = 0;        // draft tokens accepted
  double prefill_seconds = 0;
  double decode_seconds = 0;     // from the first generated token to the last
  double draft_seconds = 0;      // part of decode_seconds spent in the proposer
  FinishReason finish = FinishReason::kLength;
  // [p]: passes that accepted at least p + 1 drafts (deeper positions count in the last); over
  // n_spec_passes, the acceptance rate at draft position p + 1.
  static constexpr int kPositions = 16;
  std::array<int64_t, kPositions> accepted_at{};

  double acceptance_rate() const { return n_drafted ? double(n_accepted) / n_drafted : 0.0; }
  // Tokens the target produced per pass (accepted drafts + its own), over all decode passes.
  double tokens_per_pass() const {
    return n_forward_passes ? double(n_accepted + n_forward_passes) / n_forward_passes : 0.0;
  }
  // Accepted drafts per pass that verified drafts.
  double mean_accepted_length() const {
    return n_spec_passes ? double(n_accepted) / n_spec_passes : 0.0;
  }
};

// Called with each new token as soon as it is final; return false to stop generating.
using TokenCallback = std::function<bool(int32_t token)>;

class Generator {
 public:
  // ctx_size: KV capacity (prompt + generated tokens), stored as kv_type. pool may be null.
  Generator(Model& model, ThreadPool* pool, int64_t ctx_size, KvType kv_type = KvType::kF16);

  // Throws specdec::Error if the prompt is empty or does not leave room for one new token.
  std::vector<int32_t> generate(std::span<const int32_t> prompt, const GenerationConfig& config,
                                const TokenCallback& on_token, GenerationStats* stats);

  KvCache& kv() { return kv_; }

 private:
  Model& model_;
  ThreadPool* pool_;
  KvCache kv_;
  TokenTree tree_;
  Verifier verifier_;
  VerifyResult verdict_;
  std::vector<uint8_t> mask_;        // [tree, tree]
  std::vector<int32_t> positions_;   // [tree]
  std::vector<int32_t> rows_;        // [tree]
  std::vector<int64_t> keep_;        // KV slots kept after verification
  std::vector<float> hidden_;        // [dim] target hidden state before the root
};

}  // namespace specdec
