// DraftDecoder's cost rules: a chain goes on while the product of the draft's probabilities of
// its tokens, times the last one's, is at least a draft step's cost plus a node's (p_min and
// max_tokens still stop it first); a branch alternative is added while the parent's chance times
// its own probability is at least a node's cost.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "speculative/draft_decoder.h"

namespace specdec {
namespace {

constexpr int kVocab = 8;

// Logits whose softmax gives token `best` probability p and spreads the rest evenly.
std::vector<float> logits_with(int best, double p) {
  std::vector<float> l(kVocab, 0.0f);
  const double rest = (1.0 - p) / (kVocab - 1);
  l[best] = static_cast<float>(std::log(p / rest));
  return l;
}

// Drafts with the given top probabilities per depth; returns the chain's length.
// min_gain: the chain's threshold, given as the step cost with a node cost of 0.
int chain_length(int unused, double min_gain, std::vector<double> ps,
                 int max_tokens = 8, float p_min = 0.0f) {
  (void)unused;
  DraftModelConfig config;
  config.p_min = p_min;
  DraftDecoder d(config);
  d.begin(1);
  TokenTree tree;
  tree.reset(0);
  d.start(max_tokens, /*step_cost=*/min_gain, /*node_cost=*/0.0);
  std::vector<int32_t> history = {0};
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> l = logits_with(1 + static_cast<int>(i % 7), ps[i]);
    const int32_t t = d.next(l, history, &tree);
    if (t == DraftDecoder::kStop) break;
    history.push_back(t);
  }
  return tree.num_drafts();
}

TEST(DraftDecoder, AChainGoesOnWhileItsChanceCoversTheGain) {
  // reach after each token: 0.9 (x0.9 = 0.81 >= 0.5: on), 0.63 (x0.7 = 0.44 < 0.5: stop).
  EXPECT_EQ(chain_length(0, 0.5, {0.9, 0.7, 0.99, 0.99}), 2);
  // Sure drafts go on to max_tokens.
  EXPECT_EQ(chain_length(0, 0.5, std::vector<double>(10, 0.999), 6), 6);
  // An unsure first draft is still added (its cost is paid), then the chain stops.
  EXPECT_EQ(chain_length(0, 0.5, {0.3, 0.99}), 1);
  // min_gain 0: no such stop.
  EXPECT_EQ(chain_length(0, 0.0, {0.3, 0.3, 0.3, 0.3}, 4), 4);
  // p_min stops before min_gain would.
  EXPECT_EQ(chain_length(0, 0.1, {0.9, 0.5, 0.9}, 8, 0.6f), 1);
}

// Top-3 branches at the first two levels; level 1: q = 0.6 / 0.3 / 0.06, level 2 (reach 0.6):
// q = 0.9 / 0.08 / 0.01. With a node cost of 0.1 (and a draft step of 0.05, which turns the
// rules on: chains go on above 0.15, as both levels here do) the alternatives kept are 0.3 at
// level 1 (0.3 >= 0.1; 0.06 is not) and none at level 2 (0.6 x 0.08 = 0.048).
TEST(DraftDecoder, BranchAlternativesAreKeptWhileLikelyEnough) {
  auto run = [](double min_node_gain) {
    DraftModelConfig config;
    config.branch_top_k = 3;
    config.branch_levels = 2;
    DraftDecoder d(config);
    d.begin(1);
    TokenTree tree;
    tree.reset(0);
    d.start(16, min_node_gain > 0 ? 0.05 : 0.0, min_node_gain);
    std::vector<int32_t> history = {0};
    const std::vector<std::vector<double>> levels = {{0, 0.6, 0.3, 0.06, 0.04, 0, 0, 0},
                                                     {0, 0, 0, 0, 0.9, 0.08, 0.01, 0.01}};
    for (const std::vector<double>& q : levels) {
      std::vector<float> l(kVocab);
      for (int i = 0; i < kVocab; ++i) l[i] = q[i] > 0 ? static_cast<float>(std::log(q[i])) : -1e9f;
      const int32_t t = d.next(l, history, &tree);
      if (t == DraftDecoder::kStop) break;
      history.push_back(t);
    }
    return tree;
  };
  const TokenTree all = run(0.0);
  EXPECT_EQ(all.num_drafts(), 6);  // 1, 2, 3 under the root; 4, 5, 6 under 1
  const TokenTree kept = run(0.1);
  ASSERT_EQ(kept.num_drafts(), 3);
  EXPECT_EQ(kept.token(1), 1);
  EXPECT_EQ(kept.token(2), 2);
  EXPECT_EQ(kept.parent(2), 0);
  EXPECT_EQ(kept.token(3), 4);
  EXPECT_EQ(kept.parent(3), 1);
}

}  // namespace
}  // namespace specdec
