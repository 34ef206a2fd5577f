// The engine: requests in, one scheduled model pass per step, tokens out.
//
// One step (DESIGN §1):
//   0. take what other threads submitted and cancelled since the last step
//   1. Scheduler::schedule -> {sequence: tokens} (decodes, prompt chunks, admissions; KV blocks
//      reserved, preemption by recompute when the pool runs out)
//   2. drafts: each decoding sequence with a proposer grows its TokenTree, as long as the budget
//      left and the cost model say it pays (blocks reserved for the tree, or no drafts); the
//      draft-model requests all at once (BatchedDraftModel: one draft pass per depth)
//   3. Model::forward over every sequence's tokens at once (each with its own positions, mask
//      and paged K/V)
//   4. per sequence: a prompt chunk just advances; the end of a prompt samples the first token;
//      a decode verifies its tree (Verifier), keeps the root and the accepted path in its KV
//      (compacted into place), gives back the blocks of rejected drafts, and emits the accepted
//      tokens and the target's own (stop tokens, stop strings, max_tokens and the context cut
//      the emission, dropping any accepted tokens past the cut with their K/V)
//   5. full blocks of computed tokens are registered for prefix reuse; finished sequences free
//      their blocks; each request's callback gets its new tokens and text.
#include "specdec/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "backend/kv_type.h"
#include "drafter/medusa_proposer.h"
#include "drafter/redrafter_proposer.h"
#include "engine/logprobs.h"
#include "engine/pass_cost.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/paged_kv.h"
#include "model/model.h"
#include "speculative/batched_draft.h"
#include "speculative/draft_model.h"
#include "speculative/ngram.h"
#include "speculative/verifier.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kLength: return "length";
    case StopReason::kStop: return "stop";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kError: return "error";
  }
  return "?";
}

class Engine::Impl {
 public:
  Impl(Model& model, const Tokenizer* tokenizer, ThreadPool* pool, const EngineConfig& config);
  ~Impl() { stop(); }

  SubmitResult submit(Request request);
  bool cancel(int64_t id);
  bool step();
  bool has_work() const { return work_.load() > 0; }
  void start();
  void stop();
  EngineStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  int32_t block_size() const { return pool_->block_size(); }
  int32_t num_blocks() const { return pool_->num_blocks(); }
  void check_invariants() const;

 private:
  // Per scheduled sequence: its part of the pass.
  struct Entry {
    Sequence* seq = nullptr;
    int64_t n_tokens = 0;            // base tokens (prompt chunk or the root)
    bool tree = false;               // a decode step over seq->tree
    std::vector<int32_t> positions;  // [n]
    std::vector<uint8_t> mask;       // [n, n] tree mask, or empty (causal)
    std::vector<int32_t> rows;       // output rows
  };

  SubmitResult check_request(const Request& r) const;
  std::unique_ptr<Sequence> make_sequence(int64_t id, Request request, std::string* error);
  void plan_drafts(std::vector<ScheduledSeq>& plan, int64_t budget_left);
  void run_redrafter_jobs();
  void reserve_tree(Sequence& s, int64_t max_drafts);
  // Emits one token; false when the sequence finished with it.
  bool emit(Sequence& s, int32_t token);
  void finish(Sequence& s, StopReason reason, std::string error = {});
  // hidden: [rows, dim] of the entry's output rows when the pass returned hidden states, else
  // empty.
  void after_pass(Entry& e, std::span<const float> logits, std::span<const float> hidden);
  void deliver();
  bool call_output(Sequence& s) noexcept;
  void take_incoming();
  void update_stats();
  int32_t sample_first(Sequence& s, std::span<const float> logits);

  Model& model_;
  const Tokenizer* tokenizer_;
  ThreadPool* thread_pool_;
  EngineConfig config_;
  int64_t max_context_ = 0;
  // A draft model's token in one-token target passes: its weight bytes over the target's.
  double draft_token_cost_ = 0.0;
  PassCost pass_cost_;  // config_'s verify_token_cost and pass_cost_curve
  std::unique_ptr<PagedKvStorage> storage_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvBlockManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<BatchedDraftModel> drafter_;  // with config.draft_model
  // With config.drafter_head: the ReDrafter sequences' beam searches of a step, as one batch.
  std::unique_ptr<ReDrafterBeamSearch> beam_search_;
  struct ReDrafterJob {
    Sequence* seq;
    DraftRequest request;
    int64_t max_drafts;
  };
  std::vector<ReDrafterJob> redrafter_jobs_;
  std::vector<BeamJob> beam_jobs_;
  ForwardScratch scratch_;
  Verifier verifier_;
  VerifyResult verdict_;
  std::vector<Entry> entries_;
  std::vector<SeqBatch> batches_;
  std::vector<DraftJob> draft_jobs_;   // this step's draft-model jobs ...
  std::vector<Sequence*> draft_seqs_;  // ... and their sequences
  std::map<int64_t, std::unique_ptr<Sequence>> seqs_;  // admitted to the engine, not delivered
  std::vector<Sequence*> touched_;                     // sequences with output this step
  int64_t n_steps_ = 0;
  int64_t next_arrival_ = 0;
  int64_t peak_used_ = 0;

  // Shared with other threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  std::vector<int64_t> cancels_;
  int64_t next_id_ = 0;
  std::atomic<int64_t> work_{0};  // requests submitted and not yet finished
  EngineStats stats_;
  std::thread loop_;
  bool stopping_ = false;
};

Engine::Impl::Impl(Model& model, const Tokenizer* tokenizer, ThreadPool* pool,
                   const EngineConfig& config)
    : model_(model),
      tokenizer_(tokenizer),
      thread_pool_(pool),
      config_(config),
      pass_cost_(config.verify_token_cost, config.pass_cost_curve) {
  const ModelConfig& c = model.config();
  if (!config.pass_cost_curve.empty() && !pass_cost_curve_valid(config.pass_cost_curve)) {
    throw Error("pass_cost_curve: points (n, cost) must start at (1, 1) and rise with n");
  }
  if (config.block_size <= 0 || config.block_size % 16 != 0) {
    throw Error(fmt::format("the KV block size must be a positive multiple of 16, got {}",
                            config.block_size));
  }
  if (config.max_batch_tokens < 1) throw Error("--max-batch-tokens must be at least 1");
  if (config.max_seqs < 1) throw Error("--max-seqs must be at least 1");
  if (config.kv_cache_mib < 1 && config.kv_blocks < 1) {
    throw Error("--kv-cache-mib must be at least 1");
  }
  const std::optional<KvType> type = parse_kv_type(config.kv_type);
  if (!type) throw Error(fmt::format("unknown KV type '{}' (f16 or f32)", config.kv_type));
  const int32_t n_blocks =
      config.kv_blocks > 0
          ? config.kv_blocks
          : PagedKvStorage::blocks_in(config.kv_cache_mib << 20, c.n_layers, c.n_kv_heads,
                                      c.head_dim, config.block_size, *type);
  if (n_blocks < 1) {
    throw Error(fmt::format("--kv-cache-mib {} holds no block of {} tokens for this model",
                            config.kv_cache_mib, config.block_size));
  }
  storage_ = model.make_paged_kv(n_blocks, config.block_size, *type);  // on the model's device
  pool_ = std::make_unique<BlockPool>(n_blocks, config.block_size, config.prefix_cache);
  kv_ = std::make_unique<KvBlockManager>(storage_.get(), pool_.get());
  SchedulerLimits limits;
  limits.max_batch_tokens = config.max_batch_tokens;
  limits.max_seqs = config.max_seqs;
  limits.max_prefill_tokens_decoding = config.max_prefill_tokens_decoding;
  limits.token_cost = config.verify_token_cost;
  if (model.weight_bytes() > 0) {
    limits.slot_cost = static_cast<double>(storage_->block_bytes()) /
                       static_cast<double>(config.block_size) /
                       static_cast<double>(model.weight_bytes());
  }
  scheduler_ = std::make_unique<Scheduler>(limits, kv_.get());
  const int64_t model_ctx = c.n_ctx_train > 0 ? c.n_ctx_train : 4096;
  max_context_ = config.max_context > 0 ? config.max_context : model_ctx;
  if (config.draft_model != nullptr) {
    check_same_vocabulary(*config.draft_model, model);
    int64_t draft_blocks = config.draft_kv_blocks;
    if (draft_blocks <= 0) {
      const int64_t ctx = draft_context(*config.draft_model, max_context_);
      const int64_t per_seq = std::max<int64_t>(1, kv_->blocks_for(ctx));
      draft_blocks = std::min<int64_t>(n_blocks, per_seq * config.max_seqs);
    }
    drafter_ = std::make_unique<BatchedDraftModel>(
        *config.draft_model, pool, static_cast<int32_t>(draft_blocks), config.block_size);
  }
  if (config.drafter_head != nullptr) {
    beam_search_ = std::make_unique<ReDrafterBeamSearch>(*config.drafter_head, model);
  }
  stats_.kv_blocks_total = n_blocks;
  if (config.draft_model != nullptr && model.weight_bytes() > 0) {
    draft_token_cost_ = static_cast<double>(config.draft_model->weight_bytes()) /
                        static_cast<double>(model.weight_bytes());
  }
  stats_.kv_pool_bytes = storage_->bytes();
}

SubmitResult Engine::Impl::check_request(const Request& r) const {
  auto refuse = [](std::string param, std::string message, std::string code = {}) {
    SubmitResult result;
    result.error = std::move(message);
    result.param = std::move(param);
    result.code = std::move(code);
    return result;
  };
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  const int64_t pool_slots = static_cast<int64_t>(pool_->num_blocks()) * pool_->block_size();
  if (n == 0) return refuse("prompt", "the prompt is empty (no tokens)");
  if (n >= max_context_) {
    return refuse("prompt",
                  fmt::format("this model's maximum context length is {} tokens, your prompt has "
                              "{} (the prompt and at least one generated token must fit)",
                              max_context_, n),
                  "context_length_exceeded");
  }
  if (n >= pool_slots) {
    return refuse("prompt",
                  fmt::format("the prompt has {} tokens but the whole KV pool holds {} ({} "
                              "blocks of {}); raise --kv-cache-mib",
                              n, pool_slots, pool_->num_blocks(), pool_->block_size()),
                  "context_length_exceeded");
  }
  const int n_vocab = model_.config().n_vocab;
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= n_vocab) {
      return refuse("prompt", fmt::format("prompt token id {} is outside the vocabulary [0, {})",
                                          t, n_vocab));
    }
  }
  for (int32_t t : r.stop_tokens) {
    if (t < 0 || t >= n_vocab) {
      return refuse("stop_token_ids",
                    fmt::format("stop token id {} is outside the vocabulary [0, {})", t, n_vocab));
    }
  }
  if (r.max_tokens < 1) {
    return refuse("max_tokens", fmt::format("max_tokens must be at least 1, got {}", r.max_tokens));
  }
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs) {
    return refuse("logprobs", fmt::format("logprobs must be in [0, {}], got {}", kMaxTopLogprobs,
                                          r.logprobs));
  }
  try {
    r.sampling.validate();
  } catch (const Error& e) {
    // "sampling option NAME must ...": NAME is the field.
    const std::string message = e.what();
    const std::string lead = "sampling option ";
    std::string param = "sampling";
    if (message.rfind(lead, 0) == 0) {
      param = message.substr(lead.size(), message.find(' ', lead.size()) - lead.size());
    }
    return refuse(param, message);
  }
  const SpecParams& sp = r.spec;
  if (sp.method != SpecMethod::kNone) {
    if (sp.num_draft < 0 || sp.num_draft > 64) {
      return refuse("num_draft", fmt::format("num_draft must be in [0, 64], got {}", sp.num_draft));
    }
    if (sp.tree_width < 1 || sp.tree_depth < 0) {
      return refuse("tree", "tree width must be >= 1, depth >= 0");
    }
  }
  if (sp.method == SpecMethod::kNgram && (sp.ngram_min < 1 || sp.ngram_max < sp.ngram_min)) {
    return refuse("ngram", fmt::format("n-gram sizes must satisfy 1 <= min <= max, got {}..{}",
                                       sp.ngram_min, sp.ngram_max));
  }
  if (sp.method == SpecMethod::kReDrafter) {
    if (config_.drafter_head == nullptr) {
      return refuse("spec", "ReDrafter speculation needs a drafter head loaded (--drafter)");
    }
    if (sp.beams < 1 || sp.beams > 64 || sp.beam_length < 1 || sp.beam_length > 16) {
      return refuse("beams", fmt::format("beams must be in [1, 64] and beam length in [1, 16], "
                                         "got {} x {}", sp.beams, sp.beam_length));
    }
    if (sp.prompt_lookup < 0 || sp.prompt_lookup > 16) {
      return refuse("prompt_lookup",
                    fmt::format("prompt lookup must be in [0, 16], got {}", sp.prompt_lookup));
    }
  }
  if (sp.method == SpecMethod::kMedusa) {
    if (config_.medusa_heads == nullptr) {
      return refuse("spec", "Medusa speculation needs Medusa heads loaded (--drafter)");
    }
    try {
      MedusaProposer check(*config_.medusa_heads,
                           medusa_tree_or_default(sp.medusa_tree, model_.device_name()), nullptr);
    } catch (const Error& e) {
      return refuse("medusa_tree", e.what());
    }
  }
  if (sp.method == SpecMethod::kDraft) {
    if (config_.draft_model == nullptr) {
      return refuse("spec",
                    "speculation with a draft model needs a draft model loaded (--draft-model)");
    }
    // NaN passes the draft decoder's range checks and a negative-means-default test.
    if (!(sp.draft_p_min >= 0.0f && sp.draft_p_min <= 1.0f)) {
      return refuse("draft_p_min",
                    fmt::format("draft_p_min must be in [0, 1], got {}", sp.draft_p_min));
    }
    if (!std::isfinite(sp.draft_temp)) {
      return refuse("draft_temp", fmt::format("draft_temp must be a finite number (< 0: the "
                                              "request's temperature), got {}",
                                              sp.draft_temp));
    }
  }
  if (!r.stop.empty() && tokenizer_ == nullptr) return refuse("stop", "stop strings need a tokenizer");
  return {};
}

std::unique_ptr<Sequence> Engine::Impl::make_sequence(int64_t id, Request request,
                                                      std::string* error) {
  auto seq = std::make_unique<Sequence>(id, std::move(request));
  Sequence& s = *seq;
  const Request& r = s.request;
  s.tokens = r.prompt;
  s.n_prompt = static_cast<int64_t>(r.prompt.size());
  const int64_t pool_slots = static_cast<int64_t>(pool_->num_blocks()) * pool_->block_size();
  s.max_context = std::min(max_context_, pool_slots);
  s.stats.n_prompt = s.n_prompt;
  s.out.id = id;
  if (tokenizer_ != nullptr) {
    DecodeOptions options;
    options.text_start = false;
    s.detok.emplace(*tokenizer_, options);
  }
  s.stop_strings = StopStrings(r.stop);
  try {
    if (r.spec.method == SpecMethod::kNgram) {
      NgramConfig c;
      c.ngram_min = r.spec.ngram_min;
      c.ngram_max = r.spec.ngram_max;
      c.tree_width = r.spec.tree_width;
      s.proposer = std::make_unique<NgramProposer>(c);
    } else if (r.spec.method == SpecMethod::kDraft) {
      const DraftModelConfig c = draft_model_config(r);
      DraftDecoder::validate(c);
      s.draft_model = c;  // added to the drafter by the stepping thread (take_incoming)
    } else if (r.spec.method == SpecMethod::kReDrafter) {
      ReDrafterPolicy policy;
      policy.lookup_max = r.spec.prompt_lookup;
      s.proposer = std::make_unique<ReDrafterProposer>(
          *config_.drafter_head, model_, thread_pool_,
          BeamSearchConfig{r.spec.beams, r.spec.beam_length}, policy);
    } else if (r.spec.method == SpecMethod::kMedusa) {
      s.proposer = std::make_unique<MedusaProposer>(
          *config_.medusa_heads, medusa_tree_or_default(r.spec.medusa_tree, model_.device_name()),
          thread_pool_);
    }
  } catch (const Error& e) {
    *error = e.what();
    return nullptr;
  }
  if (s.speculates()) {
    DraftLengthConfig dl;
    dl.max_draft = r.spec.num_draft;
    dl.adaptive = r.spec.adaptive;
    // A draft model ends its chains by its own probabilities (DraftDecoder's cost rules).
    dl.proposer_stops = r.spec.method == SpecMethod::kDraft;
    s.draft_length.emplace(dl);
  }
  if (s.proposer) s.proposer->begin(s.tokens, r.sampling.seed);
  return seq;
}

SubmitResult Engine::Impl::submit(Request request) {
  SubmitResult result = check_request(request);
  if (!result.ok()) return result;
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
  }
  std::unique_ptr<Sequence> seq = make_sequence(id, std::move(request), &result.error);
  if (!seq) return result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(seq));
    ++work_;
  }
  cv_.notify_all();
  result.id = id;
  return result;
}

bool Engine::Impl::cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= next_id_) return false;
  cancels_.push_back(id);
  cv_.notify_all();
  return true;
}

void Engine::Impl::take_incoming() {
  std::deque<std::unique_ptr<Sequence>> incoming;
  std::vector<int64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (std::unique_ptr<Sequence>& s : incoming) {
    s->arrival = next_arrival_++;
    Sequence* p = s.get();
    if (p->draft_model) {
      drafter_->add(p->id, p->max_context, p->request.sampling.seed, *p->draft_model);
    }
    seqs_.emplace(p->id, std::move(s));
    scheduler_->enqueue(p);
  }
  for (int64_t id : cancels) {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || it->second->state == RequestState::kFinished) continue;
    finish(*it->second, StopReason::kCancelled);
  }
}

// The token after a whole prompt, exactly as single-sequence generation samples it.
int32_t Engine::Impl::sample_first(Sequence& s, std::span<const float> logits) {
  return s.sampler.sample(logits, s.tokens);
}

void Engine::Impl::finish(Sequence& s, StopReason reason, std::string error) {
  if (s.state == RequestState::kFinished) return;
  if (reason != StopReason::kStop && reason != StopReason::kCancelled &&
      reason != StopReason::kError) {
    s.out.text += s.stop_strings.flush();
    if (s.detok) s.out.text += s.detok->flush();
  } else if (reason == StopReason::kStop && !s.stop_strings.stopped()) {
    s.out.text += s.stop_strings.flush();  // a stop token: held text is final
  }
  s.state = RequestState::kFinished;
  s.out.finished = true;
  s.out.reason = reason;
  s.out.error = std::move(error);
  scheduler_->remove(&s);  // frees its blocks
  if (s.draft_model) drafter_->remove(s.id);
  touched_.push_back(&s);
}

bool Engine::Impl::emit(Sequence& s, int32_t token) {
  s.tokens.push_back(token);
  s.out.tokens.push_back(token);
  ++s.stats.n_generated;
  if (s.stats.first_token_step < 0) s.stats.first_token_step = n_steps_;
  const Request& r = s.request;
  const bool eog = !r.ignore_eos && tokenizer_ != nullptr && tokenizer_->is_eog(token);
  if (eog || std::find(r.stop_tokens.begin(), r.stop_tokens.end(), token) != r.stop_tokens.end()) {
    s.out.stop_token = token;
    finish(s, StopReason::kStop);
    return false;
  }
  if (s.detok) {
    bool stopped = false;
    s.out.text += s.stop_strings.push(s.detok->push(token), &stopped);
    if (stopped) {
      s.out.stop_string = s.stop_strings.matched();
      finish(s, StopReason::kStop);
      return false;
    }
  }
  if (s.n_generated() >= r.max_tokens ||
      static_cast<int64_t>(s.tokens.size()) >= s.max_context) {
    finish(s, StopReason::kLength);
    return false;
  }
  return true;
}

// Drafts for the decoding sequences with a proposer, from the budget left. The cost model: a
// pass over n tokens costs P(n) one-token passes (pass_cost.h: the calibrated curve, or the line
// 1 + c·(n - 1), c = verify_token_cost; never a clock). For a sequence alone, the adaptive
// controller weighs expected accepted tokens against that cost; in a batch of B tokens the pass
// is shared, so a draft token at depth j is kept only while its chance of acceptance, a^j (a:
// the sequence's running per-token acceptance), is worth its share of the pass:
// a^j >= m·B / P(B), m being what a token adds to the pass: the mean over as many tokens as
// there are speculating sequences, (P(B + S) - P(B)) / S (on the line: c·B / (1 + c·(B - 1))).
// The curve matters past ~8 tokens, where the kernels are compute-bound.
// A sequence's own proposer (n-gram) drafts at once and its budget share is what it drafted;
// the draft-model sequences draft together after the loop (one BatchedDraftModel::propose), so
// the budget counts their full draft lengths.
void Engine::Impl::plan_drafts(std::vector<ScheduledSeq>& plan, int64_t budget_left) {
  int64_t batch_tokens = 0;
  int n_spec = 0;
  for (const ScheduledSeq& p : plan) {
    batch_tokens += p.n_tokens;
    if (p.seq->decoding() && p.seq->speculates()) ++n_spec;
  }
  const double c = config_.verify_token_cost;
  const auto b = static_cast<double>(batch_tokens);
  // One solo pass's worth of cost, in this step's shares (B / P(B)), and the node threshold.
  const double share_scale = batch_tokens <= 1 ? 1.0 : b / pass_cost_.cost(b);
  const double threshold =
      batch_tokens <= 1 ? 0.0 : pass_cost_.marginal(b, std::max(1, n_spec)) * share_scale;
  draft_jobs_.clear();
  draft_seqs_.clear();
  redrafter_jobs_.clear();
  for (ScheduledSeq& p : plan) {
    Sequence& s = *p.seq;
    s.tree.reset(s.tokens.back());
    if (!s.decoding() || !s.speculates() || n_spec == 0) continue;
    // ReDrafter sizes its own tree (its pruning by the node cost below); the others ask their
    // draft-length controller.
    int64_t k = s.request.spec.method == SpecMethod::kReDrafter ? s.request.spec.num_draft
                                                               : s.draft_length->next_length();
    // Room: the tree's slots after the computed tokens, the tokens still allowed, the budget.
    k = std::min<int64_t>(k, s.max_context - static_cast<int64_t>(s.tokens.size()) - 1);
    k = std::min<int64_t>(k, s.request.max_tokens - s.n_generated() - 1);
    k = std::min<int64_t>(k, budget_left / std::max(1, n_spec));
    if (s.request.spec.adaptive && threshold > 0.0) {
      const double a = s.draft_length->acceptance();
      int64_t keep = 0;
      for (double chance = a; keep < k && chance >= threshold; chance *= a) ++keep;
      k = keep;
    }
    --n_spec;
    if (k <= 0) continue;
    if (s.draft_model) {
      // Adaptive chains follow the decoder's cost rules, counted against the sequence's solo
      // pass as Generator does (the same trees as solo).
      draft_jobs_.push_back(DraftJob{s.id, s.tokens, static_cast<int>(k), &s.tree, s.n_prompt,
                                     s.request.spec.adaptive ? draft_token_cost_ : 0.0,
                                     config_.verify_token_cost});
      draft_seqs_.push_back(&s);
      budget_left -= k;
      continue;
    }
    DraftRequest req;
    req.tokens = s.tokens;
    req.max_tokens = static_cast<int>(k);
    if (s.proposer->wants_hidden()) req.target_hidden = s.hidden;
    // Adaptive requests weigh a node against the batch's pass (the threshold above: a token
    // more in a pass of B tokens costs c / (1 + c (B - 1)) of it, of which this sequence's
    // progress is one token in B); the others against their solo pass, as Generator does, so
    // that their drafts, and so their sampled draws, do not depend on the batch.
    req.node_cost = s.request.spec.adaptive && batch_tokens > 1 ? threshold : c;
    if (s.request.spec.adaptive && batch_tokens > 1) req.cost_scale = share_scale;
    if (s.request.spec.method == SpecMethod::kReDrafter && beam_search_) {
      // Its search joins the step's batch below; the budget counts its full share meanwhile.
      redrafter_jobs_.push_back(ReDrafterJob{&s, req, k});
      budget_left -= k;
      continue;
    }
    try {
      s.proposer->propose(req, &s.tree);
    } catch (const Error& e) {
      finish(s, StopReason::kError, e.what());
      continue;
    }
    reserve_tree(s, k);
    budget_left -= s.tree.num_drafts();
  }
  run_redrafter_jobs();
  if (draft_jobs_.empty()) return;
  try {
    drafter_->propose(draft_jobs_);
  } catch (const Error& e) {
    for (Sequence* s : draft_seqs_) finish(*s, StopReason::kError, e.what());
    return;
  }
  for (size_t i = 0; i < draft_jobs_.size(); ++i) {
    reserve_tree(*draft_seqs_[i], draft_jobs_[i].max_tokens);
  }
}

// The ReDrafter sequences of plan_drafts: each proposer decides whether it searches
// (ReDrafterProposer::prepare), the searches run as one batch (a pass over the head's weights
// per depth for all of them, not one per sequence), and each proposer builds its tree from its
// beams (finish) - the same trees as each proposer alone.
void Engine::Impl::run_redrafter_jobs() {
  if (redrafter_jobs_.empty()) return;
  beam_jobs_.clear();
  for (ReDrafterJob& j : redrafter_jobs_) {
    auto* p = static_cast<ReDrafterProposer*>(j.seq->proposer.get());
    BeamJob job;
    try {
      if (p->prepare(j.request, &job)) beam_jobs_.push_back(job);
    } catch (const Error& e) {
      finish(*j.seq, StopReason::kError, e.what());
    }
  }
  try {
    beam_search_->run_batch(beam_jobs_, thread_pool_);
  } catch (const Error& e) {
    for (ReDrafterJob& j : redrafter_jobs_) finish(*j.seq, StopReason::kError, e.what());
    return;
  }
  for (ReDrafterJob& j : redrafter_jobs_) {
    Sequence& s = *j.seq;
    if (s.state == RequestState::kFinished) continue;
    try {
      static_cast<ReDrafterProposer*>(s.proposer.get())->finish(j.request, &s.tree);
    } catch (const Error& e) {
      finish(s, StopReason::kError, e.what());
      continue;
    }
    reserve_tree(s, j.max_drafts);
  }
}

// Blocks for the sequence's drafted tree, or a plain step (the tree back to its root).
void Engine::Impl::reserve_tree(Sequence& s, int64_t max_drafts) {
  SPECDEC_CHECK(s.tree.num_drafts() <= max_drafts, "proposer exceeded its draft budget");
  if (!kv_->reserve(&s.table, s.n_computed + s.tree.size())) s.tree.reset(s.tokens.back());
}

void Engine::Impl::after_pass(Entry& e, std::span<const float> logits,
                              std::span<const float> hidden) {
  Sequence& s = *e.seq;
  const int n_vocab = model_.config().n_vocab;
  const int dim = model_.config().dim;
  // The hidden state of output row `row` becomes the one before the next root.
  auto keep_hidden = [&](int row) {
    if (!s.proposer || !s.proposer->wants_hidden() || hidden.empty()) return;
    const float* h = hidden.data() + static_cast<size_t>(row) * dim;
    s.hidden.assign(h, h + dim);
  };
  // Request::hidden_states: the row that produced the token about to be emitted.
  auto keep_output_hidden = [&](int row) {
    if (!s.request.hidden_states) return;
    SPECDEC_CHECK(!hidden.empty(), "engine: the pass returned no hidden states");
    const float* h = hidden.data() + static_cast<size_t>(row) * dim;
    s.out.hidden.insert(s.out.hidden.end(), h, h + dim);
  };
  s.stats.n_computed += e.tree ? s.tree.size() : e.n_tokens;
  if (!e.tree) {
    s.n_computed += e.n_tokens;
    // The end of the prompt (a recompute after preemption stops before the root instead).
    if (!e.rows.empty()) {
      keep_hidden(0);
      const int32_t token = sample_first(s, logits);
      if (s.request.logprobs >= 0) {
        s.out.logprobs.push_back(token_logprob(logits, token, s.request.logprobs));
      }
      keep_output_hidden(0);
      emit(s, token);
    }
  } else {
    const int n = s.tree.size();
    verifier_.verify(s.tree, logits, n_vocab, s.tokens, s.sampler, &verdict_);
    const auto n_acc = static_cast<int>(verdict_.accepted_nodes.size());
    ++s.stats.n_passes;
    if (n > 1) {
      s.stats.n_drafted += n - 1;
      s.stats.n_accepted += n_acc;
      std::lock_guard<std::mutex> lock(mu_);
      stats_.drafted += n - 1;
      stats_.accepted += n_acc;
      ++stats_.spec_passes;
      EngineStats::SpecCounters& m =
          stats_.spec[s.request.spec.method == SpecMethod::kDraft ? "draft" : s.proposer->name()];
      m.drafted += n - 1;
      m.accepted += n_acc;
      ++m.passes;
      for (int p = 0; p < n_acc; ++p) {
        ++m.accepted_at[std::min(p, EngineStats::SpecCounters::kPositions - 1)];
      }
    }
    if (s.draft_length && s.request.spec.adaptive) {
      // Costs from the model, not a clock: the same decisions on any machine, under any load.
      const double pass_cost = 1.0 + config_.verify_token_cost * (n - 1);
      const double draft_cost =
          s.request.spec.method == SpecMethod::kDraft ? draft_token_cost_ * (n - 1) : 0.0;
      s.draft_length->record(n - 1, n_acc, draft_cost, pass_cost, s.tree.max_depth());
    }
    // The root and the accepted path stay, compacted into place after the computed tokens.
    const int64_t base = s.n_computed;
    for (int i = 0; i < n_acc; ++i) {
      storage_->copy_slot(s.table.blocks, base + verdict_.accepted_nodes[i], base + 1 + i);
    }
    s.n_computed = base + 1 + n_acc;
    keep_hidden(verdict_.final_node);
    if (s.proposer) {
      s.proposer->observe({verdict_.tokens.data(), static_cast<size_t>(n_acc)}, verdict_.bonus);
    }
    for (size_t i = 0; i < verdict_.tokens.size(); ++i) {
      if (s.request.logprobs >= 0) {
        // The row that produced token i: its parent on the path (the root for the first), the
        // final node for the bonus.
        const int row = i == 0 ? 0 : verdict_.accepted_nodes[i - 1];
        s.out.logprobs.push_back(token_logprob(
            logits.subspan(static_cast<size_t>(row) * n_vocab, static_cast<size_t>(n_vocab)),
            verdict_.tokens[i], s.request.logprobs));
      }
      keep_output_hidden(i == 0 ? 0 : verdict_.accepted_nodes[i - 1]);
      if (!emit(s, verdict_.tokens[i])) break;
    }
  }
  if (s.state == RequestState::kFinished) return;
  // Tokens cut by a stop are not kept; every computed token is an emitted one.
  s.n_computed = std::min<int64_t>(s.n_computed, static_cast<int64_t>(s.tokens.size()));
  kv_->commit(&s.table, s.tokens, s.n_computed);
  kv_->shrink(&s.table, s.n_computed);  // blocks of rejected drafts go back
}

bool Engine::Impl::step() {
  take_incoming();
  std::vector<ScheduledSeq> plan;
  int64_t budget_left = 0;
  plan = scheduler_->schedule(&budget_left);
  plan_drafts(plan, budget_left);
  // Sequences finished while drafting drop out of the pass.
  std::erase_if(plan, [](const ScheduledSeq& p) {
    return p.seq->state == RequestState::kFinished;
  });
  const bool worked = !plan.empty() || !touched_.empty();
  if (!plan.empty()) {
    ++n_steps_;
    entries_.resize(plan.size());
    batches_.resize(plan.size());
    for (size_t i = 0; i < plan.size(); ++i) {
      Entry& e = entries_[i];
      Sequence& s = *plan[i].seq;
      e.seq = &s;
      e.n_tokens = plan[i].n_tokens;
      e.tree = s.decoding();
      e.mask.clear();
      e.rows.clear();
      ForwardBatch& b = batches_[i].batch;
      b = ForwardBatch{};
      if (e.tree) {
        const int n = s.tree.size();
        s.tree.build_positions(s.n_computed, &e.positions);
        if (!s.tree.is_chain()) s.tree.build_mask(&e.mask);
        for (int r = 0; r < n; ++r) e.rows.push_back(r);
        b.tokens = s.tree.tokens();
      } else {
        e.positions.resize(static_cast<size_t>(e.n_tokens));
        for (int64_t t = 0; t < e.n_tokens; ++t) {
          e.positions[t] = static_cast<int32_t>(s.n_computed + t);
        }
        if (s.n_computed + e.n_tokens == static_cast<int64_t>(s.tokens.size())) {
          e.rows.push_back(static_cast<int32_t>(e.n_tokens - 1));
        }
        b.tokens = std::span<const int32_t>(s.tokens).subspan(
            static_cast<size_t>(s.n_computed), static_cast<size_t>(e.n_tokens));
      }
      b.positions = e.positions;
      b.mask = e.mask;
      b.output_rows = e.rows;
      b.want_hidden = (s.request.hidden_states || (s.proposer != nullptr && s.proposer->wants_hidden())) &&
                      !e.rows.empty();
      batches_[i].kv = kv_->seq_kv(s.table, s.n_computed);
    }
    ForwardResult r;
    try {
      r = model_.forward(batches_, thread_pool_, &scratch_);
    } catch (const Error& err) {
      // A pass the model refused (a bug, not a request's fault: requests are checked at
      // submit): the sequences in it end with the error, the engine and the others go on.
      for (Entry& e : entries_) finish(*e.seq, StopReason::kError, err.what());
      entries_.clear();
    }
    const int n_vocab = model_.config().n_vocab;
    const size_t dim = static_cast<size_t>(model_.config().dim);
    size_t row = 0;
    int64_t computed = 0;
    for (Entry& e : entries_) {
      const std::span<const float> logits =
          r.logits.subspan(row * n_vocab, e.rows.size() * static_cast<size_t>(n_vocab));
      const std::span<const float> hidden =
          r.hidden.empty() ? std::span<const float>() : r.hidden.subspan(row * dim, e.rows.size() * dim);
      row += e.rows.size();
      computed += static_cast<int64_t>(batches_[&e - entries_.data()].batch.tokens.size());
      try {
        after_pass(e, logits, hidden);
      } catch (const Error& err) {
        finish(*e.seq, StopReason::kError, err.what());
      }
      touched_.push_back(e.seq);
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.tokens_computed += computed;
    for (const Entry& e : entries_) {
      if (!e.tree) stats_.tokens_prompt += e.n_tokens;
    }
  }
  deliver();
  update_stats();
  return worked;
}

void Engine::Impl::deliver() {
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  std::vector<Sequence*> touched;
  touched.swap(touched_);
  for (Sequence* s : touched) {
    if (s->out.tokens.empty() && s->out.text.empty() && !s->out.finished) continue;
    s->out.stats = s->stats;
    const bool keep_going = call_output(*s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.tokens_generated += static_cast<int64_t>(s->out.tokens.size());
    }
    s->out.tokens.clear();
    s->out.logprobs.clear();
    s->out.hidden.clear();
    s->out.text.clear();
    if (!keep_going && !s->out.finished) {
      finish(*s, StopReason::kCancelled);
      s->out.stats = s->stats;
      touched_.clear();
      call_output(*s);
    }
    if (s->out.finished) {
      --work_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.requests_finished;
      }
      seqs_.erase(s->id);
    }
  }
}

// The request's callback (user code): an exception it throws must not unwind through the step
// (that would leave the other requests' outputs undelivered and, on the loop thread, end the
// process); it counts as the callback asking to stop.
bool Engine::Impl::call_output(Sequence& s) noexcept {
  if (!s.request.on_output) return true;
  try {
    return s.request.on_output(s.out);
  } catch (...) {
    return false;
  }
}

void Engine::Impl::update_stats() {
  peak_used_ = std::max<int64_t>(peak_used_, pool_->num_used());
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.requests_waiting = static_cast<int64_t>(scheduler_->waiting().size() + incoming_.size());
  stats_.requests_running = static_cast<int64_t>(scheduler_->running().size());
  stats_.kv_blocks_used = pool_->num_used();
  stats_.kv_blocks_cached = pool_->num_cached();
  stats_.kv_blocks_peak = peak_used_;
  stats_.prefix_blocks_queried = kv_->prefix_blocks_queried();
  stats_.prefix_blocks_hit = kv_->prefix_blocks_hit();
  stats_.preemptions = scheduler_->preemptions();
}

void Engine::Impl::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (loop_.joinable()) return;
  stopping_ = false;
  loop_ = std::thread([this] {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] {
          return stopping_ || !incoming_.empty() || !cancels_.empty() || work_.load() > 0;
        });
        if (stopping_) return;
      }
      step();
    }
  });
}

void Engine::Impl::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

void Engine::Impl::check_invariants() const {
  pool_->check_invariants();
  // Every used block's refcount equals the number of tables holding it.
  std::vector<int32_t> holders(static_cast<size_t>(pool_->num_blocks()), 0);
  for (const auto& [id, s] : seqs_) {
    for (int32_t b : s->table.blocks) ++holders[static_cast<size_t>(b)];
    SPECDEC_CHECK(s->admitted || s->table.blocks.empty(), "a waiting sequence holds blocks");
    if (s->admitted) {
      SPECDEC_CHECK(static_cast<int64_t>(s->table.blocks.size()) >=
                        kv_->blocks_for(s->n_computed),
                    "a sequence's blocks do not cover its computed tokens");
      SPECDEC_CHECK(s->n_computed < static_cast<int64_t>(s->tokens.size()),
                    "a running sequence has nothing left to compute");
    }
  }
  for (int32_t b = 0; b < pool_->num_blocks(); ++b) {
    SPECDEC_CHECK(pool_->refcount(b) == holders[static_cast<size_t>(b)],
                  "a block's refcount differs from the tables holding it");
  }
  SPECDEC_CHECK(static_cast<int64_t>(scheduler_->running().size()) <= config_.max_seqs,
                "more running sequences than --max-seqs");
  if (drafter_) {
    drafter_->check_invariants();
    for (const auto& [id, s] : seqs_) {
      const bool live = s->draft_model && s->state != RequestState::kFinished;
      SPECDEC_CHECK(drafter_->contains(id) == live, "a draft-model request's drafter state");
    }
  }
}

Engine::Engine(Model& model, const Tokenizer* tokenizer, ThreadPool* pool,
               const EngineConfig& config)
    : impl_(std::make_unique<Impl>(model, tokenizer, pool, config)) {}
Engine::~Engine() = default;
SubmitResult Engine::submit(Request request) { return impl_->submit(std::move(request)); }
bool Engine::cancel(int64_t id) { return impl_->cancel(id); }
bool Engine::step() { return impl_->step(); }
bool Engine::has_work() const { return impl_->has_work(); }
void Engine::start() { impl_->start(); }
void Engine::stop() { impl_->stop(); }
EngineStats Engine::stats() const { return impl_->stats(); }
int32_t Engine::block_size() const { return impl_->block_size(); }
int32_t Engine::num_blocks() const { return impl_->num_blocks(); }
void Engine::check_invariants() const { impl_->check_invariants(); }

}  // namespace specdec
