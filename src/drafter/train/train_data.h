// Training positions of a distillation dataset (distill_data.h) for a ReDrafter head, the
// held-out split and the minibatches.
//
// Position i of a sequence t_0 .. t_{L-1} (stored as the global token index of t_i) pairs h_i
// with the root t_{i+1} and the targets t_{i+2} .. t_{i+1+C}. It is trained on when its root
// lies in the answer (i + 1 >= n_prompt) and it has at least one target (i + 2 <= L - 1).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "drafter/distill_data.h"
#include "backend/cpu/thread_pool.h"
#include "drafter/train/redrafter_grad.h"
#include "sample/rng.h"

namespace specdec {

struct PositionSplit {
  std::vector<int64_t> train;  // global token indices of h_i, sequence by sequence, in order
  std::vector<int64_t> eval;   // the held-out sequences' positions
  int64_t n_train_seqs = 0;
  int64_t n_eval_seqs = 0;
};

// Every trained position of the sequences whose flag in `held_out` is `want` (all sequences when
// held_out is empty and want is false).
std::vector<int64_t> training_positions(const DistillDataset& d, std::span<const uint8_t> held_out,
                                        bool want);

// Holds out round(eval_fraction * n_seqs) whole sequences (at least one when the fraction is
// positive and there are two or more sequences), chosen by `seed` alone.
PositionSplit split_positions(const DistillDataset& d, double eval_fraction, uint64_t seed);

// In place: a Fisher-Yates shuffle by rng (the per-epoch order of the training positions).
void shuffle_positions(std::vector<int64_t>& v, Rng& rng);

// At most `cap` positions spread evenly over `all` (deterministic; cap <= 0: all).
std::vector<int64_t> capped_positions(const std::vector<int64_t>& all, int64_t cap);

// [n_target_vocab]: the draft index of each target token, -1 for tokens outside draft_vocab.
std::vector<int32_t> draft_index_map(std::span<const int32_t> draft_vocab, int n_target_vocab);

// The batch of `positions` with `steps` steps (teacher forcing): hidden rows as floats, inputs
// g_k = t_{i+1+k} (the root when past the end), targets draft_index[t_{i+2+k}] (or
// kTargetOutOfVocab) and kTargetPastEnd past the end. *batch's buffers are reused.
void make_batch(const DistillDataset& d, std::span<const int64_t> positions, int steps,
                std::span<const int32_t> draft_index, ReDrafterBatch* batch);

// Soft labels of a batch made by make_batch from the same positions: for the target of step k
// of position i (t_{i+2+k}), the target model's distribution over the draft vocabulary there,
// softmax(target_rows · h_{i+1+k}) (h: the stored final-normed hidden that predicted it;
// target_rows [V_d, dim]: the target's output rows of the draft vocabulary, as floats), into
// batch->soft [C, B, V_d]; rows past the sequence's end are zeros. batch->soft_weight = weight.
// label_hidden: scratch. Deterministic for any pool.
void make_soft_labels(const DistillDataset& d, std::span<const int64_t> positions,
                      std::span<const float> target_rows, float weight, ReDrafterBatch* batch,
                      std::vector<float>* label_hidden, ThreadPool* pool);

}  // namespace specdec
