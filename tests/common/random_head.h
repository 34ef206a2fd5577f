// Random ReDrafter heads for the tests: weights drawn from a seeded normal, a draft vocabulary
// of the target's most frequent greedy tokens (so that random drafts are sometimes accepted and
// the acceptance paths of the verifier run).
#pragma once

#include <cstdint>
#include <vector>

#include "drafter/medusa_weights.h"
#include "drafter/redrafter_weights.h"

namespace specdec {

class Model;

namespace test {

// The `n` tokens the model emits most often when it continues `prompts` greedily for 96 tokens
// each (ties to the lower id).
std::vector<int32_t> frequent_tokens(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                     int n);

// frequent_tokens over three story openings ("Once upon a time", "Lily and Ben went to the
// park.", "Tom had a red ball."), encoded with the model's own tokenizer: a draft vocabulary for
// random heads on the tiny story models.
std::vector<int32_t> story_tokens(Model& model, int n);

// A head for `target` (its fingerprint, width and vocabulary) over `vocab` (most frequent
// first): random weights, plus a prior through the RNN state (a constant bias, so s stays near
// SiLU(1)) that ranks the vocabulary's tokens in its order, so that the drafts are likely
// tokens that the random parts vary with the context.
// prior_step: how much lower each next rank's prior logit is.
ReDrafterWeights random_head(const Model& target, std::vector<int32_t> vocab, int state_dim,
                             int n_blocks, uint64_t seed, float prior_step = 0.4f);

// Medusa heads for `target` over `vocab` (most frequent first) in the same spirit: random
// weights plus a prior through a constant residual bias (x_k = h + SiLU(b) with b large).
MedusaWeights random_medusa(const Model& target, std::vector<int32_t> vocab, int n_heads,
                            uint64_t seed, float prior_step = 0.4f);

}  // namespace test
}  // namespace specdec
