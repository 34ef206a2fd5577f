// Beams to one prefix tree (ReDrafter's "dynamic tree attention"): beams that share a prefix
// share its nodes, so the target verifies every distinct prefix once, in one pass, with the
// tree's causal mask (TokenTree::build_mask) and positions (past + depth).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speculative/token_tree.h"

namespace specdec {

// Adds beams [n_beams, length] (target token ids, best beam first) under the root of `tree`
// (already reset), beam by beam: each beam's tokens follow the nodes of its longest prefix
// already in the tree, new nodes are appended. Stops when the tree holds `max_nodes` drafts
// (a beam may then enter with a prefix only). Node order is topological and children keep the
// order of the beams that created them (the better beam first). end_nodes[b] (if given) is the
// deepest node of beam b in the tree, 0 (the root) when none of it fit. Returns the drafts added.
// With prefix_scores ([n_beams, length], as Beams::prefix_scores) node_scores[i] is the score
// of node i's prefix (index 0: the root, 0), for every node of the tree.
int pack_beams(std::span<const int32_t> beams, int n_beams, int length, int max_nodes,
               TokenTree* tree, std::vector<int32_t>* end_nodes = nullptr,
               std::span<const float> prefix_scores = {}, std::vector<float>* node_scores = nullptr);

}  // namespace specdec
