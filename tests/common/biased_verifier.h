// Deliberately WRONG tree verifiers, for showing that the sampling tests notice bias: each
// follows Verifier::verify's walk (children tried in order, bonus from what is left of p) but
// breaks one rule of lossless rejection sampling.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "sample/sampler.h"
#include "speculative/verifier.h"
#include "speculative/token_tree.h"

namespace specdec::test {

enum class Bias {
  // On a rejection p is kept as it was, instead of p without x (deterministic draft) or
  // normalize(max(0, p - q)) (sampled draft): rejected tokens come back too often.
  kResampleFromP,
  // A deterministic draft is accepted outright whenever p(x) > 0.1 (otherwise correct).
  kEagerAccept,
};

inline const char* bias_name(Bias b) {
  return b == Bias::kResampleFromP ? "resample_from_p" : "eager_accept";
}

inline void biased_verify(Bias bias, const TokenTree& tree, std::span<const float> logits,
                          int n_vocab, std::span<const int32_t> history, Sampler& sampler,
                          VerifyResult* result) {
  result->accepted_nodes.clear();
  result->tokens.clear();
  std::vector<int32_t> hist(history.begin(), history.end());
  std::vector<float> p;  // [n_vocab]
  int node = 0;
  while (true) {
    const std::span<const float> row =
        logits.subspan(static_cast<size_t>(node) * n_vocab, static_cast<size_t>(n_vocab));
    sampler.distribution(row, hist, &p);
    int next = -1;
    for (int32_t c : tree.children(node)) {
      const int32_t x = tree.token(c);
      const int d = tree.dist_index(c);
      const double u = sampler.rng().uniform();
      const bool accept = d == TokenTree::kNoDist
                              ? (u < p[x] || (bias == Bias::kEagerAccept && p[x] > 0.1f))
                              : u * tree.dist(d)[x] < p[x];
      if (accept) {
        next = c;
        break;
      }
      if (bias == Bias::kResampleFromP) continue;
      if (d == TokenTree::kNoDist) {
        p[x] = 0;
      } else {
        const std::span<const float> q = tree.dist(d);
        for (int v = 0; v < n_vocab; ++v) p[v] = std::max(0.0f, p[v] - q[v]);
      }
      const double s = std::accumulate(p.begin(), p.end(), 0.0);
      if (s <= 0) {
        sampler.distribution(row, hist, &p);
        break;
      }
      for (float& v : p) v = static_cast<float>(v / s);
    }
    if (next < 0) {
      result->bonus = sample_from_probs(p, sampler.rng());
      result->final_node = node;
      result->tokens.push_back(result->bonus);
      return;
    }
    result->accepted_nodes.push_back(next);
    result->tokens.push_back(tree.token(next));
    hist.push_back(tree.token(next));
    node = next;
  }
}

}  // namespace specdec::test
