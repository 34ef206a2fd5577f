// Medusa's static sparse tree: a list of paths of top-k ranks, one rank per head. Path
// (r_0, ..., r_d) is the node whose token is head 0's r_0-th best token, then head 1's r_1-th
// best, ..., head d's r_d-th best; every path's prefix must come before it in the list. Written
// on the command line as paths separated by ';', ranks by ',': "0;1;0,0;0,1;0,0,0".
#pragma once

#include <string>
#include <vector>

namespace specdec {

struct MedusaTree {
  std::vector<std::vector<int>> paths;  // in node order; paths[i].size() = depth of node i + 1
  int max_rank() const;                 // the largest rank any path uses (+1: top-k needed)
  int depth() const;                    // the longest path (heads needed)
};

// Parses the text form; specdec::Error naming the option and the problem when a rank is not a
// number in [0, 63], a path is empty, a prefix is missing or comes later, or a path repeats.
MedusaTree parse_medusa_tree(const std::string& text);

// The default tree for a target on `device` ("cpu", or a GPU's name such as "cuda"). Beside
// a GPU, 16 nodes over 4 heads: the likeliest shapes of Medusa's published trees. On a CPU,
// where a pass of 16 new tokens costs 3-4 one-token passes, the 16-node tree ran at 0.46x of
// plain decoding (SmolLM2, MT-Bench-20, AMD EPYC Zen 4) and "0;1;0,0" (the top two
// candidates of head 1, the top one of head 2 after the first) at 1.16x.
MedusaTree default_medusa_tree(const std::string& device);

// The tree `text` names (parse_medusa_tree), or the default for `device` when it is empty.
MedusaTree medusa_tree_or_default(const std::string& text, const std::string& device);

}  // namespace specdec
