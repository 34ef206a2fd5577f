// Model::embed_tokens and Model::fingerprint: what drafter heads need from their target, read
// from the GGUF on the host so that they work for a model on any device.
#include <xxhash.h>

#include <fmt/format.h>

#include "backend/cpu/matmul.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/weights.h"
#include "util/check.h"

namespace specdec {

struct Model::EmbeddingFacts {
  WeightMatrix w;           // token_embd.weight: [n_vocab, dim]
  std::string fingerprint;  // "arch:n_vocab:dim:xxh3 of the matrix's bytes"
};

const Model::EmbeddingFacts& Model::embedding_facts() const {
  std::call_once(embedding_once_, [this] {
    const ModelConfig& c = config_;
    const GgufTensor& t = require_matrix(*file_, "token_embd.weight", c.n_vocab, c.dim);
    auto f = std::make_shared<EmbeddingFacts>();
    f->w.type = t.type;
    f->w.data = t.data;
    f->w.rows = c.n_vocab;
    f->w.cols = c.dim;
    f->w.row_bytes = ggml_row_bytes(t.type, c.dim);
    f->fingerprint = fmt::format("{}:{}:{}:{:016x}", c.arch, c.n_vocab, c.dim,
                                 XXH3_64bits(t.data, t.nbytes));
    embedding_facts_ = std::move(f);
  });
  return *embedding_facts_;
}

void Model::embed_tokens(std::span<const int32_t> tokens, float* out) const {
  const ModelConfig& c = config_;
  const WeightMatrix& w = embedding_facts().w;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      throw Error(fmt::format("token id {} is out of range (vocabulary of {})", tokens[i], c.n_vocab));
    }
    dequantize_row(w, tokens[i], out + static_cast<int64_t>(i) * c.dim);
  }
}

const std::string& Model::fingerprint() const { return embedding_facts().fingerprint; }

}  // namespace specdec
