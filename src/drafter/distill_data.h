// Training data for drafter heads by self-distillation: prompts answered by the target itself
// (generated with the engine's batching) and the target's final-normed hidden state at the
// positions training reads (recorded while answering), computed once and reused across epochs.
//
// Training position i of a sequence (tokens t_0 .. t_{L-1}) pairs the hidden state h_i (the
// target's output at t_i, which predicts t_{i+1}) with the root t_{i+1} and the tokens the head
// must draft after it: t_{i+2}, ..., t_{i+1+C}. Only positions whose root lies in the answer
// are trained on (the head drafts what the target writes, not what users write).
//
// File (little-endian): magic "SDDS", u32 version 1, u32 dim, u64 n_seqs, u64 n_tokens,
// then i64 seq_offsets[n_seqs + 1], i32 n_prompt[n_seqs], i32 tokens[n_tokens],
// u16 hidden[n_tokens, dim] (IEEE half), then a UTF-8 JSON string of facts (u64 length + bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace specdec {

class Model;
class Tokenizer;
class ThreadPool;

struct DistillDataset {
  int dim = 0;
  std::vector<int64_t> seq_offsets;  // [n_seqs + 1] into tokens / hidden rows
  std::vector<int32_t> n_prompt;     // [n_seqs] prompt tokens at the start of each sequence
  std::vector<int32_t> tokens;       // [n_tokens] prompt + answer of every sequence
  std::vector<uint16_t> hidden;      // [n_tokens, dim] f16: final-normed hidden at each token
                                     // (zero where not recorded: DistillOptions::hidden_passes)
  std::string facts;                 // JSON: target fingerprint, prompts file, sampling, ...

  int64_t n_seqs() const { return static_cast<int64_t>(n_prompt.size()); }
  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  // Row of `hidden` as floats: out[dim].
  void hidden_row(int64_t token_index, float* out) const;
};

struct DistillOptions {
  int max_prompt_tokens = 512;  // longer prompts are skipped (counted in the report)
  int max_new_tokens = 256;     // answer length at most
  float temperature = 0.0f;     // 0: greedy answers
  uint64_t seed = 1;
  bool chat = true;             // apply the model's chat template to each prompt
  int max_prompts = 0;          // 0: all
  int first_prompt = 0;         // index in the list of the first prompt considered (shards)
  // Speed only (the data does not depend on them):
  int max_seqs = 16;         // answers generated together (the engine's --max-seqs)
  int64_t kv_cache_mib = 0;  // the engine's KV pool; 0: max_seqs whole sequences, <= 1 GiB
  int hidden_chunk = 256;    // tokens per hidden-state pass (several sequences packed)
  // false (default): the hidden states come from the engine while it answers (each answer
  // token's producing row: positions n_prompt-1 .. L-2, all that training reads; the other rows
  // are zero). true: one more pass over every whole sequence fills every row (~40% more time).
  bool hidden_passes = false;
};

// Where the time of build_distill_dataset went (for progress reports and benchmarks).
struct DistillTimings {
  double encode_s = 0;  // chat template + tokenization
  double answer_s = 0;  // the engine answering
  double hidden_s = 0;  // the hidden-state passes
  int64_t prompt_tokens = 0;
  int64_t answer_tokens = 0;
  int64_t hidden_tokens = 0;  // prompt + answer tokens through the hidden passes (0 without)
  int64_t hidden_passes = 0;
};

// Answers `prompts` with the target (batched engine), recording the hidden states as it goes
// (options.hidden_passes: in one more pass over prompt + answer instead). progress(done, total) is called as answers
// finish. Throws specdec::Error (bad prompt file content, no prompt usable).
//
// In detail: prompts are taken in order from index first_prompt until max_prompts are used
// (0: all); facts["next_prompt"] is the index after the last one considered (where a next
// shard starts). A prompt is encoded as `specdec generate` does (chat: the template of
// {"user": prompt} with the generation prompt, else BOS + text, special-token text parsed);
// empty ones and ones of more than max_prompt_tokens tokens (or no room left in the context)
// are skipped and counted in the facts. Answers: greedy when temperature is 0, else sampled with seed options.seed + the
// prompt's index in `prompts`; they end at the first end-of-generation token (kept as the last
// answer token) or after max_new_tokens (or at the context). Sequence i is the i-th used
// prompt. hidden rows, as IEEE halves (round to nearest even): the engine's
// RequestOutput::hidden (rows n_prompt-1 .. L-2; the others zero), or with hidden_passes
// Model::forward over each whole sequence in an f16 KV cache, every row asked for.
DistillDataset build_distill_dataset(Model& target, const Tokenizer& tokenizer,
                                     std::span<const std::string> prompts,
                                     const DistillOptions& options, ThreadPool* pool,
                                     const std::function<void(int64_t, int64_t)>& progress = {},
                                     DistillTimings* timings = nullptr);

void save_distill_dataset(const std::string& path, const DistillDataset& d);
// specdec::Error naming the file when it is missing, truncated or malformed.
DistillDataset load_distill_dataset(const std::string& path);

// Appends `more` (a shard made from the same target, e.g. the prompts after `into`'s: see
// DistillOptions::first_prompt) after `into`'s sequences. facts become {"kind", "target",
// "shards": [each shard's facts]}. Throws specdec::Error when the widths or targets differ;
// `into` is unchanged then.
void append_distill_dataset(DistillDataset& into, DistillDataset&& more);

// The fingerprint of the target that made `d` (its facts' "target"; "" when they name none).
std::string distill_target(const DistillDataset& d);

// The n most frequent tokens among the answers' tokens (ties by id), as the draft vocabulary of
// a head: [min(n, distinct tokens)], most frequent first, equal counts by smaller id.
std::vector<int32_t> choose_draft_vocab(const DistillDataset& d, int n);

}  // namespace specdec
