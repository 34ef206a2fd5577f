#include "drafter/medusa_proposer.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "util/check.h"

namespace specdec {

MedusaProposer::MedusaProposer(const MedusaHeads& heads, MedusaTree tree, ThreadPool* pool)
    : heads_(heads), shape_(std::move(tree)), pool_(pool) {
  if (shape_.depth() > heads_.shape().n_heads) {
    throw Error(fmt::format("--medusa-tree is {} deep but the file has {} heads", shape_.depth(),
                            heads_.shape().n_heads));
  }
  if (shape_.max_rank() > heads_.shape().n_draft_vocab) {
    throw Error(fmt::format("--medusa-tree uses rank {} but the draft vocabulary has {} tokens",
                            shape_.max_rank() - 1, heads_.shape().n_draft_vocab));
  }
}

void MedusaProposer::propose(const DraftRequest& request, TokenTree* tree) {
  if (request.target_hidden.empty() || request.max_tokens <= 0 || shape_.paths.empty()) return;
  const MedusaShape& sh = heads_.shape();
  const int vd = sh.n_draft_vocab, ranks = shape_.max_rank(), depth = shape_.depth();
  logits_.resize(static_cast<size_t>(sh.n_heads) * vd);
  heads_.run(request.target_hidden, logits_.data(), &scratch_, pool_);
  // Each needed head's best `ranks` draft indices (ties to the lower index).
  top_.resize(static_cast<size_t>(depth));
  std::vector<int32_t> idx(static_cast<size_t>(vd));
  for (int k = 0; k < depth; ++k) {
    const float* lg = logits_.data() + static_cast<size_t>(k) * vd;
    for (int v = 0; v < vd; ++v) idx[v] = v;
    std::partial_sort(idx.begin(), idx.begin() + ranks, idx.end(), [lg](int32_t a, int32_t b) {
      return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
    });
    top_[k].assign(idx.begin(), idx.begin() + ranks);
  }
  const std::span<const int32_t> vocab = heads_.draft_vocab();
  std::map<std::vector<int>, int> node;  // path -> tree node
  int added = 0;
  for (const std::vector<int>& p : shape_.paths) {
    if (added >= request.max_tokens) break;
    int parent = 0;
    if (p.size() > 1) {
      auto it = node.find(std::vector<int>(p.begin(), p.end() - 1));
      if (it == node.end()) continue;
      parent = it->second;
    }
    const int k = static_cast<int>(p.size()) - 1;
    node[p] = tree->add(parent, vocab[top_[k][p.back()]]);
    ++added;
  }
}

}  // namespace specdec
