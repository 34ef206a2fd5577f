// Medusa heads ready to draft: matrices in a matmul type (Q8_0 by default), and one evaluation
// of all K heads on one hidden state h [dim]:
//   y   [K dim]  the K residual matrices stacked: one matmul
//   x_k [dim]    h + SiLU(y_k + b_k)
//   logits [K, V_d]  each head's own projection of its x_k
// The same function as medusa_head_ref (weights rounded to the type).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "drafter/head_matrix.h"
#include "drafter/medusa_weights.h"

namespace specdec {

class ThreadPool;

class MedusaHeads {
 public:
  MedusaHeads(const MedusaWeights& w, GgmlType weight_type = GgmlType::kQ8_0);
  MedusaHeads(const MedusaHeads&) = delete;
  MedusaHeads& operator=(const MedusaHeads&) = delete;

  const MedusaShape& shape() const { return shape_; }
  std::span<const int32_t> draft_vocab() const { return draft_vocab_; }
  GgmlType weight_type() const { return type_; }
  int64_t weight_bytes() const;

  // h: [dim]; logits: [K, V_d]. scratch grows as needed.
  void run(std::span<const float> h, float* logits, std::vector<float>* scratch,
           ThreadPool* pool) const;

 private:
  MedusaShape shape_;
  GgmlType type_;
  std::vector<int32_t> draft_vocab_;  // [V_d]
  HeadMatrix res_;                    // [K dim, dim]
  std::vector<float> b_res_;          // [K dim]
  std::vector<HeadMatrix> out_;       // K x [V_d, dim]
};

}  // namespace specdec
