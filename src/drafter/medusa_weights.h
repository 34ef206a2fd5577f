// Medusa heads' parameters (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework
// with Multiple Decoding Heads"), as trained and stored: K heads on the target's final-normed
// hidden state h [dim] before the root; head k drafts the token k + 1 places after the root:
//   x_k      = h + SiLU(W_k · h + b_k)        [dim]   (one residual block per head)
//   logits_k = O_k · x_k                      [V_d]   over the draft vocabulary
// File: safetensors with "heads.K.weight" [dim, dim], "heads.K.bias" [dim],
// "heads.K.lm_head" [V_d, dim], "draft_vocab" (I32) [V_d]; metadata "specdec.kind" = "medusa",
// "specdec.target" (Model::fingerprint), "specdec.dim", "specdec.n_heads",
// "specdec.n_target_vocab", and "train.*" facts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "drafter/safetensors.h"

namespace specdec {

class Model;

struct MedusaShape {
  int dim = 0;
  int n_heads = 0;         // K
  int n_draft_vocab = 0;   // V_d
  int n_target_vocab = 0;
  int64_t num_params() const;
};

struct MedusaWeights {
  MedusaShape shape;
  std::string target_fingerprint;
  std::vector<int32_t> draft_vocab;         // [V_d] distinct target token ids
  std::vector<std::vector<float>> w_res;    // K x [dim, dim]
  std::vector<std::vector<float>> b_res;    // K x [dim]
  std::vector<std::vector<float>> w_out;    // K x [V_d, dim]
  std::map<std::string, std::string> info;  // "train.*"
};

MedusaWeights make_medusa(const MedusaShape& shape, std::vector<int32_t> draft_vocab,
                          std::string target_fingerprint);
StFile medusa_to_st(const MedusaWeights& w, StDtype dtype);
MedusaWeights medusa_from_st(const StFile& f, const std::string& path);
void save_medusa(const std::string& path, const MedusaWeights& w, StDtype dtype = StDtype::kF32);
MedusaWeights load_medusa(const std::string& path);
// specdec::Error naming the file when the heads were trained for another model.
void check_medusa_target(const MedusaWeights& w, const Model& target, const std::string& path);

// Reference of head k for one row in plain float arithmetic: logits [V_d].
void medusa_head_ref(const MedusaWeights& w, int k, const float* h, float* logits);

}  // namespace specdec
