// The starting point of a ReDrafter head's training: seeded random matrices, zero biases, and
// optionally lm_head from the target's own output rows.
#pragma once

#include <cstdint>

#include "drafter/redrafter_weights.h"

namespace specdec {

struct ReDrafterInitOptions {
  // W_e, W_s and the blocks' W_l: normal, std = scale / sqrt(fan_in).
  double scale = 1.0;
  // lm_head: normal with this std (< 0: 1 / sqrt(D); 0: all zero, so the head starts at the
  // uniform distribution), unless out_rows is given.
  double out_std = -1.0;
};

// Fills every parameter of w from `seed` (same seed, same head). out_rows: [V_d, dim] or null;
// when given, lm_head's h columns start as these rows (the target's output rows of the draft
// vocabulary, so the head starts as the target's own readout of h) and its s columns at zero.
void init_redrafter(ReDrafterWeights& w, uint64_t seed, const ReDrafterInitOptions& o,
                    const float* out_rows = nullptr);

}  // namespace specdec
