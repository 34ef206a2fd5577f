// Lossless verification of a draft tree against the target's logits (DESIGN §4).
//
// Greedy (temperature 0): walk from the root; at each node take the target's choice (the same
// Sampler::sample that plain decoding calls, repetition penalty included) and follow the child
// with that token if there is one. The output equals plain greedy decoding token for token.
//
// Sampling: at each node p = Sampler::distribution(row, history + path). The children are
// tried in order, each by its kind:
//   - sampled from a draft distribution q (TokenTree dist): accept x with probability
//     min(1, p(x)/q(x)); on rejection p ← normalize(max(0, p − q));
//   - deterministic (q one-hot: n-gram, greedy/top-k draft): accept x with probability p(x);
//     on rejection p ← normalize(p with x removed).
// If no child is accepted the node's bonus token is drawn from the current p; at a leaf from
// p itself. Each step is an exact rejection-sampling decomposition, so every emitted token is
// distributed exactly as the target's sampling distribution (recursive rejection sampling).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sample/sampler.h"
#include "speculative/token_tree.h"

namespace specdec {

struct VerifyResult {
  std::vector<int32_t> accepted_nodes;  // tree nodes on the accepted path, root excluded
  std::vector<int32_t> tokens;          // their tokens, then the bonus token
  int32_t bonus = -1;
  int final_node = 0;  // the node whose logits gave the bonus token
};

class Verifier {
 public:
  // logits: [tree.size(), n_vocab]; row i is the target's output after node i.
  // history: the sequence up to and including the root token.
  void verify(const TokenTree& tree, std::span<const float> logits, int n_vocab,
              std::span<const int32_t> history, Sampler& sampler, VerifyResult* result);

 private:
  std::vector<int32_t> hist_;  // scratch: history + accepted path
  std::vector<float> p_;       // scratch: [n_vocab] target distribution at the current node
};

// Draws an index from probs (non-negative, summing to ~1) with one uniform of rng.
int32_t sample_from_probs(std::span<const float> probs, Rng& rng);

}  // namespace specdec
