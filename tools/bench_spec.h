// The speculative half of `specdec bench`: the same prompts decoded plainly and with speculation
// in one run, and the cost of verifying 8 tokens in one pass relative to decoding 1.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/thread_pool.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "spec_options.h"
#include "tokenizer/tokenizer.h"

namespace specdec::cli {

// time(pass over 8 new tokens) / time(pass over 1 new token) after `context` cached tokens,
// measured over `reps` adjacent pairs (a 1-token pass, then an 8-token pass).
struct VerifyCost {
  double ratio = 0;       // median over the pairs of their ratio (the headline figure)
  double best_ratio = 0;  // fastest 8-token pass / fastest 1-token pass of the same pairs
  double ms_1 = 0;        // median 1-token pass, ms (the ratio's parts, to compare builds)
  double ms_8 = 0;        // median 8-token pass, ms
};
VerifyCost measure_verify_cost(Model& model, ThreadPool* pool, int context, int reps,
                               KvType kv_type);

// The pass-cost curve of engine/pass_cost.h at `context`: for n in kPassCostRows, the median over
// `reps` rounds of (a pass over n new tokens) / (a pass over 1 run just before it), every row
// wanting logits as verification does. Starts with (1, 1); each point at least
// kMinPassTokenCost a token above the one before.
inline constexpr int kPassCostRows[] = {1, 2, 4, 8, 12, 16, 24, 32};
std::vector<std::pair<int, double>> measure_pass_cost(Model& model, ThreadPool* pool, int context,
                                                      int reps, KvType kv_type);

// One line of a prompts file: a user message, or a conversation of several user turns where
// each later turn follows the model's own answer to the one before (MT-Bench's second turns, as
// Spec-Bench runs them), with an optional category for per-category figures.
struct BenchPrompt {
  int64_t line = 0;                // 1-based line of the file
  std::string category;            // "" when the line names none
  std::vector<std::string> turns;  // the user messages, at least one
};

// Lines (blank ones skipped): a JSON string; an array of strings (the turns); or an object with
// "turns" (an array of strings) or "prompt" (a string) and optionally "category" (a string).
// Throws specdec::Error naming the file and the line.
std::vector<BenchPrompt> read_bench_prompts(const std::string& path);

struct SpecBenchInput {
  std::vector<std::vector<int32_t>> prompts;  // tokenized first turns
  // Per prompt (the same order): category and turns. Empty: every prompt is one turn without a
  // category. A prompt of several turns needs `tokenizer` and `chat`.
  std::vector<BenchPrompt> texts;
  const Tokenizer* tokenizer = nullptr;  // renders later turns: the conversation so far
  bool chat = false;                     // the prompts were rendered with the chat template
  int n_gen = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;
  int64_t ctx_size = 4096;
  KvType kv_type = KvType::kF16;
  bool quiet = false;
  int repeats = 1;  // runs of each prompt per mode (alternating); per-prompt times are medians
  // Each pair runs the two modes step by step in turn (a second generator and cache, the turn
  // handed over at every emitted token) instead of one after the other, so both see the host
  // within milliseconds of each other.
  bool interleave = false;
  double verify_token_cost = 0.08;  // the adaptive draft length's cost model (calibration)
};

// Runs every prompt, every turn of a conversation, plain and with the spec setup (alternating,
// after a warm-up) and returns the figures: speedup, plain_tok_s, spec_tok_s, acceptance_rate,
// mean_accepted_length, tokens_per_pass, target passes, identical_outputs (of the turns; greedy
// only), per-turn rows, and the same per category ("categories") when the prompts name any. A
// later turn follows plain decoding's answer to the turn before it.
nlohmann::json run_spec_bench(Model& model, ThreadPool* pool, SpecSetup& spec,
                              const SpecBenchInput& in);

// The single prompts of a file in read_bench_prompts' formats (categories ignored). Throws
// specdec::Error naming file and line, also for a line of several turns.
std::vector<std::string> read_prompts_file(const std::string& path);

}  // namespace specdec::cli
