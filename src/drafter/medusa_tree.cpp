#include "drafter/medusa_tree.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "util/check.h"

namespace specdec {

int MedusaTree::max_rank() const {
  int m = 0;
  for (const auto& p : paths) {
    for (int r : p) m = std::max(m, r + 1);
  }
  return m;
}

int MedusaTree::depth() const {
  size_t d = 0;
  for (const auto& p : paths) d = std::max(d, p.size());
  return static_cast<int>(d);
}

MedusaTree parse_medusa_tree(const std::string& text) {
  MedusaTree t;
  std::set<std::vector<int>> seen;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    std::vector<int> path;
    size_t p = 0;
    while (p <= item.size()) {
      size_t q = item.find(',', p);
      if (q == std::string::npos) q = item.size();
      const std::string num = item.substr(p, q - p);
      if (num.empty() || num.size() > 2 || !std::all_of(num.begin(), num.end(), ::isdigit) ||
          std::stoi(num) > 63) {
        throw Error(fmt::format("--medusa-tree: path '{}' needs ranks from 0 to 63 separated by ','",
                                item));
      }
      path.push_back(std::stoi(num));
      p = q + 1;
    }
    if (path.size() > 16) throw Error(fmt::format("--medusa-tree: path '{}' is deeper than 16", item));
    if (path.size() > 1 && !seen.count(std::vector<int>(path.begin(), path.end() - 1))) {
      throw Error(fmt::format("--medusa-tree: path '{}' comes before (or without) its prefix", item));
    }
    if (!seen.insert(path).second) throw Error(fmt::format("--medusa-tree: path '{}' repeats", item));
    t.paths.push_back(path);
    start = end + 1;
  }
  if (t.paths.size() > 64) throw Error("--medusa-tree: at most 64 nodes");
  return t;
}

MedusaTree default_medusa_tree(const std::string& device) {
  if (device == "cpu") return parse_medusa_tree("0;1;0,0");
  return parse_medusa_tree("0;1;2;3;0,0;0,1;0,2;1,0;1,1;2,0;0,0,0;0,0,1;0,1,0;1,0,0;0,0,0,0;0,0,0,1");
}

MedusaTree medusa_tree_or_default(const std::string& text, const std::string& device) {
  return text.empty() ? default_medusa_tree(device) : parse_medusa_tree(text);
}

}  // namespace specdec
