// The cross-entropy step that every head's training shares (ReDrafter's steps, Medusa's heads):
// logits rows in step-major order (row r = k * B + b: step or head k of position b), each
// scored against its target, and the batch's statistics added up per step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "drafter/train/redrafter_grad.h"

namespace specdec {

class ThreadPool;

// logits: [steps * B, V]; targets: [steps * B] (kTargetOutOfVocab / kTargetPastEnd masked).
// Adds to stats (reset to `steps` by the caller): per step the loss, the scored and counted
// targets, the right argmaxes; per position the leading steps predicted right; n_positions = B.
// With backward, each scored row becomes d J / d logits for J = (1/B) Σ cross-entropy, and a
// masked row zeros. row_loss / row_argmax: scratch of [steps * B].
// soft ([steps * B, V] distributions, or null) with soft_weight a: a scored row's label is
// a * soft + (1 - a) * onehot(target), for its loss and its gradient (the argmax statistics
// still count the true token).
void score_rows(Isa isa, float* logits, int64_t V, std::span<const int32_t> targets,
                int64_t steps, int64_t B, bool backward, std::vector<double>* row_loss,
                std::vector<int32_t>* row_argmax, ReDrafterLossStats* stats, ThreadPool* pool,
                const float* soft = nullptr, float soft_weight = 0.0f);

}  // namespace specdec
