// Training Medusa heads on a distillation dataset, with the ReDrafter trainer's pieces: the
// same held-out split, per-epoch shuffle, minibatches (make_batch with steps = K: head k's
// target is t_{i+2+k}), global-norm clipping, AdamW with the warmup + cosine schedule,
// evaluations and progress events (redrafter_trainer.h types; options.steps is ignored, the
// heads' count rules). Checkpoints / resume are not supported yet (Error when asked).
#pragma once

#include <functional>
#include <span>

#include "drafter/distill_data.h"
#include "drafter/medusa_weights.h"
#include "drafter/train/redrafter_trainer.h"

namespace specdec {

class ThreadPool;

ReDrafterTrainReport train_medusa(MedusaWeights& w, const DistillDataset& data,
                                  const ReDrafterTrainOptions& o, ThreadPool* pool,
                                  const std::function<void(const ReDrafterTrainEvent&)>& on_event =
                                      {});

// Held-out statistics of w over `positions` (forward only, in batches of `batch`).
ReDrafterLossStats evaluate_medusa(const MedusaWeights& w, const DistillDataset& data,
                                   std::span<const int64_t> positions, int batch,
                                   ThreadPool* pool);

}  // namespace specdec
