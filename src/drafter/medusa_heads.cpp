#include "drafter/medusa_heads.h"

#include <cmath>

#include "util/check.h"

namespace specdec {

MedusaHeads::MedusaHeads(const MedusaWeights& w, GgmlType weight_type)
    : shape_(w.shape), type_(head_weight_type(weight_type, {w.shape.dim})), draft_vocab_(w.draft_vocab) {
  const int64_t dim = shape_.dim, k = shape_.n_heads;
  std::vector<float> res(static_cast<size_t>(k * dim * dim));
  for (int64_t i = 0; i < k; ++i) {
    std::copy(w.w_res[i].begin(), w.w_res[i].end(), res.begin() + i * dim * dim);
    b_res_.insert(b_res_.end(), w.b_res[i].begin(), w.b_res[i].end());
  }
  res_ = HeadMatrix(type_, res.data(), k * dim, dim);
  out_.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out_.emplace_back(type_, w.w_out[i].data(), shape_.n_draft_vocab, dim);
}

int64_t MedusaHeads::weight_bytes() const {
  int64_t total = res_.bytes();
  for (const HeadMatrix& m : out_) total += m.bytes();
  return total;
}

void MedusaHeads::run(std::span<const float> h, float* logits, std::vector<float>* scratch,
                      ThreadPool* pool) const {
  const int64_t dim = shape_.dim, k = shape_.n_heads;
  SPECDEC_CHECK(static_cast<int64_t>(h.size()) == dim, "MedusaHeads::run: hidden size");
  scratch->resize(static_cast<size_t>(2 * k * dim));
  float* y = scratch->data();            // [K dim]
  float* x = scratch->data() + k * dim;  // [K, dim]
  matmul(res_.w(), h.data(), 1, y, pool);
  for (int64_t i = 0; i < k * dim; ++i) {
    const float v = y[i] + b_res_[i];
    x[i] = h[i % dim] + v / (1.0f + std::exp(-v));
  }
  for (int64_t i = 0; i < k; ++i) {
    matmul(out_[i].w(), x + i * dim, 1, logits + i * shape_.n_draft_vocab, pool);
  }
}

}  // namespace specdec
