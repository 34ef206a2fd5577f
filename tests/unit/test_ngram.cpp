// NgramProposer on crafted token sequences: the longest matching suffix wins, the most recent
// occurrence comes first, continuations merge into a trie sharing prefixes, the budget and the
// n range are respected, and short sequences propose nothing (or what little they can).
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "speculative/ngram.h"
#include "speculative/token_tree.h"

namespace specdec {
namespace {

// (parent, token) of every draft node, in node order: the whole tree structure.
using Nodes = std::vector<std::pair<int, int32_t>>;

Nodes propose(const NgramConfig& config, const std::vector<int32_t>& tokens, int budget) {
  NgramProposer p(config);
  p.begin(tokens, 0);
  TokenTree tree;
  tree.reset(tokens.empty() ? 0 : tokens.back());
  DraftRequest req;
  req.tokens = tokens;
  req.max_tokens = budget;
  p.propose(req, &tree);
  EXPECT_LE(tree.num_drafts(), std::max(budget, 0));
  Nodes nodes;
  for (int i = 1; i < tree.size(); ++i) nodes.emplace_back(tree.parent(i), tree.token(i));
  return nodes;
}

Nodes chain(const std::vector<int32_t>& tokens) {
  Nodes nodes;
  for (size_t i = 0; i < tokens.size(); ++i) nodes.emplace_back(static_cast<int>(i), tokens[i]);
  return nodes;
}

NgramConfig config(int ngram_min, int ngram_max, int tree_width = 1, int max_matches = 64) {
  NgramConfig c;
  c.ngram_min = ngram_min;
  c.ngram_max = ngram_max;
  c.tree_width = tree_width;
  c.max_matches = max_matches;
  return c;
}

TEST(NgramProposer, LongestSuffixWins) {
  // Suffix [5 6] occurred at the start (followed by 8 6 9); the 1-gram [6] occurred later
  // (followed by 9 5 6). The 2-gram match is preferred although it is older.
  const std::vector<int32_t> t = {5, 6, 8, 6, 9, 5, 6};
  EXPECT_EQ(propose(config(1, 4), t, 3), chain({8, 6, 9}));
  // With 1-grams only, the most recent [6] is the match.
  EXPECT_EQ(propose(config(1, 1), t, 3), chain({9, 5, 6}));
  // With n >= 3 only, nothing matches.
  EXPECT_TRUE(propose(config(3, 4), t, 3).empty());
}

TEST(NgramProposer, MostRecentOccurrenceFirst) {
  const std::vector<int32_t> t = {1, 2, 7, 1, 2, 8, 1, 2};
  EXPECT_EQ(propose(config(1, 4), t, 2), chain({8, 1}));
  EXPECT_EQ(propose(config(1, 4), t, 8), chain({8, 1, 2}));  // up to the end of the sequence
  // Two continuations as sibling branches, the most recent one first.
  const Nodes want = {{0, 8}, {1, 1}, {2, 2}, {0, 7}, {4, 1}, {5, 2}};
  EXPECT_EQ(propose(config(1, 4, 2), t, 6), want);
  // With room, the older continuation runs to the end of the sequence: 7 1 2 8 1 2.
  const Nodes want10 = {{0, 8}, {1, 1}, {2, 2}, {0, 7}, {4, 1}, {5, 2}, {6, 8}, {7, 1}, {8, 2}};
  EXPECT_EQ(propose(config(1, 4, 2), t, 10), want10);
  // A third width finds no new continuation: the 1-gram matches start where the 2-gram ones did.
  EXPECT_EQ(propose(config(1, 4, 3), t, 10), want10);
  // max_matches bounds the occurrences examined per n: only the most recent one.
  EXPECT_EQ(propose(config(1, 4, 2, 1), t, 6), chain({8, 1, 2}));
}

TEST(NgramProposer, TreeMergingSharesPrefixes) {
  // [1 2] was followed by 3 5 1 2 (recent) and by 3 4 1 2 3 5 1 2 (older): both start with 3.
  const std::vector<int32_t> t = {1, 2, 3, 4, 1, 2, 3, 5, 1, 2};
  const Nodes full = {{0, 3}, {1, 5}, {2, 1}, {3, 2},                            // recent
                      {1, 4}, {5, 1}, {6, 2}, {7, 3}, {8, 5}, {9, 1}, {10, 2}};  // older
  EXPECT_EQ(propose(config(1, 4, 2), t, 20), full);
  // The shared token does not use budget: with 6 tokens the older branch gets its 2 new tokens.
  const Nodes budget6 = {{0, 3}, {1, 5}, {2, 1}, {3, 2}, {1, 4}, {5, 1}};
  EXPECT_EQ(propose(config(1, 4, 2), t, 6), budget6);
  // The chain takes only the most recent continuation.
  EXPECT_EQ(propose(config(1, 4, 1), t, 20), chain({3, 5, 1, 2}));
}

TEST(NgramProposer, BudgetRespected) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1};
  for (int budget = 0; budget <= 12; ++budget) {
    const Nodes got = propose(config(1, 4), t, budget);
    const std::vector<int32_t> all = {2, 3, 4, 5, 6, 7, 8, 9, 1};
    const int want = std::min(budget, 9);
    EXPECT_EQ(got, chain({all.begin(), all.begin() + want})) << "budget " << budget;
  }
  // A wide tree never exceeds the budget either.
  const std::vector<int32_t> rep = {1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1};
  for (int budget = 0; budget <= 8; ++budget) {
    const Nodes got = propose(config(1, 4, 8), rep, budget);
    EXPECT_EQ(static_cast<int>(got.size()), budget) << "budget " << budget;
  }
  // Negative budgets propose nothing.
  EXPECT_TRUE(propose(config(1, 4), t, -3).empty());
}

TEST(NgramProposer, ShortSequences) {
  EXPECT_TRUE(propose(config(1, 4), {}, 4).empty());
  EXPECT_TRUE(propose(config(1, 4), {7}, 4).empty());
  EXPECT_EQ(propose(config(1, 4), {7, 7}, 4), chain({7}));
  EXPECT_TRUE(propose(config(1, 4), {3, 4}, 4).empty());
  EXPECT_TRUE(propose(config(2, 4), {7, 7}, 4).empty());  // n = 2 does not fit twice
  EXPECT_EQ(propose(config(2, 4), {7, 7, 7}, 4), chain({7}));
  // The longest possible suffix of [4 4 4 4] (n = 3) is followed by one token only.
  EXPECT_EQ(propose(config(1, 4), {4, 4, 4, 4}, 5), chain({4}));
}

TEST(NgramProposer, NothingWhenTheLastTokenIsNew) {
  EXPECT_TRUE(propose(config(1, 4), {1, 2, 3, 4, 5, 6}, 8).empty());
  EXPECT_TRUE(propose(config(1, 4, 4), {1, 2, 3, 1, 2, 3, 9}, 8).empty());
}

TEST(NgramProposerDeathTest, RejectsBadConfig) {
  EXPECT_DEATH(NgramProposer(config(0, 4)), "ngram sizes");
  EXPECT_DEATH(NgramProposer(config(3, 2)), "ngram sizes");
  EXPECT_DEATH(NgramProposer(config(1, 4, 0)), "tree width");
}

}  // namespace
}  // namespace specdec
