// A tree of draft tokens verified in one target pass (DESIGN §3–§4).
//
// Node 0 is the root: the token the target produced last (already emitted, not yet in the KV
// cache). Every other node is a draft token whose parent comes before it (parents[i] < i), so
// the nodes are in topological order and a chain is the tree with parents[i] = i - 1.
// For the forward pass node i sits at KV slot past + i, has RoPE position past + depth(i), and
// attends to the cached tokens plus its ancestors and itself (mask row i).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specdec {

class TokenTree {
 public:
  static constexpr int kNoDist = -1;

  void reset(int32_t root_token);

  // Adds a draft token under `parent` and returns its node index. `dist` indexes the draft
  // distribution q this token was *sampled* from (see add_dist), or kNoDist for a deterministic
  // proposal (q one-hot: n-gram, greedy or top-k draft), which the verifier treats accordingly.
  int add(int parent, int32_t token, int dist = kNoDist);

  // Stores a draft distribution q over the vocabulary: [n_vocab]. Returns its index.
  int add_dist(std::span<const float> q);

  int size() const { return static_cast<int>(tokens_.size()); }
  int num_drafts() const { return size() - 1; }
  bool is_chain() const;
  int max_depth() const;

  std::span<const int32_t> tokens() const { return tokens_; }
  std::span<const int32_t> parents() const { return parents_; }  // parents[0] = -1
  std::span<const int32_t> depths() const { return depths_; }
  int32_t token(int node) const { return tokens_[node]; }
  int parent(int node) const { return parents_[node]; }
  int depth(int node) const { return depths_[node]; }
  int dist_index(int node) const { return dist_of_[node]; }
  std::span<const float> dist(int index) const;

  // Children of `node` in insertion order (the verifier tries them in this order).
  std::span<const int32_t> children(int node) const;
  // The first child of `node` that holds `token`; -1 when none does.
  int child(int node, int32_t token) const;

  // [size, size] row-major, 1 where node i may attend to node j (j is i or an ancestor).
  void build_mask(std::vector<uint8_t>* mask) const;
  // [size]: past + depth(i).
  void build_positions(int64_t past, std::vector<int32_t>* positions) const;
  // Nodes from the root's first child down to `node` (root excluded), in depth order.
  void path_to(int node, std::vector<int32_t>* path) const;

 private:
  void index_children() const;

  std::vector<int32_t> tokens_;   // [size]
  std::vector<int32_t> parents_;  // [size]
  std::vector<int32_t> depths_;   // [size]
  std::vector<int32_t> dist_of_;  // [size]
  std::vector<float> dists_;      // [n_dists, n_vocab]
  int64_t dist_size_ = 0;
  mutable bool children_valid_ = false;
  mutable std::vector<int32_t> child_begin_;  // [size + 1]
  mutable std::vector<int32_t> child_list_;   // [size - 1]
};

}  // namespace specdec
