// Training a ReDrafter head on a distillation dataset: minibatches of training positions
// (train_data.h) shuffled per epoch by a seeded generator, teacher-forced forward / backward
// (redrafter_grad.h), global-norm clipping, AdamW with a warmup + cosine schedule (adamw.h),
// held-out evaluation, and checkpoints (train_checkpoint.h) that a later run resumes from
// exactly: the same options and data give the same final weights, bit for bit, whether the run
// was interrupted or not, and whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "drafter/distill_data.h"
#include "drafter/redrafter_weights.h"
#include "drafter/train/adamw.h"
#include "drafter/train/redrafter_grad.h"

namespace specdec {

class ThreadPool;

struct ReDrafterTrainOptions {
  int steps = 4;              // C: tokens drafted after the root (teacher-forced steps)
  int batch = 256;            // positions per update
  int epochs = 1;
  double lr = 1e-3;           // peak learning rate
  double lr_min = 0.0;        // the cosine's end
  int64_t warmup = -1;        // updates of linear warmup; -1: 2% of all, between 1 and 500
  AdamWOptions adam;
  double clip = 1.0;          // global gradient norm (<= 0: none)
  uint64_t seed = 1;          // shuffling and the held-out split (initialise w with it too)
  double eval_fraction = 0.02;        // sequences held out
  int64_t eval_every = 0;             // updates between evaluations; 0: ten per run
  int64_t max_eval_positions = 16384; // evaluate on at most this many held-out positions
  int64_t checkpoint_every = 0;       // updates between checkpoints (0: none)
  std::string checkpoint_path;        // where they go (required with checkpoint_every / resume)
  bool resume = false;                // continue from checkpoint_path (Error when missing)
  // Stop after this many updates in all (0: run to the end), leaving a checkpoint when a path is
  // set; a later run with resume finishes the same training (tests, time-boxed runs).
  int64_t stop_after = 0;
  // Knowledge distillation: each target's label is soft_labels * (the target model's
  // distribution over the draft vocabulary there) + (1 - soft_labels) * the true token, in
  // training (held-out figures stay against the true token). soft_rows: [V_d, dim] the target's
  // output rows of the head's draft vocabulary as floats (needed when soft_labels > 0).
  double soft_labels = 0.0;
  std::span<const float> soft_rows;
};

struct ReDrafterTrainEvent {
  enum class Kind { kProgress, kEval, kCheckpoint };
  Kind kind = Kind::kProgress;
  int64_t step = 0;          // updates done
  int64_t total_steps = 0;
  int epoch = 0;             // 0-based epoch of the last update
  double train_loss = 0;     // cross-entropy per scored target over the updates since the last
                             // progress event (the unit of ReDrafterLossStats::mean_loss)
  double lr = 0;             // learning rate of the last update
  double grad_norm = 0;      // before clipping, last update
  double positions_per_s = 0;  // this run's training throughput
  double elapsed_s = 0;      // training time so far (before a resume included)
  double eta_s = 0;
  const ReDrafterLossStats* eval = nullptr;  // kEval: the held-out statistics
};

struct ReDrafterTrainReport {
  ReDrafterLossStats eval;          // held-out statistics of the final weights (empty: none)
  int64_t steps = 0;                // updates done
  int64_t total_steps = 0;
  bool finished = false;            // false when stopped by stop_after
  int64_t resumed_from = -1;        // the checkpoint's step, -1 when not resumed
  int64_t n_train_positions = 0;    // per epoch
  int64_t n_eval_positions = 0;     // evaluated (after the cap)
  int64_t n_train_seqs = 0, n_eval_seqs = 0;
  int64_t positions_trained = 0;    // over the whole training (before a resume included)
  double seconds = 0;               // training time (before a resume included)
  double positions_per_s = 0;       // this run's throughput
};

// Trains w (initialised by the caller, e.g. init_redrafter; replaced by the checkpoint's when
// resuming) on `data`. embedding: [n_target_vocab, dim] floats, the target's token embedding.
// Throws specdec::Error for unusable data or options (no training position, a token outside
// the target's vocabulary, a hidden width unlike the head's, a checkpoint of another run).
ReDrafterTrainReport train_redrafter(ReDrafterWeights& w, const DistillDataset& data,
                                     std::span<const float> embedding,
                                     const ReDrafterTrainOptions& o, ThreadPool* pool,
                                     const std::function<void(const ReDrafterTrainEvent&)>&
                                         on_event = {});

// The held-out statistics of w over `positions` (forward only, in batches of `batch`).
ReDrafterLossStats evaluate_redrafter(const ReDrafterWeights& w, const DistillDataset& data,
                                      std::span<const float> embedding,
                                      std::span<const int64_t> positions, int steps, int batch,
                                      ThreadPool* pool);

}  // namespace specdec
