#include "drafter/redrafter_proposer.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {

ReDrafterProposer::ReDrafterProposer(const ReDrafterHead& head, const Model& target,
                                     ThreadPool* pool, const BeamSearchConfig& beams)
    : pool_(pool), config_(beams), search_(head, target) {}

void ReDrafterProposer::propose(const DraftRequest& request, TokenTree* tree) {
  if (request.target_hidden.empty() || request.max_tokens <= 0 || request.tokens.empty()) return;
  BeamSearchConfig c = config_;
  c.length = std::min(c.length, request.max_tokens);
  search_.run(request.target_hidden, request.tokens.back(), c, &beams_, pool_);
  pack_beams(beams_.tokens, beams_.n, beams_.length, request.max_tokens, tree);
}

}  // namespace specdec
