// Model hyper-parameters, read from GGUF metadata (`<arch>.*` keys). Shapes are runtime data.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cpu/ops.h"

namespace specdec {

class GgufFile;

struct ModelConfig {
  std::string arch;  // general.architecture: "llama", "mistral" or "qwen2"
  std::string name;  // general.name, for display
  int n_vocab = 0;
  int n_ctx_train = 0;  // <arch>.context_length
  int dim = 0;          // <arch>.embedding_length
  int n_layers = 0;     // <arch>.block_count
  int n_heads = 0;      // <arch>.attention.head_count
  int n_kv_heads = 0;   // <arch>.attention.head_count_kv (defaults to n_heads)
  int head_dim = 0;     // dim / n_heads (or <arch>.attention.key_length)
  int ffn_dim = 0;      // <arch>.feed_forward_length
  int rope_dim = 0;     // <arch>.rope.dimension_count (defaults to head_dim)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / <arch>.rope.scaling.factor for linear scaling
  float rms_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kNorm;
  // The Q, K and V projections add biases (blk.N.attn_{q,k,v}.bias): required by the
  // architecture (qwen2). Files of other architectures may still carry them (the model reads
  // whatever biases are present).
  bool qkv_bias = false;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }

  // Throws specdec::Error naming the file and key when a required value is missing or absurd.
  static ModelConfig from_gguf(const GgufFile& file);
  std::string summary() const;
};

}  // namespace specdec
