// A ReDrafter head ready to draft: its matrices converted once to a matmul type (Q8_0 by
// default, Q4_1 as the commands run it on the CPU: a step streams ~1/4 or ~1/6 of the f32
// bytes, through the same int8 kernels as the target),
// and one batched step over the live beams.
//
// step() for n rows (beams) sharing one target hidden state h [dim]:
//   in    [n, dim + S]  concat(e(g), s_prev) per row (the caller fills e and s_prev)
//   s     [n, S]        SiLU([W_e | W_s] · in + b_s)          (one matmul over the stacked RNN)
//   x     [n, D]        concat(h, s), then x += SiLU(W_l · x + b_l) per block
//   logits[n, V_d]      W_o · x
// The same function as redrafter_step_ref (weights rounded to `weight_type`).
//
// With a device attached (set_device: the target's GPU), step() runs there instead - the same
// weights in the same type, inputs and outputs still in host memory - so that a GPU target's
// drafting does not stream the head's weights through the host's memory at every step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "drafter/head_matrix.h"
#include "drafter/redrafter_weights.h"

namespace specdec {

class ThreadPool;

struct ReDrafterScratch {
  std::vector<float> x;  // [n, D]
  std::vector<float> y;  // [n, D]
  std::vector<const float*> h_rows;  // [n] step()'s shared h, a pointer per row
};

// The head's step on a device: ReDrafterHead::step's function on the same weights, up to float
// rounding (silu's exp, the order of the matmul's sums). Host memory in and out; step() may be
// called from any one thread at a time per head (it locks).
class ReDrafterHeadDevice {
 public:
  virtual ~ReDrafterHeadDevice() = default;
  virtual const char* device_name() const = 0;
  // h: [dim]; in: [n, dim + S]; s_out: [n, S]; logits: [n, V_d].
  virtual void step(std::span<const float> h, const float* in, int n, float* s_out,
                    float* logits) = 0;
};

// A copy of the head on `device` ("cuda": drafter/redrafter_head_cuda.cpp), its matrices in
// weight_type (Q8_0, Q4_1, F16 or F32, as ReDrafterHead chose). Throws specdec::Error for a device this
// build lacks or that does not answer.
std::unique_ptr<ReDrafterHeadDevice> make_redrafter_head_device(const ReDrafterWeights& w,
                                                                GgmlType weight_type,
                                                                const std::string& device);

class ReDrafterHead {
 public:
  // weight_type: kQ8_0 or kQ4_1 (widths must be multiples of 32, else the head stays F32), kF16
  // or kF32.
  ReDrafterHead(const ReDrafterWeights& w, GgmlType weight_type = GgmlType::kQ8_0);
  ReDrafterHead(const ReDrafterHead&) = delete;
  ReDrafterHead& operator=(const ReDrafterHead&) = delete;

  const ReDrafterShape& shape() const { return shape_; }
  std::span<const int32_t> draft_vocab() const { return draft_vocab_; }
  GgmlType weight_type() const { return type_; }
  // Bytes of weights one step streams.
  int64_t weight_bytes() const;

  // in: [n, dim + S]; s_out: [n, S]; logits: [n, V_d]. h: [dim]. On the attached device if
  // any (scratch and pool unused then).
  void step(std::span<const float> h, const float* in, int n, float* s_out, float* logits,
            ReDrafterScratch* scratch, ThreadPool* pool) const;
  // The same with a hidden state per row (h_rows[r]: [dim]), so that the beam searches of
  // several sequences share one pass over the weights. Each row's result is bitwise what it
  // gets in step() alone (the kernels' rows do not depend on each other). On a device, each
  // run of rows with the same h is one device step.
  void step_rows(const float* const* h_rows, const float* in, int n, float* s_out, float* logits,
                 ReDrafterScratch* scratch, ThreadPool* pool) const;

  // Runs every later step on `device` (null: back on the CPU).
  void set_device(std::unique_ptr<ReDrafterHeadDevice> device) { device_ = std::move(device); }
  // "cpu" or the attached device's name.
  const char* device_name() const { return device_ ? device_->device_name() : "cpu"; }

 private:
  ReDrafterShape shape_;
  GgmlType type_;
  std::vector<int32_t> draft_vocab_;   // [V_d]
  HeadMatrix rnn_;                         // [S, dim + S]: W_e | W_s
  std::vector<float> b_state_;         // [S]
  std::vector<HeadMatrix> blocks_;         // n_blocks x [D, D]
  std::vector<std::vector<float>> b_block_;  // n_blocks x [D]
  HeadMatrix out_;                         // [V_d, D]
  std::unique_ptr<ReDrafterHeadDevice> device_;  // null: the CPU
};

}  // namespace specdec
