// A training checkpoint of a ReDrafter head: everything a run needs to continue exactly where it
// stopped (same final weights as an uninterrupted run): the weights, AdamW's moments and update
// count, the number of updates done, and the shuffling generator's state at the start of the
// current epoch. One safetensors file, all F32: the head's tensors (redrafter_weights.h names),
// "adam.m.NAME" / "adam.v.NAME" per parameter, and metadata "checkpoint.step",
// "checkpoint.adam_t", "checkpoint.rng" (four 64-bit words in hex), "checkpoint.config" (the
// run's settings, which a resumed run must match) and "checkpoint.elapsed_s".
#pragma once

#include <cstdint>
#include <string>

#include "drafter/redrafter_weights.h"
#include "drafter/train/adamw.h"
#include "sample/rng.h"

namespace specdec {

struct TrainCheckpoint {
  ReDrafterWeights weights;
  AdamWState adam;
  int64_t step = 0;            // updates done
  Rng::State epoch_rng{};      // the shuffle generator at the start of the current epoch
  std::string config;          // settings that resuming must match (see train_redrafter)
  double elapsed_s = 0;        // training time spent before the checkpoint
};

// Written to path + ".tmp", then renamed (a crash never leaves half a checkpoint).
void save_train_checkpoint(const std::string& path, const TrainCheckpoint& c);
// specdec::Error naming the file when it is missing, malformed or not a checkpoint.
TrainCheckpoint load_train_checkpoint(const std::string& path);

}  // namespace specdec
