#include "speculative/ngram.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {
namespace {

// Calls visit(n, start) for the earlier occurrences of the suffixes of t[0, len): n from
// ngram_max (at most len - 1) down to ngram_min, the most recent occurrence first, at most
// max_matches per n; `start` is the first token after the occurrence (an occurrence ends before
// the suffix starts, so at least one token follows it). Stops when visit returns false.
template <class Visit>
void for_each_ngram_match(const int32_t* t, int64_t len, int ngram_min, int ngram_max,
                          int max_matches, Visit&& visit) {
  for (int n = static_cast<int>(std::min<int64_t>(ngram_max, len - 1)); n >= ngram_min; --n) {
    const int32_t* suffix = t + len - n;
    int examined = 0;
    for (int64_t j = len - n - 1; j >= 0 && examined < max_matches; --j) {
      if (t[j] != suffix[0] || !std::equal(suffix, suffix + n, t + j)) continue;
      ++examined;
      if (!visit(n, j + n)) return;
    }
  }
}

}  // namespace

NgramProposer::NgramProposer(const NgramConfig& config) : config_(config) {
  SPECDEC_CHECK(config.ngram_min >= 1 && config.ngram_max >= config.ngram_min,
                "ngram sizes must satisfy 1 <= min <= max");
  SPECDEC_CHECK(config.tree_width >= 1, "ngram tree width must be >= 1");
}

int NgramProposer::insert(TokenTree* tree, const int32_t* tokens, int len, int budget) {
  int node = 0;
  int added = 0;
  for (int i = 0; i < len; ++i) {
    int next = tree->child(node, tokens[i]);
    if (next < 0) {
      if (added == budget) break;
      next = tree->add(node, tokens[i]);
      ++added;
    }
    node = next;
  }
  return added;
}

NgramMatch find_ngram_continuation(std::span<const int32_t> tokens, int ngram_min, int ngram_max,
                                   int max_len) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  NgramMatch m;
  if (max_len <= 0 || len < 2 || ngram_min < 1) return m;
  for_each_ngram_match(tokens.data(), len, ngram_min, ngram_max, 1, [&](int n, int64_t start) {
    m.start = start;
    m.length = static_cast<int>(std::min<int64_t>(len - start, max_len));
    m.n = n;
    return false;
  });
  return m;
}

void NgramProposer::propose(const DraftRequest& request, TokenTree* tree) {
  const int64_t len = static_cast<int64_t>(request.tokens.size());
  const int32_t* t = request.tokens.data();
  int budget = request.max_tokens;
  if (budget <= 0 || len < 2) return;
  starts_.clear();
  int continuations = 0;
  for_each_ngram_match(t, len, config_.ngram_min, config_.ngram_max, config_.max_matches,
                       [&](int, int64_t start) {
                         if (std::find(starts_.begin(), starts_.end(), start) != starts_.end()) {
                           return true;
                         }
                         starts_.push_back(start);
                         // Tokens shared with an earlier continuation cost no budget, so the
                         // continuation is not cut at `budget` tokens: insert() stops at the
                         // budget'th new node (or the sequence end).
                         const int cont_len = static_cast<int>(
                             std::min<int64_t>(len - start, budget + tree->size()));
                         const int added = insert(tree, t + start, cont_len, budget);
                         budget -= added;
                         if (added > 0) ++continuations;
                         return budget > 0 && continuations < config_.tree_width;
                       });
}

}  // namespace specdec
