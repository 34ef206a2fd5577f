// A ReDrafter head's trainable tensors as one list (name, values, whether weight decay applies),
// in a fixed order, so that the optimizer, gradient clipping, checkpoints and the gradient
// checks walk every parameter the same way. The names are those of the head file
// (redrafter_weights.h); the draft vocabulary is not a parameter.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "drafter/redrafter_weights.h"

namespace specdec {

struct ParamTensor {
  std::string name;        // "rnn.w_embed", "rnn.w_state", "rnn.bias", "blocks.L.weight", ...
  std::span<float> data;   // into the ReDrafterWeights it came from
  bool decay = false;      // matrices: true (AdamW's weight decay); biases: false
};

// w's tensors in the order rnn.w_embed, rnn.w_state, rnn.bias, blocks.0.weight, blocks.0.bias,
// ..., lm_head.weight. The spans stay valid while w's vectors are not resized.
std::vector<ParamTensor> redrafter_param_tensors(ReDrafterWeights& w);

// A head of the same shape, vocabulary and target, every parameter zero (gradients, moments).
ReDrafterWeights zeros_like(const ReDrafterWeights& w);

}  // namespace specdec
