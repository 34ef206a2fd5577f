#include "drafter/train/redrafter_params.h"

#include <fmt/format.h>

namespace specdec {

std::vector<ParamTensor> redrafter_param_tensors(ReDrafterWeights& w) {
  std::vector<ParamTensor> out;
  out.push_back({"rnn.w_embed", w.w_embed, true});
  out.push_back({"rnn.w_state", w.w_state, true});
  out.push_back({"rnn.bias", w.b_state, false});
  for (int l = 0; l < w.shape.n_blocks; ++l) {
    out.push_back({fmt::format("blocks.{}.weight", l), w.w_block[l], true});
    out.push_back({fmt::format("blocks.{}.bias", l), w.b_block[l], false});
  }
  out.push_back({"lm_head.weight", w.w_out, true});
  return out;
}

ReDrafterWeights zeros_like(const ReDrafterWeights& w) {
  return make_redrafter(w.shape, w.draft_vocab, w.target_fingerprint);
}

}  // namespace specdec
