// Self-distillation data for drafter heads (distill_data.h): prompts answered by the target on
// the batched engine, which also returns the final-normed hidden state that produced each answer
// token; or (hidden_passes) the hidden state at every token of prompt + answer from one more pass
// over each sequence. Stored as IEEE halves.
//
//   prompts ─► (chat template) tokens ─► skip the long ones ─► Engine: all submitted, stepped
//   until done (greedy, or seeded sampling), hidden rows captured ─► answers + hidden rows at
//   positions n_prompt-1 .. L-2 ─► hidden[n_tokens, dim] f16
//   [hidden_passes: chunks of hidden_chunk tokens, several sequences packed into one
//   Model::forward, every row asked for ─► every row of hidden[n_tokens, dim]]
#include "drafter/distill_data.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {

static_assert(std::endian::native == std::endian::little,
              "the distillation file is little-endian and read / written in place");

namespace {

constexpr char kMagic[4] = {'S', 'D', 'D', 'S'};
constexpr uint32_t kVersion = 1;
// magic, version, dim, n_seqs, n_tokens
constexpr int64_t kHeaderBytes = 4 + 4 + 4 + 8 + 8;
// Sequences packed into one hidden-state pass at most (each has its own KV cache).
constexpr int kMaxSeqsPerPass = 8;
// Token slots per block of the engine's KV pool.
constexpr int kKvBlock = 16;

void check_options(const DistillOptions& o) {
  if (o.max_prompt_tokens < 1) throw Error("distill: max_prompt_tokens must be at least 1");
  if (o.max_new_tokens < 1) throw Error("distill: max_new_tokens must be at least 1");
  if (!(o.temperature >= 0.0f)) throw Error("distill: temperature must be >= 0");
  if (o.max_prompts < 0) throw Error("distill: max_prompts must be >= 0");
  if (o.first_prompt < 0) throw Error("distill: first_prompt must be >= 0");
  if (o.max_seqs < 1) throw Error("distill: max_seqs must be at least 1");
  if (o.kv_cache_mib < 0) throw Error("distill: kv_cache_mib must be >= 0");
  if (o.hidden_chunk < 1) throw Error("distill: hidden_chunk must be at least 1");
}

// The longest text one token can stand for (its vocabulary text or its bytes): a text of more
// than max_prompt_tokens times this many bytes has more tokens than that, without encoding it.
size_t longest_token_bytes(const Tokenizer& tok) {
  size_t n = 1;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    n = std::max({n, tok.token_text(id).size(), tok.token_to_piece(id, true).size()});
  }
  return n;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool chat) {
  if (!chat) return tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
  // The template writes BOS itself where the format has one (as `specdec generate --chat`).
  const std::string rendered = tok.apply_chat_template({{"user", text}}, true);
  return tok.encode(rendered, /*add_special=*/false, /*parse_special=*/true);
}

// Blocks of the engine's KV pool: max_seqs sequences of prompt + answer at most.
int32_t engine_kv_blocks(const Model& target, const DistillOptions& o, int64_t max_context) {
  const ModelConfig& c = target.config();
  constexpr int64_t kBlock = kKvBlock;
  const int64_t seq_tokens =
      std::min<int64_t>(max_context, int64_t{o.max_prompt_tokens} + o.max_new_tokens);
  const int64_t want = int64_t{o.max_seqs} * ((seq_tokens + kBlock - 1) / kBlock) + 1;
  const int64_t mib = o.kv_cache_mib > 0 ? o.kv_cache_mib : 1024;
  const int64_t cap = PagedKvStorage::blocks_in(mib << 20, c.n_layers, c.n_kv_heads, c.head_dim,
                                                kBlock, KvType::kF16);
  const int64_t blocks = o.kv_cache_mib > 0 ? cap : std::min(want, cap);
  if (blocks < (seq_tokens + kBlock - 1) / kBlock) {
    throw Error(fmt::format("distill: kv_cache_mib {} does not hold one sequence of {} tokens", mib,
                            seq_tokens));
  }
  return static_cast<int32_t>(blocks);
}

struct Answer {
  std::vector<int32_t> tokens;  // [answer length] the stop token included
  // [answer length, dim] f16 with DistillOptions::hidden_passes off: row j is the hidden state
  // that produced tokens[j] (the engine's RequestOutput::hidden), else empty.
  std::vector<uint16_t> hidden;
  StopReason reason = StopReason::kNone;
  std::string error;
  bool finished = false;
};

// Answers every prompt on one engine (FCFS, up to max_seqs at a time), in prompt order.
std::vector<Answer> answer_prompts(Model& target, const Tokenizer& tok,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   const std::vector<uint64_t>& seeds, const DistillOptions& o,
                                   ThreadPool* pool,
                                   const std::function<void(int64_t, int64_t)>& progress) {
  EngineConfig config;
  const int64_t ctx = target.config().n_ctx_train > 0 ? target.config().n_ctx_train : 4096;
  config.block_size = kKvBlock;
  config.kv_blocks = engine_kv_blocks(target, o, ctx);
  config.max_seqs = o.max_seqs;
  config.max_batch_tokens = std::max(512, o.max_seqs);
  config.max_prefill_tokens_decoding = -1;  // offline: throughput, not inter-token latency
  Engine engine(target, &tok, pool, config);

  // Requests are submitted a window ahead of the running ones (in prompt order, so admission
  // stays FCFS): thousands of waiting requests would hold their state in the engine for nothing.
  const int64_t total = static_cast<int64_t>(prompts.size());
  const int64_t window = 2 * int64_t{o.max_seqs};
  std::vector<Answer> answers(prompts.size());
  int64_t done = 0, submitted = 0;
  auto submit_more = [&] {
    while (submitted < total && submitted - done < window) {
      const size_t i = static_cast<size_t>(submitted++);
      Request r;
      r.prompt = prompts[i];
      r.max_tokens = o.max_new_tokens;
      r.sampling.temperature = o.temperature;
      r.sampling.seed = seeds[i];
      r.hidden_states = !o.hidden_passes;
      r.on_output = [&answers, &done, &progress, total, i](const RequestOutput& out) {
        Answer& a = answers[i];
        a.tokens.insert(a.tokens.end(), out.tokens.begin(), out.tokens.end());
        for (const float x : out.hidden) a.hidden.push_back(fp32_to_fp16(x));
        if (out.finished) {
          a.finished = true;
          a.reason = out.reason;
          a.error = out.error;
          ++done;
          if (progress) progress(done, total);
        }
        return true;
      };
      const SubmitResult s = engine.submit(std::move(r));
      if (!s.ok()) {
        throw Error(
            fmt::format("distill: the engine refused prompt {} ({}: {})", i, s.param, s.error));
      }
    }
  };
  submit_more();
  while (engine.has_work()) {
    engine.step();
    submit_more();
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    const Answer& a = answers[i];
    if (!a.finished || a.reason == StopReason::kError || a.reason == StopReason::kCancelled ||
        a.tokens.empty()) {
      throw Error(fmt::format("distill: answering prompt {} failed ({}{}{})", i,
                              stop_reason_name(a.reason), a.error.empty() ? "" : ": ", a.error));
    }
  }
  return answers;
}

// hidden[t] for every token t of every sequence of d (d.tokens, d.seq_offsets set; d.hidden
// sized): passes of up to `chunk` tokens; a pass continues the sequence the last one stopped
// in and takes the following sequences while tokens and kMaxSeqsPerPass allow. Sequence s keeps
// its K/V in caches[s % kMaxSeqsPerPass] (the sequences of one pass are consecutive, so they
// never share a cache).
void compute_hidden(Model& target, DistillDataset& d, int chunk, ThreadPool* pool,
                    int64_t* n_passes) {
  const int64_t n_seqs = d.n_seqs();
  const int64_t dim = d.dim;
  int64_t max_len = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    max_len = std::max(max_len, d.seq_offsets[s + 1] - d.seq_offsets[s]);
  }
  const int n_caches = static_cast<int>(std::min<int64_t>(kMaxSeqsPerPass, n_seqs));
  std::vector<KvCache> caches;  // [n_caches] each [max_len] slots
  caches.reserve(static_cast<size_t>(n_caches));
  for (int i = 0; i < n_caches; ++i) caches.push_back(target.make_kv_cache(max_len));

  ForwardScratch scratch;
  std::vector<int32_t> positions(static_cast<size_t>(chunk));  // [chunk] of the pass's rows
  std::vector<int32_t> rows(static_cast<size_t>(chunk));       // [chunk] 0, 1, ... chunk - 1
  for (int i = 0; i < chunk; ++i) rows[static_cast<size_t>(i)] = i;
  struct Piece {
    int64_t seq, begin, n;  // tokens [begin, begin + n) of sequence seq
  };
  std::vector<Piece> pieces;
  std::vector<SeqBatch> batches;
  int64_t seq = 0, pos = 0;  // the next token to compute
  while (seq < n_seqs) {
    pieces.clear();
    batches.clear();
    int64_t budget = chunk, filled = 0;
    for (int64_t s = seq, p = pos;
         s < n_seqs && budget > 0 && static_cast<int>(pieces.size()) < kMaxSeqsPerPass;
         ++s, p = 0) {
      const int64_t len = d.seq_offsets[s + 1] - d.seq_offsets[s];
      const int64_t n = std::min(budget, len - p);
      KvCache& kv = caches[static_cast<size_t>(s % kMaxSeqsPerPass)];
      if (p == 0) kv.clear();
      SPECDEC_CHECK(kv.size() == p, "distill: a sequence's cache lost its place");
      for (int64_t i = 0; i < n; ++i)
        positions[static_cast<size_t>(filled + i)] = static_cast<int32_t>(p + i);
      ForwardBatch b;
      b.tokens = {d.tokens.data() + d.seq_offsets[s] + p, static_cast<size_t>(n)};
      b.positions = {positions.data() + filled, static_cast<size_t>(n)};
      b.output_rows = {rows.data(), static_cast<size_t>(n)};
      b.want_hidden = true;
      b.skip_logits = true;  // only the hidden rows are kept
      batches.push_back(SeqBatch{kv.seq(), b});
      pieces.push_back({s, p, n});
      budget -= n;
      filled += n;
    }
    const ForwardResult r = target.forward(batches, pool, &scratch);
    SPECDEC_CHECK(static_cast<int64_t>(r.hidden.size()) == filled * dim,
                  "distill: the pass returned another number of hidden rows");
    // [filled, dim] floats -> the pieces' rows of d.hidden, as halves
    uint16_t* out = d.hidden.data();
    const float* in = r.hidden.data();
    int64_t row = 0;
    for (const Piece& pc : pieces) {
      uint16_t* dst = out + (d.seq_offsets[pc.seq] + pc.begin) * dim;
      const float* src = in + row * dim;
      for (int64_t i = 0; i < pc.n * dim; ++i) dst[i] = fp32_to_fp16(src[i]);
      caches[static_cast<size_t>(pc.seq % kMaxSeqsPerPass)].append(pc.n);
      row += pc.n;
    }
    ++*n_passes;
    const Piece& last = pieces.back();
    const int64_t last_len = d.seq_offsets[last.seq + 1] - d.seq_offsets[last.seq];
    if (last.begin + last.n < last_len) {
      seq = last.seq;
      pos = last.begin + last.n;
    } else {
      seq = last.seq + 1;
      pos = 0;
    }
  }
}

// Reads exactly n bytes or throws naming the file and what was being read.
void read_exact(std::ifstream& in, void* dst, int64_t n, const std::string& path,
                const char* what) {
  if (n == 0) return;
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (!in || in.gcount() != n) {
    throw Error(fmt::format("{}: truncated while reading {}", path, what));
  }
}

// The dataset's arrays agree with each other (what save writes and load accepts).
void check_consistent(const DistillDataset& d, const std::string& path) {
  if (d.dim < 1) throw Error(fmt::format("{}: the hidden width {} is not positive", path, d.dim));
  const int64_t n_seqs = d.n_seqs();
  const int64_t n_tokens = d.n_tokens();
  if (static_cast<int64_t>(d.seq_offsets.size()) != n_seqs + 1) {
    throw Error(fmt::format("{}: {} sequence offsets for {} sequences (want n_seqs + 1)", path,
                            d.seq_offsets.size(), n_seqs));
  }
  if (d.seq_offsets[0] != 0) {
    throw Error(fmt::format("{}: the first sequence offset is {}, not 0", path, d.seq_offsets[0]));
  }
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t len = d.seq_offsets[s + 1] - d.seq_offsets[s];
    if (len < 1) {
      throw Error(fmt::format("{}: sequence offsets not increasing at sequence {} ({} -> {})", path,
                              s, d.seq_offsets[s], d.seq_offsets[s + 1]));
    }
    if (d.n_prompt[s] < 1 || d.n_prompt[s] > len) {
      throw Error(fmt::format("{}: sequence {} has {} prompt tokens, outside [1, {}]", path, s,
                              d.n_prompt[s], len));
    }
  }
  if (d.seq_offsets[n_seqs] != n_tokens) {
    throw Error(fmt::format("{}: the sequences end at token {}, but there are {} tokens", path,
                            d.seq_offsets[n_seqs], n_tokens));
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (d.tokens[t] < 0) {
      throw Error(fmt::format("{}: token {} has the negative id {}", path, t, d.tokens[t]));
    }
  }
  if (static_cast<int64_t>(d.hidden.size()) != n_tokens * d.dim) {
    throw Error(fmt::format("{}: {} hidden values for {} tokens of width {}", path, d.hidden.size(),
                            n_tokens, d.dim));
  }
  if (!d.facts.empty() && !nlohmann::json::accept(d.facts)) {
    throw Error(fmt::format("{}: the facts are not valid JSON", path));
  }
}

}  // namespace

void DistillDataset::hidden_row(int64_t token_index, float* out) const {
  SPECDEC_CHECK(token_index >= 0 && token_index < n_tokens(), "hidden_row: token out of range");
  const uint16_t* h = hidden.data() + token_index * dim;
  for (int i = 0; i < dim; ++i) out[i] = fp16_to_fp32(h[i]);
}

DistillDataset build_distill_dataset(Model& target, const Tokenizer& tokenizer,
                                     std::span<const std::string> prompts,
                                     const DistillOptions& options, ThreadPool* pool,
                                     const std::function<void(int64_t, int64_t)>& progress,
                                     DistillTimings* timings) {
  check_options(options);
  if (tokenizer.n_vocab() != target.config().n_vocab) {
    throw Error(fmt::format("distill: the tokenizer has {} tokens, the target {}",
                            tokenizer.n_vocab(), target.config().n_vocab));
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int64_t ctx = target.config().n_ctx_train > 0 ? target.config().n_ctx_train : 4096;
  const size_t longest = longest_token_bytes(tokenizer);

  // Prompts in order: too long (or leaving no room for an answer) and empty ones are skipped.
  std::vector<std::vector<int32_t>> encoded;  // [used][prompt tokens]
  std::vector<uint64_t> seeds;                // [used] options.seed + the prompt's index
  int64_t n_skipped_long = 0, n_skipped_empty = 0, n_considered = 0;
  for (size_t i = static_cast<size_t>(options.first_prompt); i < prompts.size(); ++i) {
    if (options.max_prompts > 0 && static_cast<int64_t>(encoded.size()) >= options.max_prompts) {
      break;
    }
    ++n_considered;
    const std::string& text = prompts[i];
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
      ++n_skipped_empty;
      continue;
    }
    if (text.size() > static_cast<size_t>(options.max_prompt_tokens) * longest) {
      ++n_skipped_long;  // more tokens than the limit, whatever they are
      continue;
    }
    std::vector<int32_t> ids = encode_prompt(tokenizer, text, options.chat);
    if (ids.empty()) {
      ++n_skipped_empty;
      continue;
    }
    if (static_cast<int64_t>(ids.size()) > options.max_prompt_tokens ||
        static_cast<int64_t>(ids.size()) >= ctx) {
      ++n_skipped_long;
      continue;
    }
    encoded.push_back(std::move(ids));
    seeds.push_back(options.seed + static_cast<uint64_t>(i));
  }
  if (encoded.empty()) {
    throw Error(
        fmt::format("distill: no usable prompt among {} from index {} ({} longer than {} "
                    "tokens, {} empty)",
                    n_considered, options.first_prompt, n_skipped_long, options.max_prompt_tokens,
                    n_skipped_empty));
  }
  const auto t_encoded = Clock::now();

  const std::vector<Answer> answers =
      answer_prompts(target, tokenizer, encoded, seeds, options, pool, progress);
  const auto t_answered = Clock::now();

  DistillDataset d;
  d.dim = target.config().dim;
  const size_t n_seqs = encoded.size();
  d.seq_offsets.resize(n_seqs + 1);
  d.n_prompt.resize(n_seqs);
  int64_t n_tokens = 0, n_answer = 0, n_eog = 0;
  for (size_t s = 0; s < n_seqs; ++s) {
    d.seq_offsets[s] = n_tokens;
    d.n_prompt[s] = static_cast<int32_t>(encoded[s].size());
    n_tokens += static_cast<int64_t>(encoded[s].size() + answers[s].tokens.size());
    n_answer += static_cast<int64_t>(answers[s].tokens.size());
    if (answers[s].reason == StopReason::kStop) ++n_eog;
  }
  d.seq_offsets[n_seqs] = n_tokens;
  d.tokens.reserve(static_cast<size_t>(n_tokens));
  for (size_t s = 0; s < n_seqs; ++s) {
    d.tokens.insert(d.tokens.end(), encoded[s].begin(), encoded[s].end());
    d.tokens.insert(d.tokens.end(), answers[s].tokens.begin(), answers[s].tokens.end());
  }
  int64_t n_passes = 0, n_hidden_tokens = 0;
  if (options.hidden_passes) {
    d.hidden.resize(static_cast<size_t>(n_tokens * d.dim));
    compute_hidden(target, d, options.hidden_chunk, pool, &n_passes);
    n_hidden_tokens = n_tokens;
  } else {
    // The rows captured while answering: answer token j was produced at sequence position
    // n_prompt - 1 + j, so they fill positions n_prompt - 1 .. L - 2, the only ones training
    // reads (training_positions, soft labels). The prompt's other positions and the last
    // token stay zero.
    d.hidden.assign(static_cast<size_t>(n_tokens * d.dim), 0);
    const size_t dim = static_cast<size_t>(d.dim);
    for (size_t s = 0; s < n_seqs; ++s) {
      const Answer& a = answers[s];
      SPECDEC_CHECK(a.hidden.size() == a.tokens.size() * dim,
                    "distill: the engine returned another number of hidden rows than tokens");
      const size_t first = static_cast<size_t>(d.seq_offsets[s] + d.n_prompt[s] - 1);
      std::copy(a.hidden.begin(), a.hidden.end(), d.hidden.begin() + first * dim);
    }
  }
  const auto t_hidden = Clock::now();

  nlohmann::json facts;
  facts["kind"] = "specdec distillation dataset";
  facts["target"] = target.fingerprint();
  facts["target_arch"] = target.config().arch;
  facts["prompts_given"] = prompts.size();
  facts["prompts_considered"] = n_considered;
  facts["first_prompt"] = options.first_prompt;
  facts["next_prompt"] = options.first_prompt + n_considered;
  facts["prompts_used"] = n_seqs;
  facts["prompts_skipped_too_long"] = n_skipped_long;
  facts["prompts_skipped_empty"] = n_skipped_empty;
  facts["answer_tokens"] = n_answer;
  facts["answers_ended_by_eog"] = n_eog;
  facts["tokens"] = n_tokens;
  facts["hidden"] = options.hidden_passes
                        ? "final-normed, f16; hidden passes in f16 KV cache"
                        : "final-normed, f16; captured while answering (f16 KV cache); only "
                          "positions n_prompt-1 .. L-2 of each sequence, the others zero";
  facts["options"] = {{"max_prompt_tokens", options.max_prompt_tokens},
                      {"max_new_tokens", options.max_new_tokens},
                      {"temperature", options.temperature},
                      {"seed", options.seed},
                      {"seed_rule", "options.seed + index of the prompt in the list"},
                      {"chat", options.chat},
                      {"max_prompts", options.max_prompts},
                      {"max_seqs", options.max_seqs},
                      {"hidden_chunk", options.hidden_chunk},
                      {"hidden_passes", options.hidden_passes}};
  d.facts = facts.dump();

  if (timings != nullptr) {
    auto secs = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    timings->encode_s = secs(t0, t_encoded);
    timings->answer_s = secs(t_encoded, t_answered);
    timings->hidden_s = secs(t_answered, t_hidden);
    timings->prompt_tokens = n_tokens - n_answer;
    timings->answer_tokens = n_answer;
    timings->hidden_tokens = n_hidden_tokens;
    timings->hidden_passes = n_passes;
  }
  return d;
}

namespace {

// A dataset's facts as JSON (an empty object when it has none or they do not parse).
nlohmann::json facts_json(const std::string& facts) {
  nlohmann::json j = nlohmann::json::parse(facts, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

std::string facts_target(const nlohmann::json& j) {
  return j.contains("target") && j["target"].is_string() ? j["target"].get<std::string>() : "";
}

}  // namespace

void append_distill_dataset(DistillDataset& into, DistillDataset&& more) {
  if (into.dim != more.dim) {
    throw Error(fmt::format("distill: cannot join datasets of hidden width {} and {}", into.dim,
                            more.dim));
  }
  const nlohmann::json a = facts_json(into.facts);
  const nlohmann::json b = facts_json(more.facts);
  const std::string ta = facts_target(a), tb = facts_target(b);
  if (!ta.empty() && !tb.empty() && ta != tb) {
    throw Error(fmt::format("distill: cannot join datasets of two models ({} and {})", ta, tb));
  }
  nlohmann::json joined;
  joined["kind"] = "specdec distillation dataset (shards)";
  joined["target"] = !ta.empty() ? ta : tb;
  joined["shards"] = a.contains("shards") && a["shards"].is_array() ? a["shards"]
                                                                    : nlohmann::json::array({a});
  if (b.contains("shards") && b["shards"].is_array()) {
    for (const auto& f : b["shards"]) joined["shards"].push_back(f);
  } else {
    joined["shards"].push_back(b);
  }

  const int64_t base = into.n_tokens();
  if (into.seq_offsets.empty()) into.seq_offsets.push_back(0);
  into.seq_offsets.reserve(into.seq_offsets.size() + more.n_prompt.size());
  for (size_t s = 1; s < more.seq_offsets.size(); ++s) {
    into.seq_offsets.push_back(base + more.seq_offsets[s]);
  }
  into.n_prompt.insert(into.n_prompt.end(), more.n_prompt.begin(), more.n_prompt.end());
  into.tokens.insert(into.tokens.end(), more.tokens.begin(), more.tokens.end());
  into.hidden.insert(into.hidden.end(), more.hidden.begin(), more.hidden.end());
  into.facts = joined.dump();
  more = DistillDataset{};
}

std::string distill_target(const DistillDataset& d) { return facts_target(facts_json(d.facts)); }

void save_distill_dataset(const std::string& path, const DistillDataset& d) {
  check_consistent(d, path);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("{}: cannot open for writing", tmp));
    const uint32_t version = kVersion;
    const uint32_t dim = static_cast<uint32_t>(d.dim);
    const uint64_t n_seqs = static_cast<uint64_t>(d.n_seqs());
    const uint64_t n_tokens = static_cast<uint64_t>(d.n_tokens());
    const uint64_t facts_len = d.facts.size();
    auto put = [&out](const void* p, size_t n) {
      out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    };
    put(kMagic, 4);
    put(&version, 4);
    put(&dim, 4);
    put(&n_seqs, 8);
    put(&n_tokens, 8);
    put(d.seq_offsets.data(), d.seq_offsets.size() * sizeof(int64_t));
    put(d.n_prompt.data(), d.n_prompt.size() * sizeof(int32_t));
    put(d.tokens.data(), d.tokens.size() * sizeof(int32_t));
    put(d.hidden.data(), d.hidden.size() * sizeof(uint16_t));
    put(&facts_len, 8);
    put(d.facts.data(), d.facts.size());
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw Error(fmt::format("{}: write failed (disk full?)", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("{}: cannot rename to {}: {}", tmp, path, ec.message()));
}

DistillDataset load_distill_dataset(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open the distillation dataset", path));
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(fmt::format("{}: cannot read the file size: {}", path, ec.message()));
  const int64_t file_size = static_cast<int64_t>(size);
  if (file_size < kHeaderBytes + 8 + 8) {
    throw Error(fmt::format("{}: not a distillation dataset ({} bytes)", path, file_size));
  }
  char magic[4];
  uint32_t version = 0, dim = 0;
  uint64_t n_seqs = 0, n_tokens = 0;
  read_exact(in, magic, 4, path, "the magic");
  if (std::memcmp(magic, kMagic, 4) != 0) {
    throw Error(fmt::format("{}: not a distillation dataset (magic is not SDDS)", path));
  }
  read_exact(in, &version, 4, path, "the version");
  if (version != kVersion) {
    throw Error(
        fmt::format("{}: version {} (this build reads version {})", path, version, kVersion));
  }
  read_exact(in, &dim, 4, path, "the header");
  read_exact(in, &n_seqs, 8, path, "the header");
  read_exact(in, &n_tokens, 8, path, "the header");
  // Every count is bounded by the file size before any size is multiplied or allocated.
  const uint64_t limit = static_cast<uint64_t>(file_size);
  if (dim < 1 || dim > (1u << 20) || n_seqs > limit / 12 || n_tokens > limit / 4 ||
      n_tokens * (4 + 2ull * dim) > limit) {
    throw Error(
        fmt::format("{}: header (dim {}, {} sequences, {} tokens) does not fit the {} "
                    "bytes of the file",
                    path, dim, n_seqs, n_tokens, file_size));
  }
  const int64_t arrays = 8 * static_cast<int64_t>(n_seqs + 1) + 4 * static_cast<int64_t>(n_seqs) +
                         static_cast<int64_t>(n_tokens) * (4 + 2 * static_cast<int64_t>(dim));
  const int64_t facts_at = kHeaderBytes + arrays;
  if (facts_at + 8 > file_size) {
    throw Error(
        fmt::format("{}: truncated: {} sequences and {} tokens of width {} need {} bytes, "
                    "the file has {}",
                    path, n_seqs, n_tokens, dim, facts_at + 8, file_size));
  }
  DistillDataset d;
  d.dim = static_cast<int>(dim);
  d.seq_offsets.resize(n_seqs + 1);
  d.n_prompt.resize(n_seqs);
  d.tokens.resize(n_tokens);
  d.hidden.resize(n_tokens * dim);
  read_exact(in, d.seq_offsets.data(), static_cast<int64_t>(d.seq_offsets.size() * 8), path,
             "the sequence offsets");
  read_exact(in, d.n_prompt.data(), static_cast<int64_t>(d.n_prompt.size() * 4), path,
             "the prompt lengths");
  read_exact(in, d.tokens.data(), static_cast<int64_t>(d.tokens.size() * 4), path, "the tokens");
  read_exact(in, d.hidden.data(), static_cast<int64_t>(d.hidden.size() * 2), path,
             "the hidden states");
  uint64_t facts_len = 0;
  read_exact(in, &facts_len, 8, path, "the facts length");
  if (facts_len != static_cast<uint64_t>(file_size - facts_at - 8)) {
    throw Error(
        fmt::format("{}: the facts are {} bytes but {} bytes follow their length "
                    "(truncated or trailing data)",
                    path, facts_len, file_size - facts_at - 8));
  }
  d.facts.resize(facts_len);
  read_exact(in, d.facts.data(), static_cast<int64_t>(facts_len), path, "the facts");
  check_consistent(d, path);
  return d;
}

std::vector<int32_t> choose_draft_vocab(const DistillDataset& d, int n) {
  if (n < 0) throw Error(fmt::format("choose_draft_vocab: n = {} is negative", n));
  std::vector<int64_t> count;  // [max token + 1] occurrences among the answers
  for (int64_t s = 0; s < d.n_seqs(); ++s) {
    for (int64_t t = d.seq_offsets[s] + d.n_prompt[s]; t < d.seq_offsets[s + 1]; ++t) {
      const int32_t id = d.tokens[t];
      if (id < 0) throw Error(fmt::format("choose_draft_vocab: negative token id {}", id));
      if (static_cast<size_t>(id) >= count.size()) count.resize(static_cast<size_t>(id) + 1, 0);
      ++count[static_cast<size_t>(id)];
    }
  }
  std::vector<int32_t> ids;
  for (size_t id = 0; id < count.size(); ++id) {
    if (count[id] > 0) ids.push_back(static_cast<int32_t>(id));
  }
  const size_t k = std::min(ids.size(), static_cast<size_t>(n));
  // Most frequent first; equal counts by smaller id (ids are increasing, so a stable order).
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&count](int32_t a, int32_t b) {
                      const int64_t ca = count[static_cast<size_t>(a)];
                      const int64_t cb = count[static_cast<size_t>(b)];
                      return ca != cb ? ca > cb : a < b;
                    });
  ids.resize(k);
  return ids;
}

}  // namespace specdec
