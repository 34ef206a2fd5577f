#include "drafter/beam_tree.h"

#include "util/check.h"

namespace specdec {

int pack_beams(std::span<const int32_t> beams, int n_beams, int length, int max_nodes,
               TokenTree* tree, std::vector<int32_t>* end_nodes,
               std::span<const float> prefix_scores, std::vector<float>* node_scores) {
  SPECDEC_CHECK(static_cast<int64_t>(beams.size()) == static_cast<int64_t>(n_beams) * length,
                "pack_beams: beams size");
  if (end_nodes) end_nodes->assign(static_cast<size_t>(n_beams), 0);
  const int start = tree->num_drafts();
  const bool scored = node_scores != nullptr && !prefix_scores.empty();
  if (scored) node_scores->assign(static_cast<size_t>(tree->size()), 0.0f);
  // children[node]: the nodes under it, for the prefix lookup (trees are a few dozen nodes).
  std::vector<std::vector<int32_t>> children(static_cast<size_t>(tree->size()));
  for (int i = 1; i < tree->size(); ++i) children[tree->parent(i)].push_back(i);
  for (int b = 0; b < n_beams; ++b) {
    int node = 0;
    for (int k = 0; k < length; ++k) {
      const int32_t tok = beams[static_cast<size_t>(b) * length + k];
      int next = -1;
      for (int32_t c : children[node]) {
        if (tree->token(c) == tok) {
          next = c;
          break;
        }
      }
      if (next < 0) {
        if (tree->num_drafts() - start >= max_nodes) break;
        next = tree->add(node, tok);
        children[node].push_back(next);
        children.emplace_back();
        if (scored) node_scores->push_back(prefix_scores[static_cast<size_t>(b) * length + k]);
      }
      node = next;
    }
    if (end_nodes) (*end_nodes)[b] = node;
  }
  return tree->num_drafts() - start;
}

}  // namespace specdec
