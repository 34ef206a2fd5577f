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

// The default tree (16 nodes, 4 heads): the likeliest shapes of Medusa's published trees.
MedusaTree default_medusa_tree();

}  // namespace specdec
