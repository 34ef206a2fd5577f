// A ReDrafter head's parameters (Apple's recurrent drafter), as trained and as stored.
//
// The head drafts the tokens after the root r (the token the target produced last, whose
// parent position gave the target's final-normed hidden state h [dim]):
//   s_0 = 0
//   s_k = SiLU(W_e · e(g_{k-1}) + W_s · s_{k-1} + b_s)       [S]  g_0 = r, g_k = k-th draft
//   x   = concat(h, s_k)                                      [D = dim + S]
//   x   = x + SiLU(W_l · x + b_l)       for each block l      [D]
//   logits_k = W_o · x                                        [V_d] over the draft vocabulary
// e() is the target's own token embedding (frozen, not stored here); draft index v stands for the
// target token draft_vocab[v] (the most frequent tokens of the target's outputs).
//
// File: safetensors (drafter/safetensors.h) with tensors "rnn.w_embed" [S, dim],
// "rnn.w_state" [S, S], "rnn.bias" [S], "blocks.L.weight" [D, D], "blocks.L.bias" [D],
// "lm_head.weight" [V_d, D], "draft_vocab" (I32) [V_d], and metadata "specdec.kind" =
// "redrafter", "specdec.target" (Model::fingerprint of the target), "specdec.dim",
// "specdec.state_dim", "specdec.n_blocks", "specdec.n_target_vocab", plus free-form training
// facts under "train.*".
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "drafter/safetensors.h"

namespace specdec {

class Model;

struct ReDrafterShape {
  int dim = 0;             // target hidden width (= its embedding width)
  int state_dim = 0;       // S
  int n_blocks = 0;        // residual blocks
  int n_draft_vocab = 0;   // V_d
  int n_target_vocab = 0;  // the target's vocabulary size
  int width() const { return dim + state_dim; }  // D
  int64_t num_params() const;
};

struct ReDrafterWeights {
  ReDrafterShape shape;
  std::string target_fingerprint;
  std::vector<int32_t> draft_vocab;          // [V_d] distinct target token ids
  std::vector<float> w_embed;                // [S, dim]
  std::vector<float> w_state;                // [S, S]
  std::vector<float> b_state;                // [S]
  std::vector<std::vector<float>> w_block;   // n_blocks x [D, D]
  std::vector<std::vector<float>> b_block;   // n_blocks x [D]
  std::vector<float> w_out;                  // [V_d, D]
  std::map<std::string, std::string> info;  // "train.*" facts kept in the file's metadata
};

// Zero-filled weights of `shape` (vectors sized).
ReDrafterWeights make_redrafter(const ReDrafterShape& shape, std::vector<int32_t> draft_vocab,
                                std::string target_fingerprint);

// The tensors and metadata of a head file; `dtype` for the float tensors (F32 or F16/BF16 to
// halve the file; training checkpoints use F32).
// The RNN's two matrices side by side, as the inference heads multiply them in one matmul:
// [S, dim + S], row i = [W_e row i | W_s row i].
std::vector<float> redrafter_rnn_rows(const ReDrafterWeights& w);

StFile redrafter_to_st(const ReDrafterWeights& w, StDtype dtype);
// Checks every shape and the vocabulary (ids distinct and below n_target_vocab); specdec::Error
// naming `path` otherwise.
ReDrafterWeights redrafter_from_st(const StFile& f, const std::string& path);

void save_redrafter(const std::string& path, const ReDrafterWeights& w, StDtype dtype = StDtype::kF32);
ReDrafterWeights load_redrafter(const std::string& path);

// specdec::Error, naming the file, when the head was trained for another model than `target`
// (fingerprint, width or vocabulary differ).
void check_redrafter_target(const ReDrafterWeights& w, const Model& target, const std::string& path);

// The reference forward of one step for one row, in plain float arithmetic (tests, training
// checks): s = SiLU(W_e e + W_s s_prev + b_s), then logits [V_d] over concat(h, s).
// h: [dim], e: [dim], s_prev: [S] (zeros at the first step), s_out: [S], logits: [V_d].
void redrafter_step_ref(const ReDrafterWeights& w, const float* h, const float* e,
                        const float* s_prev, float* s_out, float* logits);

}  // namespace specdec
