#include "speculative/verifier.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {

int32_t sample_from_probs(std::span<const float> probs, Rng& rng) {
  double total = 0;
  for (float p : probs) total += p;
  SPECDEC_CHECK(total > 0, "cannot sample from an all-zero distribution");
  const double u = rng.uniform() * total;
  double acc = 0;
  int32_t last_nonzero = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < acc) return last_nonzero;
  }
  return last_nonzero;  // rounding at the very end
}

namespace {

// p ← p with token x removed, renormalized. Returns false when nothing is left.
bool remove_token(std::vector<float>& p, int32_t x) {
  p[x] = 0;
  double total = 0;
  for (float v : p) total += v;
  if (total <= 0) return false;
  const float inv = static_cast<float>(1.0 / total);
  for (float& v : p) v *= inv;
  return true;
}

// p ← normalize(max(0, p − q)). Returns false when p ≤ q everywhere (then p == q).
bool subtract_draft(std::vector<float>& p, std::span<const float> q) {
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = std::max(0.0f, p[i] - q[i]);
    total += p[i];
  }
  if (total <= 0) return false;
  const float inv = static_cast<float>(1.0 / total);
  for (float& v : p) v *= inv;
  return true;
}

}  // namespace

void Verifier::verify(const TokenTree& tree, std::span<const float> logits, int n_vocab,
                      std::span<const int32_t> history, Sampler& sampler, VerifyResult* result) {
  SPECDEC_CHECK(static_cast<int64_t>(logits.size()) == static_cast<int64_t>(tree.size()) * n_vocab,
                "verify needs one logits row per tree node");
  result->accepted_nodes.clear();
  result->tokens.clear();
  hist_.assign(history.begin(), history.end());
  const bool greedy = sampler.params().greedy();
  int node = 0;
  while (true) {
    const std::span<const float> row = logits.subspan(static_cast<size_t>(node) * n_vocab, n_vocab);
    const std::span<const int32_t> children = tree.children(node);
    int next = -1;
    int32_t bonus = -1;
    if (greedy || children.empty()) {
      // The target's own choice, exactly as plain decoding makes it.
      const int32_t choice = sampler.sample(row, hist_);
      for (int32_t c : children) {
        if (tree.token(c) == choice) {
          next = c;
          break;
        }
      }
      if (next < 0) bonus = choice;
    } else {
      sampler.distribution(row, hist_, &p_);
      bool alive = true;  // p_ still has mass
      for (int32_t c : children) {
        const int32_t x = tree.token(c);
        const int d = tree.dist_index(c);
        if (d == TokenTree::kNoDist) {
          if (sampler.rng().uniform() < p_[x]) {
            next = c;
            break;
          }
          alive = remove_token(p_, x);
        } else {
          const std::span<const float> q = tree.dist(d);
          SPECDEC_CHECK(q[x] > 0, "a sampled draft token must have q(x) > 0");
          if (sampler.rng().uniform() * q[x] < p_[x]) {
            next = c;
            break;
          }
          alive = subtract_draft(p_, q);
        }
        if (!alive) {
          // No mass left: p was one-hot on x (deterministic) or p == q (sampled), where the
          // acceptance probability is exactly 1 and only float rounding rejected x. Accept it.
          next = c;
          break;
        }
      }
      if (next < 0) bonus = sample_from_probs(p_, sampler.rng());
    }
    if (next < 0) {
      result->bonus = bonus;
      result->final_node = node;
      result->tokens.push_back(bonus);
      return;
    }
    result->accepted_nodes.push_back(next);
    result->tokens.push_back(tree.token(next));
    hist_.push_back(tree.token(next));
    node = next;
  }
}

}  // namespace specdec
