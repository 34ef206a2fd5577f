// TokenTree: a hand-built tree's mask, positions, children order, paths and chain detection,
// draft distributions, and the same properties on random trees against their definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sample/rng.h"
#include "speculative/token_tree.h"

namespace specdec {
namespace {

std::vector<int32_t> to_vec(std::span<const int32_t> s) {
  return {s.begin(), s.end()};
}

// node: 0    1    2    3    4    5    6
// token 10   11   12   13   14   15   16
// parent -   0    1    0    1    3    0
//
// Children: 0 -> {1, 3, 6}, 1 -> {2, 4}, 3 -> {5}; leaves 2, 4, 5, 6.
TokenTree example_tree() {
  TokenTree t;
  t.reset(10);
  EXPECT_EQ(t.add(0, 11), 1);
  EXPECT_EQ(t.add(1, 12), 2);
  EXPECT_EQ(t.add(0, 13), 3);
  EXPECT_EQ(t.add(1, 14), 4);
  EXPECT_EQ(t.add(3, 15), 5);
  EXPECT_EQ(t.add(0, 16), 6);
  return t;
}

TEST(TokenTree, ResetMakesAOneNodeTree) {
  TokenTree t;
  t.reset(42);
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.num_drafts(), 0);
  EXPECT_EQ(t.token(0), 42);
  EXPECT_EQ(t.parent(0), -1);
  EXPECT_EQ(t.depth(0), 0);
  EXPECT_EQ(t.max_depth(), 0);
  EXPECT_TRUE(t.is_chain());
  EXPECT_TRUE(t.children(0).empty());
  std::vector<uint8_t> mask;
  t.build_mask(&mask);
  EXPECT_EQ(mask, std::vector<uint8_t>{1});
  std::vector<int32_t> pos;
  t.build_positions(17, &pos);
  EXPECT_EQ(pos, std::vector<int32_t>{17});
  std::vector<int32_t> path{1, 2, 3};
  t.path_to(0, &path);
  EXPECT_TRUE(path.empty());
}

TEST(TokenTree, TokensParentsDepths) {
  const TokenTree t = example_tree();
  EXPECT_EQ(t.size(), 7);
  EXPECT_EQ(t.num_drafts(), 6);
  EXPECT_EQ(to_vec(t.tokens()), (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16}));
  EXPECT_EQ(to_vec(t.parents()), (std::vector<int32_t>{-1, 0, 1, 0, 1, 3, 0}));
  EXPECT_EQ(to_vec(t.depths()), (std::vector<int32_t>{0, 1, 2, 1, 2, 2, 1}));
  EXPECT_EQ(t.max_depth(), 2);
  EXPECT_FALSE(t.is_chain());
  for (int i = 1; i < t.size(); ++i) EXPECT_EQ(t.dist_index(i), TokenTree::kNoDist);
}

TEST(TokenTree, ChildrenInInsertionOrder) {
  const TokenTree t = example_tree();
  EXPECT_EQ(to_vec(t.children(0)), (std::vector<int32_t>{1, 3, 6}));
  EXPECT_EQ(to_vec(t.children(1)), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(to_vec(t.children(3)), (std::vector<int32_t>{5}));
  for (int leaf : {2, 4, 5, 6}) EXPECT_TRUE(t.children(leaf).empty()) << leaf;
}

TEST(TokenTree, ChildrenIndexFollowsLaterAdds) {
  TokenTree t = example_tree();
  EXPECT_EQ(to_vec(t.children(0)), (std::vector<int32_t>{1, 3, 6}));  // index built
  EXPECT_EQ(t.add(0, 17), 7);
  EXPECT_EQ(t.add(6, 18), 8);
  EXPECT_EQ(to_vec(t.children(0)), (std::vector<int32_t>{1, 3, 6, 7}));
  EXPECT_EQ(to_vec(t.children(6)), (std::vector<int32_t>{8}));
  t.reset(5);
  EXPECT_TRUE(t.children(0).empty());
  t.add(0, 6);
  EXPECT_EQ(to_vec(t.children(0)), (std::vector<int32_t>{1}));
}

TEST(TokenTree, MaskIsSelfAndAncestors) {
  const TokenTree t = example_tree();
  std::vector<uint8_t> mask;
  t.build_mask(&mask);
  // clang-format off
  const std::vector<uint8_t> want = {
      1, 0, 0, 0, 0, 0, 0,   // 0
      1, 1, 0, 0, 0, 0, 0,   // 1
      1, 1, 1, 0, 0, 0, 0,   // 2
      1, 0, 0, 1, 0, 0, 0,   // 3
      1, 1, 0, 0, 1, 0, 0,   // 4
      1, 0, 0, 1, 0, 1, 0,   // 5
      1, 0, 0, 0, 0, 0, 1};  // 6
  // clang-format on
  EXPECT_EQ(mask, want);
}

TEST(TokenTree, PositionsArePastPlusDepth) {
  const TokenTree t = example_tree();
  std::vector<int32_t> pos;
  t.build_positions(7, &pos);
  EXPECT_EQ(pos, (std::vector<int32_t>{7, 8, 9, 8, 9, 9, 8}));
  t.build_positions(0, &pos);
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 1, 2, 2, 1}));
}

TEST(TokenTree, PathToExcludesRootInDepthOrder) {
  const TokenTree t = example_tree();
  std::vector<int32_t> path;
  t.path_to(5, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{3, 5}));
  t.path_to(4, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{1, 4}));
  t.path_to(2, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{1, 2}));
  t.path_to(6, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{6}));
}

TEST(TokenTree, ChainIsLowerTriangular) {
  TokenTree t;
  t.reset(1);
  for (int i = 0; i < 5; ++i) t.add(i, 100 + i);
  EXPECT_TRUE(t.is_chain());
  EXPECT_EQ(t.max_depth(), 5);
  std::vector<uint8_t> mask;
  t.build_mask(&mask);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) EXPECT_EQ(mask[i * 6 + j], j <= i ? 1 : 0) << i << "," << j;
  }
  std::vector<int32_t> path;
  t.path_to(5, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  // A second child anywhere breaks the chain, even at the end.
  t.add(4, 7);
  EXPECT_FALSE(t.is_chain());
  // A chain that skips a level (parent not the previous node) is not a chain either.
  TokenTree u;
  u.reset(1);
  u.add(0, 2);
  u.add(0, 3);
  EXPECT_FALSE(u.is_chain());
}

TEST(TokenTree, DraftDistributionsAreStoredPerIndex) {
  TokenTree t;
  t.reset(0);
  const std::vector<float> q0 = {0.5f, 0.25f, 0.25f, 0.0f};
  const std::vector<float> q1 = {0.1f, 0.2f, 0.3f, 0.4f};
  const int d0 = t.add_dist(q0);
  const int d1 = t.add_dist(q1);
  EXPECT_EQ(d0, 0);
  EXPECT_EQ(d1, 1);
  const int a = t.add(0, 1, d1);
  const int b = t.add(0, 2);
  const int c = t.add(a, 0, d0);
  EXPECT_EQ(t.dist_index(a), d1);
  EXPECT_EQ(t.dist_index(b), TokenTree::kNoDist);
  EXPECT_EQ(t.dist_index(c), d0);
  const std::span<const float> got0 = t.dist(d0), got1 = t.dist(d1);
  EXPECT_EQ(std::vector<float>(got0.begin(), got0.end()), q0);
  EXPECT_EQ(std::vector<float>(got1.begin(), got1.end()), q1);
  // reset forgets the distributions and their size: a different vocabulary is accepted.
  t.reset(0);
  const std::vector<float> small = {1.0f, 0.0f};
  EXPECT_EQ(t.add_dist(small), 0);
  EXPECT_EQ(t.dist(0).size(), 2u);
}

TEST(TokenTreeDeathTest, RejectsBadParentsAndDists) {
  TokenTree t;
  t.reset(0);
  EXPECT_DEATH(t.add(1, 5), "tree parent out of range");
  EXPECT_DEATH(t.add(-1, 5), "tree parent out of range");
  EXPECT_DEATH(t.add(0, 5, 0), "tree dist index out of range");
  const std::vector<float> q = {0.5f, 0.5f};
  t.add_dist(q);
  EXPECT_DEATH(t.add(0, 5, 1), "tree dist index out of range");
  const std::vector<float> wrong = {1.0f, 0.0f, 0.0f};
  EXPECT_DEATH(t.add_dist(wrong), "vocabulary size");
}

// Random trees: every accessor against its definition from the parent array alone.
TEST(TokenTree, RandomTreesMatchDefinitions) {
  Rng rng(2024);
  for (int trial = 0; trial < 200; ++trial) {
    TokenTree t;
    t.reset(static_cast<int32_t>(rng.next() % 1000));
    const int n = 1 + static_cast<int>(rng.next() % 24);
    std::vector<int32_t> parent = {-1};
    for (int i = 1; i < n; ++i) {
      // Bias toward recent parents so that deep chains occur as well as bushy levels.
      const int p = rng.uniform() < 0.5 ? i - 1 : static_cast<int>(rng.next() % i);
      parent.push_back(p);
      ASSERT_EQ(t.add(p, static_cast<int32_t>(rng.next() % 1000)), i);
    }
    std::vector<int32_t> depth(n, 0);
    for (int i = 1; i < n; ++i) depth[i] = depth[parent[i]] + 1;
    bool chain = true;
    for (int i = 1; i < n; ++i) chain = chain && parent[i] == i - 1;
    EXPECT_EQ(t.is_chain(), chain);
    EXPECT_EQ(t.max_depth(), *std::max_element(depth.begin(), depth.end()));
    auto is_ancestor_or_self = [&](int j, int i) {
      for (int k = i; k >= 0; k = parent[k]) {
        if (k == j) return true;
      }
      return false;
    };
    std::vector<uint8_t> mask;
    t.build_mask(&mask);
    std::vector<int32_t> pos;
    const int64_t past = static_cast<int64_t>(rng.next() % 100);
    t.build_positions(past, &pos);
    std::vector<int32_t> path;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(pos[i], past + depth[i]);
      std::vector<int32_t> kids;
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(mask[i * n + j] != 0, is_ancestor_or_self(j, i)) << i << "," << j;
        if (parent[j] == i) kids.push_back(j);
      }
      EXPECT_EQ(to_vec(t.children(i)), kids);
      t.path_to(i, &path);
      ASSERT_EQ(static_cast<int>(path.size()), depth[i]);
      for (size_t k = 0; k < path.size(); ++k) {
        EXPECT_EQ(t.depth(path[k]), static_cast<int>(k) + 1);
        EXPECT_EQ(t.parent(path[k]), k == 0 ? 0 : path[k - 1]);
      }
      if (!path.empty()) {
        EXPECT_EQ(path.back(), i);
      }
    }
  }
}

}  // namespace
}  // namespace specdec
