// The Medusa heads' forward and backward pass over a minibatch of training positions
// (medusa_weights.h has the function). Position b has the target's final-normed hidden state
// h_b; head k (0-based) predicts the token k + 1 places after the root (t_{i+2+k}):
//   y_k = W_k h_b + b_k;  x_k = h_b + SiLU(y_k);  logits_k = O_k x_k             [V_d]
// The objective of a batch of B positions is J = Σ_k (1/B) Σ_b CE(logits_k, target_k) over the
// targets inside the draft vocabulary (others are masked: out of the vocabulary, or past the
// end of the sequence). The batch is a ReDrafterBatch with steps = K (inputs are not read):
// make_batch's target of step k is exactly head k's, so the data path is the ReDrafter one.
//
// Rows are head-major: row r = k * B + b. Every product is train_gemm (one fma chain per
// element) and every reduction runs in a fixed order: the thread count changes no bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drafter/medusa_weights.h"
#include "drafter/train/redrafter_grad.h"
#include "drafter/train/redrafter_params.h"

namespace specdec {

class ThreadPool;

// w's tensors in the order heads.0.weight, heads.0.bias, heads.0.lm_head, heads.1.weight, ...
// (the names of the head file); the spans stay valid while w's vectors are not resized.
std::vector<ParamTensor> medusa_param_tensors(MedusaWeights& w);
// Same shape, vocabulary and target, every parameter zero.
MedusaWeights medusa_zeros_like(const MedusaWeights& w);

class MedusaGradient {
 public:
  // Forward pass of `batch` (batch.steps must equal the number of heads); with grad != null
  // also the backward pass, overwriting *grad (shaped like w) with dJ/dθ. Per-head statistics
  // (ReDrafterLossStats with step k = head k; accepted_sum counts the leading heads that are
  // right, what a chain of the heads' top-1 drafts would get accepted).
  ReDrafterLossStats run(const MedusaWeights& w, const ReDrafterBatch& batch, MedusaWeights* grad,
                         ThreadPool* pool);

  // After a forward-only run(): the logits of row r = k * B + b: [V_d].
  const float* logits_row(int64_t r) const { return logits_.data() + r * n_vocab_; }

 private:
  int64_t n_vocab_ = 0;
  std::vector<float> y_;       // [K, B, dim] pre-activations; backward: dJ/dy
  std::vector<float> x_;       // [K, B, dim] x_k
  std::vector<float> dx_;      // [B, dim] dJ/dx of one head
  std::vector<float> logits_;  // [K, B, V_d]; backward: dJ/dlogits
  std::vector<double> row_loss_;
  std::vector<int32_t> row_argmax_;
};

// The starting point: W_k normal with std scale / sqrt(dim), b_k zero (so x_k starts near h),
// O_k normal with std out_std (< 0: 1 / sqrt(dim); 0: zero), or the target's own output rows
// out_rows [V_d, dim] for every head when given. Same seed, same heads.
void init_medusa(MedusaWeights& w, uint64_t seed, double scale, double out_std,
                 const float* out_rows = nullptr);

}  // namespace specdec
