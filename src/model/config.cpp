#include "model/config.h"

#include <fmt/format.h>

#include "model/gguf.h"
#include "util/check.h"

namespace specdec {
namespace {

int require_int(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = f.get_int(key);
  if (!v) throw Error(fmt::format("{}: required metadata '{}' is missing", f.path(), key));
  if (*v < lo || *v > hi) {
    throw Error(fmt::format("{}: metadata '{}' = {} is out of range [{}, {}]", f.path(), key, *v,
                            lo, hi));
  }
  return static_cast<int>(*v);
}

int optional_int(const GgufFile& f, const std::string& key, int fallback, int64_t lo, int64_t hi) {
  return f.find(key) ? require_int(f, key, lo, hi) : fallback;
}

// The architectures that share the llama block (RMSNorm, GQA attention with RoPE, SwiGLU) and
// what they differ in, as data for the one forward pass (archs/llama.cpp).
struct ArchTraits {
  const char* name;
  RopeStyle rope_style;
  float default_rope_base;  // when <arch>.rope.freq_base is absent
  bool qkv_bias;
};

constexpr ArchTraits kArchs[] = {
    // GGUF llama stores q/k rows permuted for adjacent-pair RoPE.
    {"llama", RopeStyle::kNorm, 10000.0f, false},
    {"mistral", RopeStyle::kNorm, 10000.0f, false},
    // Qwen2 / Qwen2.5: biases on Q, K and V; RoPE rotates the halves of each head (the weights are
    // stored as in the Hugging Face checkpoint, unpermuted).
    {"qwen2", RopeStyle::kNeox, 1000000.0f, true},
};

const ArchTraits* find_arch(const std::string& name) {
  for (const ArchTraits& a : kArchs) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  const std::optional<std::string> arch = f.get_string("general.architecture");
  if (!arch) throw Error(fmt::format("{}: metadata 'general.architecture' is missing", f.path()));
  c.arch = *arch;
  const ArchTraits* traits = find_arch(c.arch);
  if (traits == nullptr) {
    throw Error(fmt::format("{}: unsupported architecture '{}' (supported: llama, mistral, qwen2)",
                            f.path(), c.arch));
  }
  c.name = f.get_string("general.name").value_or(c.arch);
  const std::string a = c.arch + ".";
  constexpr int64_t kBig = 1 << 20;
  c.dim = require_int(f, a + "embedding_length", 1, kBig);
  c.n_layers = require_int(f, a + "block_count", 1, 4096);
  c.n_heads = require_int(f, a + "attention.head_count", 1, 4096);
  c.n_kv_heads = optional_int(f, a + "attention.head_count_kv", c.n_heads, 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0) {
    throw Error(fmt::format("{}: head_count {} is not a multiple of head_count_kv {}", f.path(),
                            c.n_heads, c.n_kv_heads));
  }
  c.ffn_dim = require_int(f, a + "feed_forward_length", 1, kBig);
  c.n_ctx_train = optional_int(f, a + "context_length", 2048, 1, 1 << 24);
  c.head_dim = optional_int(f, a + "attention.key_length", c.dim / c.n_heads, 1, kBig);
  if (c.head_dim * c.n_heads != c.dim && !f.find(a + "attention.key_length")) {
    throw Error(fmt::format("{}: embedding_length {} is not a multiple of head_count {}", f.path(),
                            c.dim, c.n_heads));
  }
  c.rope_dim = optional_int(f, a + "rope.dimension_count", c.head_dim, 2, c.head_dim);
  if (c.rope_dim % 2 != 0) {
    throw Error(fmt::format("{}: rope.dimension_count {} is odd", f.path(), c.rope_dim));
  }
  c.rope_freq_base =
      static_cast<float>(f.get_float(a + "rope.freq_base").value_or(traits->default_rope_base));
  if (!(c.rope_freq_base > 1.0f)) {
    throw Error(fmt::format("{}: rope.freq_base {} must be > 1", f.path(), c.rope_freq_base));
  }
  const std::string scaling = f.get_string(a + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const double factor = f.get_float(a + "rope.scaling.factor").value_or(1.0);
    if (!(factor > 0.0)) throw Error(fmt::format("{}: rope.scaling.factor must be > 0", f.path()));
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none") {
    throw Error(fmt::format("{}: rope scaling '{}' is not supported", f.path(), scaling));
  }
  c.rms_eps =
      static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_style = traits->rope_style;
  c.qkv_bias = traits->qkv_bias;
  // The vocabulary size comes from the token list (the metadata key is optional).
  if (const auto* tokens = f.get_string_array("tokenizer.ggml.tokens")) {
    c.n_vocab = static_cast<int>(tokens->size());
  } else {
    c.n_vocab = optional_int(f, a + "vocab_size", 0, 1, 1 << 24);
  }
  if (c.n_vocab <= 0) throw Error(fmt::format("{}: no vocabulary in the file", f.path()));
  return c;
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{} ({}): vocab {}, dim {}, layers {}, heads {}/{} (kv), head_dim {}, ffn {}, ctx {}, "
      "rope base {} dim {}",
      name, arch, n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_ctx_train,
      rope_freq_base, rope_dim);
}

}  // namespace specdec
