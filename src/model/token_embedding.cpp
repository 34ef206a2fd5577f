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

namespace {

WeightMatrix embedding_matrix(const GgufFile& file, const ModelConfig& c) {
  const GgufTensor& t = require_matrix(file, "token_embd.weight", c.n_vocab, c.dim);
  WeightMatrix w;
  w.type = t.type;
  w.data = t.data;
  w.rows = c.n_vocab;
  w.cols = c.dim;
  w.row_bytes = ggml_row_bytes(t.type, c.dim);
  return w;
}

}  // namespace

void Model::embed_tokens(std::span<const int32_t> tokens, float* out) const {
  const ModelConfig& c = config_;
  const WeightMatrix w = embedding_matrix(*file_, c);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      throw Error(fmt::format("token id {} is out of range (vocabulary of {})", tokens[i], c.n_vocab));
    }
    dequantize_row(w, tokens[i], out + static_cast<int64_t>(i) * c.dim);
  }
}

std::string Model::fingerprint() const {
  const ModelConfig& c = config_;
  const GgufTensor& t = require_matrix(*file_, "token_embd.weight", c.n_vocab, c.dim);
  const uint64_t h = XXH3_64bits(t.data, t.nbytes);
  return fmt::format("{}:{}:{}:{:016x}", c.arch, c.n_vocab, c.dim, h);
}

}  // namespace specdec
