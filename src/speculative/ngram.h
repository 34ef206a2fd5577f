// N-gram / prompt-lookup proposer: finds the longest recent suffix of the sequence (n from
// ngram_max down to ngram_min) that occurred earlier in prompt + output and proposes what
// followed it. With tree_width > 1 the continuations of several matches are merged into a trie.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speculative/proposer.h"

namespace specdec {

struct NgramConfig {
  int ngram_min = 1;
  int ngram_max = 4;
  int tree_width = 1;        // distinct continuations merged into the tree (1 = chain)
  int max_matches = 64;      // occurrences examined per n (most recent first)
};

// The continuation of the most recent earlier occurrence of the longest suffix of `tokens` that
// occurred before (n from ngram_max down to ngram_min): tokens[start, start + length), at most
// max_len tokens. length 0 (and n 0) when no suffix occurred before.
struct NgramMatch {
  int64_t start = 0;
  int length = 0;
  int n = 0;  // tokens of the matched suffix
};
NgramMatch find_ngram_continuation(std::span<const int32_t> tokens, int ngram_min, int ngram_max,
                                   int max_len);

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(const NgramConfig& config);
  const char* name() const override { return "ngram"; }
  void propose(const DraftRequest& request, TokenTree* tree) override;

 private:
  // Inserts tokens[begin, begin + len) under the root, sharing existing prefixes; returns the
  // number of nodes added (bounded by `budget`).
  int insert(TokenTree* tree, const int32_t* tokens, int len, int budget);

  NgramConfig config_;
  std::vector<int64_t> starts_;  // scratch: continuation starts found
};

}  // namespace specdec
