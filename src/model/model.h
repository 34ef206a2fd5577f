// A loaded language model and its forward pass (DESIGN §3):
//   forward(kv, batch) runs n_new tokens with explicit positions and an explicit attention mask
//   (causal chain or token tree) over the sequence's cached tokens, writes their K/V at slots
//   [kv.size(), kv.size() + n_new) and returns logits (and last hidden states) only for the rows
//   asked for. The model never knows who proposed the tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kv/kv_cache.h"
#include "model/config.h"

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
};

struct ForwardResult {
  std::span<const float> logits;  // [output_rows.size(), n_vocab]
  std::span<const float> hidden;  // [output_rows.size(), dim] final-normed hidden (lm_head input)
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

  // A KV cache shaped for this model with room for `capacity` tokens, stored as `type`.
  KvCache make_kv_cache(int64_t capacity, KvType type = KvType::kF16) const;

  // Runs the batch; the returned spans stay valid until the next forward call on this model.
  // Throws specdec::Error if the batch would not fit in the cache or a token id is out of range.
  virtual ForwardResult forward(KvCache& kv, const ForwardBatch& batch, ThreadPool* pool) = 0;

  void set_dump(TensorDumpFn fn) { dump_ = std::move(fn); }

  // For tests and experiments: the forward pass reads the config on every call, so changing it
  // (e.g. a wrong RoPE base) changes the model. Shapes must not be changed.
  ModelConfig& mutable_config() { return config_; }

  // Opens the GGUF at `path` and builds the model for its architecture; throws specdec::Error
  // naming the file (and tensor) when anything is missing, mis-shaped or of an unsupported type.
  static std::unique_ptr<Model> load(const std::string& path);

 protected:
  Model(std::unique_ptr<GgufFile> file, ModelConfig config);
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  TensorDumpFn dump_;
};

}  // namespace specdec
