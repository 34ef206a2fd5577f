#include "speculative/ngram.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {

NgramProposer::NgramProposer(const NgramConfig& config) : config_(config) {
  SPECDEC_CHECK(config.ngram_min >= 1 && config.ngram_max >= config.ngram_min,
                "ngram sizes must satisfy 1 <= min <= max");
  SPECDEC_CHECK(config.tree_width >= 1, "ngram tree width must be >= 1");
}

int NgramProposer::insert(TokenTree* tree, const int32_t* tokens, int len, int budget) {
  int node = 0;
  int added = 0;
  for (int i = 0; i < len; ++i) {
    int next = -1;
    for (int32_t c : tree->children(node)) {
      if (tree->token(c) == tokens[i]) {
        next = c;
        break;
      }
    }
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
  const int32_t* t = tokens.data();
  if (max_len <= 0 || len < 2 || ngram_min < 1) return {};
  for (int n = static_cast<int>(std::min<int64_t>(ngram_max, len - 1)); n >= ngram_min; --n) {
    const int32_t* suffix = t + len - n;
    // The most recent occurrence that ends before the suffix starts (a token follows it).
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (t[j] != suffix[0] || !std::equal(suffix, suffix + n, t + j)) continue;
      NgramMatch m;
      m.start = j + n;
      m.length = static_cast<int>(std::min<int64_t>(len - m.start, max_len));
      m.n = n;
      return m;
    }
  }
  return {};
}

void NgramProposer::propose(const DraftRequest& request, TokenTree* tree) {
  const int64_t len = static_cast<int64_t>(request.tokens.size());
  const int32_t* t = request.tokens.data();
  int budget = request.max_tokens;
  if (budget <= 0 || len < 2) return;
  starts_.clear();
  int continuations = 0;
  for (int n = std::min<int64_t>(config_.ngram_max, len - 1); n >= config_.ngram_min; --n) {
    const int32_t* suffix = t + len - n;
    int examined = 0;
    // Most recent occurrence first; an occurrence must end before the suffix starts so that at
    // least one token follows it.
    for (int64_t j = len - n - 1; j >= 0 && examined < config_.max_matches; --j) {
      if (t[j] != suffix[0] || !std::equal(suffix, suffix + n, t + j)) continue;
      ++examined;
      const int64_t start = j + n;  // first token after the match
      if (std::find(starts_.begin(), starts_.end(), start) != starts_.end()) continue;
      starts_.push_back(start);
      // Tokens shared with an earlier continuation cost no budget, so the continuation is not
      // cut at `budget` tokens: insert() stops at the budget'th new node (or the sequence end).
      const int cont_len = static_cast<int>(std::min<int64_t>(len - start, budget + tree->size()));
      const int added = insert(tree, t + start, cont_len, budget);
      budget -= added;
      if (added > 0) ++continuations;
      if (budget == 0 || continuations == config_.tree_width) return;
    }
  }
}

}  // namespace specdec
