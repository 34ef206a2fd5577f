// DraftDecoder's stop by the chain's chance (min_gain): a chain goes on while the product of the
// draft's probabilities of its tokens, times the last one's, is at least min_gain; p_min and
// max_tokens still stop it first.
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
int chain_length(int unused, double min_gain, std::vector<double> ps,
                 int max_tokens = 8, float p_min = 0.0f) {
  (void)unused;
  DraftModelConfig config;
  config.p_min = p_min;
  DraftDecoder d(config);
  d.begin(1);
  TokenTree tree;
  tree.reset(0);
  d.start(max_tokens, min_gain);
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

}  // namespace
}  // namespace specdec
