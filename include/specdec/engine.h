// The engine (public API): many requests decoded together, one scheduled step at a time.
//
//   submit(request) -> id      validated here: a bad request is refused with a reason (a value,
//                              no exception), nothing else changes
//   step()                     one iteration: the scheduler picks {sequence: tokens} under the
//                              token budget (prompt chunks, decode tokens, draft trees), one model
//                              pass runs them all, each sequence verifies / samples its tokens
//                              and streams them to its callback
//   cancel(id)                 the request ends (reason kCancelled) and its KV blocks are free
//                              by the end of the next step
//   start() / stop()           a loop thread that steps while other threads submit and cancel
//
// Every request's output is the one it gets alone: greedy identical token for token, sampled
// identical for the same seed, whatever else runs beside it, however the machine is loaded
// (no policy reads a clock). Callbacks run on the thread that calls step() (the loop thread).
#pragma once

#include <cstdint>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "specdec/sampling_params.h"

namespace specdec {

class Model;
class Tokenizer;
class ThreadPool;
class ReDrafterHead;
class MedusaHeads;

// Speculative decoding of one request.
enum class SpecMethod { kNone, kNgram, kDraft, kReDrafter, kMedusa };

struct SpecParams {
  SpecMethod method = SpecMethod::kNone;
  int num_draft = 8;      // draft tokens per step at most (the fixed length when !adaptive)
  bool adaptive = true;   // draft length from acceptance statistics and the engine's cost model
  int ngram_min = 1;      // n-gram: shortest and longest suffix matched
  int ngram_max = 4;
  int tree_width = 1;     // n-gram: continuations merged into a tree; draft: top-k branches
  int tree_depth = 0;     // draft: levels that branch
  float draft_p_min = 0;  // draft: stop when its top probability falls below this
  float draft_temp = -1;  // draft: its sampling temperature; < 0: the request's
  int beams = 2;          // ReDrafter: beams M of the head's beam search
  int beam_length = 2;    // ReDrafter: tokens C per beam
  int prompt_lookup = 8;  // ReDrafter: prompt-lookup (n-gram) drafts in its tree at most; 0: none
  std::string medusa_tree;  // Medusa: paths of top-k ranks ("0;1;0,0"); empty: the default tree
};

enum class RequestState { kWaiting, kRunning, kFinished };

enum class StopReason {
  kNone,       // still running
  kLength,     // max_tokens generated, or the context is full
  kStop,       // a stop token or stop string
  kCancelled,  // cancel() or the callback asked to stop
  kError,      // the request failed (message in RequestOutput::error)
};
const char* stop_reason_name(StopReason r);

struct RequestStats {
  int64_t n_prompt = 0;           // prompt tokens
  int64_t n_cached = 0;           // tokens whose K/V came from the prefix cache at the last
                                  // admission (after a preemption, generated ones too)
  int64_t n_computed = 0;         // tokens the target computed for this request (incl. recompute)
  int64_t n_generated = 0;        // tokens emitted
  int64_t n_passes = 0;           // target passes that produced tokens (decode steps)
  int64_t n_drafted = 0;          // draft tokens verified
  int64_t n_accepted = 0;         // draft tokens accepted
  int64_t n_preempted = 0;        // times the request lost its blocks and was recomputed
  int64_t first_token_step = -1;  // engine step that emitted the first token
};

// The target model's log-probabilities at one emitted token: log softmax of its logits at the
// position that produced the token (before penalties, filters and temperature, as vLLM reports
// them by default).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the Request::logprobs most likely, best first
};

// What one step produced for a request (delivered through Request::on_output).
struct RequestOutput {
  int64_t id = -1;
  std::vector<int32_t> tokens;  // new tokens (a stop token included, nothing past a stop)
  std::vector<TokenLogprob> logprobs;  // [tokens] when Request::logprobs >= 0
  // [tokens, dim] when Request::hidden_states: row i is the target's final-normed hidden state
  // at the position that produced tokens[i] (the input of the LM head that gave its logits).
  std::vector<float> hidden;
  std::string text;             // new text, UTF-8 complete; text that could still become a stop
                                // string is held back, nothing past a stop string is sent
  bool finished = false;
  StopReason reason = StopReason::kNone;
  int32_t stop_token = -1;  // reason kStop: the stop token that ended it, or -1 ...
  std::string stop_string;  // ... the stop string
  std::string error;            // reason kError
  RequestStats stats;
};

struct Request {
  std::vector<int32_t> prompt;  // token ids (chat template and BOS already applied)
  SamplingParams sampling;
  int max_tokens = 128;             // >= 1
  std::vector<int32_t> stop_tokens;  // besides the model's end-of-generation tokens
  std::vector<std::string> stop;     // stop strings (not part of the returned text)
  bool ignore_eos = false;           // do not stop at the model's end-of-generation tokens
  int logprobs = -1;                 // -1: none; k in [0, 20]: each token's and the k best
  bool hidden_states = false;        // RequestOutput::hidden (self-distillation data)
  SpecParams spec;
  // Called on the stepping thread with each step's new tokens and at the end (finished = true,
  // exactly once). Returning false cancels the request; so does throwing (the exception is
  // dropped: the engine and the other requests go on).
  std::function<bool(const RequestOutput&)> on_output;
};

struct EngineConfig {
  int64_t kv_cache_mib = 256;   // KV pool size
  int32_t kv_blocks = 0;        // > 0: exactly this many blocks instead (kv_cache_mib ignored)
  int block_size = 16;          // token slots per KV block (a multiple of 16)
  bool prefix_cache = true;     // reuse cached blocks of common prefixes
  int max_batch_tokens = 512;   // tokens per step (prompt chunks + decode + draft tokens)
  int max_seqs = 64;            // running sequences at most
  int64_t max_context = 0;      // tokens per sequence; 0: the model's training context
  std::string kv_type = "f16";  // K/V storage: f16 or f32
  Model* draft_model = nullptr;  // for SpecMethod::kDraft (same vocabulary as the target)
  // For SpecMethod::kReDrafter: a head trained for this model (check_redrafter_target).
  const ReDrafterHead* drafter_head = nullptr;
  // For SpecMethod::kMedusa: heads trained for this model (check_medusa_target).
  const MedusaHeads* medusa_heads = nullptr;
  // Blocks of the draft model's own KV pool (block_size slots each; the draft runs batched over
  // the requests). 0: as many as the target's pool, but no more than max_seqs full draft
  // contexts (every running request's draft cache fits).
  int32_t draft_kv_blocks = 0;
  // Relative cost of one more token in a pass (the cost model: a pass over n tokens costs
  // 1 + verify_token_cost * (n - 1) passes of one token); from a calibration file, never a
  // clock. 0.08 is what `specdec bench` measures on the 2-vCPU test machine (8 tokens ~1.6x).
  double verify_token_cost = 0.08;
  // The calibrated cost curve of a pass, when the calibration has one: points (n, a pass over n
  // new tokens in one-token passes), n ascending from (1, 1). It replaces the line above where
  // a batch's drafts are weighed against the pass they join (src/engine/pass_cost.h): past ~8
  // tokens the kernels are compute-bound and a token costs more than the line says.
  std::vector<std::pair<int, double>> pass_cost_curve;
  // Prompt tokens a step may compute while other requests are decoding (chunked prefill that
  // keeps decoders flowing: a step's cost bounds every running request's inter-token latency).
  // 0: from the cost model, as many as keep the step within kDecodeStepSlack times the cost of
  // its decodes alone (at least kMinPrefillChunk); -1: no limit but max_batch_tokens; > 0: this.
  int max_prefill_tokens_decoding = 0;
};

// Counters of the whole engine (cumulative unless noted).
struct EngineStats {
  int64_t steps = 0;
  int64_t requests_waiting = 0;  // now
  int64_t requests_running = 0;  // now
  int64_t requests_finished = 0;
  int64_t tokens_prompt = 0;      // prompt tokens computed (not counting prefix-cache hits)
  int64_t tokens_generated = 0;
  int64_t tokens_computed = 0;    // all tokens through the model
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;     // now: referenced by live requests
  int64_t kv_blocks_cached = 0;   // now: kept only for prefix reuse
  int64_t kv_blocks_peak = 0;     // most blocks used at once
  int64_t kv_pool_bytes = 0;
  int64_t prefix_blocks_queried = 0;  // whole blocks of admitted requests looked up ...
  int64_t prefix_blocks_hit = 0;      // ... and found in the prefix cache
  int64_t preemptions = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t spec_passes = 0;  // sequence-steps that verified drafts
  // Per speculative method ("ngram", "draft"), as vLLM's spec-decode counters: acceptance rate
  // = accepted / drafted, mean accepted length = accepted / passes.
  struct SpecCounters {
    static constexpr int kPositions = 16;  // deeper positions count in the last
    int64_t drafted = 0;
    int64_t accepted = 0;
    int64_t passes = 0;  // target passes that verified this method's drafts
    std::array<int64_t, kPositions> accepted_at{};  // [position] drafts accepted at depth p + 1
  };
  std::map<std::string, SpecCounters> spec;
};

struct SubmitResult {
  int64_t id = -1;
  std::string error;  // empty when accepted
  std::string param;  // the request field at fault ("prompt", "max_tokens", "temperature", ...)
  std::string code;   // "context_length_exceeded" for a prompt too long, else empty
  bool ok() const { return error.empty(); }
};

class Engine {
 public:
  // The model (and draft model) and pool must outlive the engine; tokenizer may be null (no text
  // in the outputs, no stop strings). Throws specdec::Error for a bad configuration (e.g. a pool
  // too small for one block).
  Engine(Model& model, const Tokenizer* tokenizer, ThreadPool* pool, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Checks the request (prompt empty or longer than the context or the whole pool,
  // max_tokens < 1, sampling parameters out of range, unknown token ids, draft without a draft
  // model) and queues it; the reason names the limit.
  SubmitResult submit(Request request);
  // Thread-safe. False if no request ever had this id (a finished one: nothing happens).
  bool cancel(int64_t id);

  // One iteration over all running requests (not thread-safe against itself; do not call while
  // the loop thread runs). Returns false when there was nothing to do.
  bool step();
  // Whether any request is waiting or running (thread-safe).
  bool has_work() const;

  // The loop thread: steps while there is work, sleeps otherwise. stop() cancels nothing: it
  // returns after the current step; requests still in the engine, and any submitted after it,
  // wait for the next start() or step().
  void start();
  void stop();

  EngineStats stats() const;  // thread-safe
  int32_t block_size() const;
  int32_t num_blocks() const;
  // Checks the KV bookkeeping (refcounts against block tables); for tests, between steps.
  void check_invariants() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specdec
