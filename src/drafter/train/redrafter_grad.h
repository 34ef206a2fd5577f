// The ReDrafter head's forward and backward pass over a minibatch of training positions, with
// teacher forcing (redrafter_weights.h has the function). Position b of the batch has the
// target's hidden state h_b and C steps; step k (0-based) reads the true token g_k
// (g_0 = the root, g_k = the k-th token after it) and must predict the next true token:
//   s_{k+1} = SiLU(W_e e(g_k) + W_s s_k + b_s)      s_0 = 0                 [S]
//   x = concat(h_b, s_{k+1});  x += SiLU(W_l x + b_l) for each block       [D]
//   logits_k = W_o x                                                        [V_d]
// The objective of a batch of B positions is J = (1/B) Σ_b Σ_k CE(logits_k, target_k), over
// the targets inside the draft vocabulary (others are masked: out of the vocabulary, or past
// the end of the sequence); with soft labels, target_k is the mixture of the true token and the
// target model's distribution there. The embedding e() is frozen; every other parameter gets
// dJ/dθ.
//
// Rows are step-major: row r = k * B + b, so each step's rows are one contiguous block (the
// recurrence runs step by step over B rows, everything else over all R = C * B rows at once).
// Every matrix product is train_gemm (one fma chain per element) and every reduction runs in
// a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "drafter/redrafter_weights.h"

namespace specdec {

class ThreadPool;

constexpr int32_t kTargetOutOfVocab = -1;  // a true token the draft vocabulary lacks (a miss)
constexpr int32_t kTargetPastEnd = -2;     // past the sequence's end (not counted at all)

struct ReDrafterBatch {
  int n = 0;                     // B: positions
  int steps = 0;                 // C
  std::vector<float> hidden;     // [B, dim] the target's final-normed hidden state h_b
  std::vector<int32_t> inputs;   // [C, B] target token ids g_k fed to step k (g_0 = root); any
                                 // valid id where step k and all later ones are past the end
  std::vector<int32_t> targets;  // [C, B] draft-vocabulary index to predict at step k, or
                                 // kTargetOutOfVocab / kTargetPastEnd
  // Soft labels (knowledge distillation; empty: none): [C, B, V_d] the target's own
  // distribution over the draft vocabulary at each target (make_soft_labels). A scored row's
  // cross-entropy is then taken against soft_weight * soft + (1 - soft_weight) * onehot.
  std::vector<float> soft;
  float soft_weight = 0.0f;
};

// Sums over the positions of one or more batches, per step k.
struct ReDrafterLossStats {
  std::vector<double> loss_sum;    // [C] Σ cross-entropy over the scored targets
  std::vector<int64_t> n_scored;   // [C] targets inside the draft vocabulary (the loss's terms)
  std::vector<int64_t> n_targets;  // [C] targets inside the sequence (in the vocabulary or not)
  std::vector<int64_t> n_correct;  // [C] argmax == target
  int64_t n_positions = 0;
  // Σ over positions of the number of leading steps whose argmax is right: with teacher forcing
  // this is exactly what greedy drafting of one beam would get accepted.
  int64_t accepted_sum = 0;

  void reset(int steps);
  void add(const ReDrafterLossStats& o);
  double objective() const;        // Σ_k loss_sum / n_positions (J over the batches)
  double mean_loss() const;        // Σ_k loss_sum / Σ_k n_scored (per scored target)
  double accuracy(int k) const;    // n_correct / n_targets of step k (out-of-vocabulary = miss)
  double accepted_length() const;  // accepted_sum / n_positions
};

// The buffers of the pass (they grow to the largest batch and are reused).
class ReDrafterGradient {
 public:
  // Runs the forward pass of `batch` (and the backward pass when grad != null, overwriting
  // *grad, shaped like w, with dJ/dθ). embedding: [n_target_vocab, dim], the target's token
  // embedding rows as floats. Returns the batch's statistics.
  ReDrafterLossStats run(const ReDrafterWeights& w, std::span<const float> embedding,
                         const ReDrafterBatch& batch, ReDrafterWeights* grad, ThreadPool* pool);

  // After run(): the logits of row r = k * B + b (forward only; a backward pass overwrites them
  // with dJ/dlogits): [V_d].
  const float* logits_row(int64_t r) const { return logits_.data() + r * n_vocab_; }
  // After run(): the RNN state s_{k+1} of row r: [S].
  const float* state_row(int64_t r) const { return state_.data() + r * state_dim_; }

 private:
  int64_t n_vocab_ = 0, state_dim_ = 0;
  std::vector<float> e_in_;        // [R, dim] e(g_k) of every row
  std::vector<float> pre_;         // [R, S] RNN pre-activations; backward: dJ/dpre
  std::vector<float> state_;       // [R, S] s_{k+1}
  std::vector<float> ds_;          // [R, S] dJ/ds
  std::vector<float> x_;           // [L + 1, R, D] block inputs x_0 = concat(h, s), then outputs
  std::vector<float> y_;           // [L, R, D] block pre-activations; backward: dJ/dy
  std::vector<float> dx_;          // [R, D] dJ/dx of the current block output
  std::vector<float> h_rows_;      // [B, D] the h part of block 0 (b_0 + W_0[:, :dim] h), or
                                   // backward: Σ_k dJ/dy_0 of each position
  std::vector<float> logits_;      // [R, V_d]; backward: dJ/dlogits
  std::vector<double> row_loss_;   // [R]
  std::vector<int32_t> row_argmax_;  // [R]
};

}  // namespace specdec
