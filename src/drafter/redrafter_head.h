// A ReDrafter head ready to draft: its matrices converted once to a matmul type (Q8_0 by
// default: a step streams ~1/4 of the f32 bytes, through the same int8 kernels as the target),
// and one batched step over the live beams.
//
// step() for n rows (beams) sharing one target hidden state h [dim]:
//   in    [n, dim + S]  concat(e(g), s_prev) per row (the caller fills e and s_prev)
//   s     [n, S]        SiLU([W_e | W_s] · in + b_s)          (one matmul over the stacked RNN)
//   x     [n, D]        concat(h, s), then x += SiLU(W_l · x + b_l) per block
//   logits[n, V_d]      W_o · x
// The same function as redrafter_step_ref (weights rounded to `weight_type`).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "drafter/head_matrix.h"
#include "drafter/redrafter_weights.h"

namespace specdec {

class ThreadPool;

struct ReDrafterScratch {
  std::vector<float> x;  // [n, D]
  std::vector<float> y;  // [n, D]
};

class ReDrafterHead {
 public:
  // weight_type: kQ8_0 (widths must be multiples of 32, else the head stays F32), kF16 or kF32.
  ReDrafterHead(const ReDrafterWeights& w, GgmlType weight_type = GgmlType::kQ8_0);
  ReDrafterHead(const ReDrafterHead&) = delete;
  ReDrafterHead& operator=(const ReDrafterHead&) = delete;

  const ReDrafterShape& shape() const { return shape_; }
  std::span<const int32_t> draft_vocab() const { return draft_vocab_; }
  GgmlType weight_type() const { return type_; }
  // Bytes of weights one step streams.
  int64_t weight_bytes() const;

  // in: [n, dim + S]; s_out: [n, S]; logits: [n, V_d]. h: [dim].
  void step(std::span<const float> h, const float* in, int n, float* s_out, float* logits,
            ReDrafterScratch* scratch, ThreadPool* pool) const;

 private:
  ReDrafterShape shape_;
  GgmlType type_;
  std::vector<int32_t> draft_vocab_;   // [V_d]
  HeadMatrix rnn_;                         // [S, dim + S]: W_e | W_s
  std::vector<float> b_state_;         // [S]
  std::vector<HeadMatrix> blocks_;         // n_blocks x [D, D]
  std::vector<std::vector<float>> b_block_;  // n_blocks x [D]
  HeadMatrix out_;                         // [V_d, D]
};

}  // namespace specdec
