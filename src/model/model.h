// A loaded language model and its forward pass (DESIGN §3):
//   forward(seqs) runs, for each sequence of the batch, its new tokens with explicit positions
//   and an explicit attention mask (causal chain or token tree) over that sequence's cached
//   tokens, writes their K/V at its slots [n_past, n_past + n_new) and returns logits (and last
//   hidden states) only for the rows asked for. All sequences' tokens go through every weight
//   matrix together (each weight streamed once per pass); attention reads each sequence's own
//   K/V. The model never knows who proposed the tokens, nor which sequences share a pass: each
//   row's result is bitwise the one it gets alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "kv/kv_cache.h"
#include "kv/kv_device.h"
#include "kv/paged_kv.h"
#include "model/config.h"
#include "model/device.h"
#include "model/forward_scratch.h"

namespace specdec {

class GgufFile;
class ThreadPool;

struct ForwardBatch {
  std::span<const int32_t> tokens;     // [n_new]
  std::span<const int32_t> positions;  // [n_new] RoPE positions (past_len + depth for a tree)
  // [n_new, n_new] row-major, nonzero where new token i attends to new token j; empty = causal.
  // Every new token always attends to all kv.size() cached slots.
  std::span<const uint8_t> mask;
  std::span<const int32_t> output_rows;  // rows of the batch to return logits for, increasing
  bool want_hidden = false;              // also return the last hidden state of output_rows
  // Hidden states only: when every sequence of a pass sets this (and want_hidden), the model
  // may skip the output projection and return empty logits (the CPU model does).
  bool skip_logits = false;
};

// One sequence's part of a batched pass.
struct SeqBatch {
  SeqKv kv;            // its cache: kv.n_past cached slots, the table covering n_past + n_new
  ForwardBatch batch;  // its new tokens (mask and output_rows index this sequence's rows)
};

struct ForwardResult {
  // Output rows of all sequences in batch order (each sequence's output_rows in order).
  std::span<const float> logits;  // [output rows, n_vocab]
  // [output rows, dim] final-normed hidden (lm_head input); when any sequence set want_hidden.
  std::span<const float> hidden;
};

// Called with every named intermediate when set (debugging; off in normal runs).
using TensorDumpFn =
    std::function<void(const char* name, int layer, const float* data, int64_t rows, int64_t cols)>;

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }

  // Bytes of weights one forward pass streams (every matrix once), for bandwidth figures.
  virtual int64_t weight_bytes() const = 0;
  // FLOPs of the weight matmuls for one token (2 * multiply-adds).
  virtual int64_t matmul_flops_per_token() const = 0;

  // A KV cache shaped for this model with room for `capacity` tokens, stored as `type` (on the
  // model's device).
  KvCache make_kv_cache(int64_t capacity, KvType type = KvType::kF16) const;
  // A paged KV pool shaped for this model (n_blocks blocks of block_slots slots), on the model's
  // device: what the engine and the batched draft model store their sequences in.
  std::unique_ptr<PagedKvStorage> make_paged_kv(int32_t n_blocks, int64_t block_slots,
                                                KvType type = KvType::kF16) const;
  // The device memory of such a pool, for a model whose forward pass reads its KV on a device
  // (null: host memory, the CPU model).
  virtual std::unique_ptr<KvDeviceMemory> make_kv_device_memory(int32_t n_blocks,
                                                                int64_t block_slots,
                                                                KvType type) const {
    (void)n_blocks;
    (void)block_slots;
    (void)type;
    return nullptr;
  }
  // Where the forward pass runs, for display: "cpu" or "cuda".
  virtual const char* device_name() const { return "cpu"; }

  // Runs the sequences' batches in one pass, writing their K/V into their storage (the callers
  // advance their n_past). The returned spans point into `scratch` and stay valid until its next
  // use. Throws specdec::Error, with nothing written, if a batch would not fit in its sequence's
  // blocks or context, or a token id or position is out of range. Reentrant: every buffer of the
  // pass is in `scratch` (one per concurrent caller).
  virtual ForwardResult forward(std::span<const SeqBatch> seqs, ThreadPool* pool,
                                ForwardScratch* scratch) = 0;
  // One sequence with a contiguous cache, in the model's own scratch (not reentrant); appends
  // the batch's tokens to kv. The spans stay valid until the next call on this model.
  ForwardResult forward(KvCache& kv, const ForwardBatch& batch, ThreadPool* pool);

  void set_dump(TensorDumpFn fn) { dump_ = std::move(fn); }

  // The target's own (input) token embedding rows as floats, read from the GGUF on the host
  // whatever the device: out[tokens.size(), dim]. Drafter heads (ReDrafter) share it frozen.
  // Throws specdec::Error for a token id out of range. Thread-safe.
  void embed_tokens(std::span<const int32_t> tokens, float* out) const;
  // A fingerprint of this model for drafter heads trained on it: architecture, vocabulary size,
  // width and an xxh3 of the token embedding's bytes, e.g. "llama:49152:576:6f1c...". A head
  // trained for another model (or another quantization of its embedding) has another one.
  // Hashed once (the first call), then kept.
  const std::string& fingerprint() const;

  // For tests and experiments: the forward pass reads the config on every call, so changing it
  // (e.g. a wrong RoPE base) changes the model. Shapes must not be changed.
  ModelConfig& mutable_config() { return config_; }

  // Opens the GGUF at `path` and builds the model for its architecture; throws specdec::Error
  // naming the file (and tensor) when anything is missing, mis-shaped or of an unsupported type.
  static std::unique_ptr<Model> load(const std::string& path);
  // The same on `device`: kCuda uploads the weights to the GPU (throws specdec::Error when the
  // build has no CUDA backend, or no device answers).
  static std::unique_ptr<Model> load(const std::string& path, Device device);

 protected:
  Model(std::unique_ptr<GgufFile> file, ModelConfig config);
  // Checks one sequence's part of a forward pass (token ids, positions, mask and output rows,
  // the KV shape and room): throws specdec::Error, before anything is written.
  void check_seq_batch(const SeqBatch& sb) const;
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  TensorDumpFn dump_;
  ForwardScratch scratch_;  // of forward(KvCache&, ...)

 private:
  // What embed_tokens and fingerprint read, looked up and hashed once (beam search embeds a few
  // rows at every step; the fingerprint hashes the whole embedding).
  struct EmbeddingFacts;
  const EmbeddingFacts& embedding_facts() const;
  mutable std::once_flag embedding_once_;
  mutable std::shared_ptr<const EmbeddingFacts> embedding_facts_;
};

}  // namespace specdec
