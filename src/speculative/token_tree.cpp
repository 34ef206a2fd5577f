#include "speculative/token_tree.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {

void TokenTree::reset(int32_t root_token) {
  tokens_.assign(1, root_token);
  parents_.assign(1, -1);
  depths_.assign(1, 0);
  dist_of_.assign(1, kNoDist);
  dists_.clear();
  dist_size_ = 0;
  children_valid_ = false;
}

int TokenTree::add(int parent, int32_t token, int dist) {
  SPECDEC_CHECK(parent >= 0 && parent < size(), "tree parent out of range");
  SPECDEC_CHECK(dist == kNoDist || (dist >= 0 && dist_size_ > 0 &&
                                    dist < static_cast<int>(dists_.size() / dist_size_)),
                "tree dist index out of range");
  tokens_.push_back(token);
  parents_.push_back(parent);
  depths_.push_back(depths_[parent] + 1);
  dist_of_.push_back(dist);
  children_valid_ = false;
  return size() - 1;
}

int TokenTree::add_dist(std::span<const float> q) {
  SPECDEC_CHECK(dist_size_ == 0 || static_cast<int64_t>(q.size()) == dist_size_,
                "draft distributions must all have the vocabulary size");
  dist_size_ = static_cast<int64_t>(q.size());
  const int index = static_cast<int>(dists_.size() / std::max<int64_t>(dist_size_, 1));
  dists_.insert(dists_.end(), q.begin(), q.end());
  return index;
}

std::span<const float> TokenTree::dist(int index) const {
  SPECDEC_CHECK(index >= 0 && (index + 1) * dist_size_ <= static_cast<int64_t>(dists_.size()),
                "tree dist index out of range");
  return {dists_.data() + index * dist_size_, static_cast<size_t>(dist_size_)};
}

bool TokenTree::is_chain() const {
  for (int i = 1; i < size(); ++i) {
    if (parents_[i] != i - 1) return false;
  }
  return true;
}

int TokenTree::max_depth() const { return *std::max_element(depths_.begin(), depths_.end()); }

void TokenTree::index_children() const {
  const int n = size();
  child_begin_.assign(n + 1, 0);
  for (int i = 1; i < n; ++i) ++child_begin_[parents_[i] + 1];
  for (int i = 0; i < n; ++i) child_begin_[i + 1] += child_begin_[i];
  child_list_.assign(std::max(n - 1, 0), 0);
  std::vector<int32_t> fill(child_begin_.begin(), child_begin_.end() - 1);
  for (int i = 1; i < n; ++i) child_list_[fill[parents_[i]]++] = i;  // insertion order kept
  children_valid_ = true;
}

std::span<const int32_t> TokenTree::children(int node) const {
  if (!children_valid_) index_children();
  return {child_list_.data() + child_begin_[node],
          static_cast<size_t>(child_begin_[node + 1] - child_begin_[node])};
}

int TokenTree::child(int node, int32_t token) const {
  for (int32_t c : children(node)) {
    if (tokens_[c] == token) return c;
  }
  return -1;
}

void TokenTree::build_mask(std::vector<uint8_t>* mask) const {
  const int n = size();
  mask->assign(static_cast<size_t>(n) * n, 0);
  for (int i = 0; i < n; ++i) {
    uint8_t* row = mask->data() + static_cast<size_t>(i) * n;
    for (int j = i; j >= 0; j = parents_[j]) row[j] = 1;
  }
}

void TokenTree::build_positions(int64_t past, std::vector<int32_t>* positions) const {
  positions->resize(size());
  for (int i = 0; i < size(); ++i) (*positions)[i] = static_cast<int32_t>(past + depths_[i]);
}

void TokenTree::path_to(int node, std::vector<int32_t>* path) const {
  path->clear();
  for (int j = node; j > 0; j = parents_[j]) path->push_back(j);
  std::reverse(path->begin(), path->end());
}

}  // namespace specdec
