// Beam search over a ReDrafter head (deterministic): M beams of C draft tokens after the root,
// ranked by the sum of the head's log-probabilities.
//   step 1: one row, in = concat(e(root), 0); the M best tokens start M beams
//   step k: one row per beam, in = concat(e(beam's last token), beam's state); every beam's M
//           best continuations compete, the M best (beam score + log p) survive and carry the
//           state their parent's row produced
// Ties go to the lower parent row, then the lower draft index, so a search replays exactly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "drafter/redrafter_head.h"

namespace specdec {

class Model;
class ThreadPool;

struct BeamSearchConfig {
  int beams = 4;   // M
  int length = 4;  // C
};

struct Beams {
  int n = 0;                    // beams found (M, or fewer with a tiny draft vocabulary)
  int length = 0;               // C
  std::vector<int32_t> tokens;  // [n, length] target token ids, best beam first
  std::vector<float> scores;    // [n] sum of log-probabilities, decreasing
  std::vector<float> prefix_scores;  // [n, length] the sum over the first k + 1 tokens
};

// One sequence's search in a batch (ReDrafterBeamSearch::run_batch).
struct BeamJob {
  std::span<const float> h;  // [dim] the target's hidden state before the root
  int32_t root = 0;
  BeamSearchConfig config;
  Beams* out = nullptr;
};

class ReDrafterBeamSearch {
 public:
  // head and target must outlive the search; the target gives the token embeddings.
  ReDrafterBeamSearch(const ReDrafterHead& head, const Model& target);

  // h: [dim] the target's hidden state before the root.
  void run(std::span<const float> h, int32_t root, const BeamSearchConfig& c, Beams* out,
           ThreadPool* pool);
  // Several sequences' searches at once: step k runs the live beams of every job still that
  // deep as one head step (ReDrafterHead::step_rows), so the head's weights are read once per
  // depth instead of once per job. Each job's beams are exactly what run() gives it alone.
  void run_batch(std::span<const BeamJob> jobs, ThreadPool* pool);

 private:
  // One job's live beams between steps.
  struct JobState {
    int m = 0, len = 0, live = 0;
    int row0 = 0;                   // its first row in this step's batch
    std::vector<float> state;       // [M, S] the live beams' states
    std::vector<int32_t> draft;     // [M, C] live beams' draft indices
    std::vector<float> score;       // [M]
    std::vector<float> prefix;      // [M, C] live beams' prefix scores
    std::vector<int32_t> last_tok;  // [M] target ids of the live beams' last tokens
  };
  struct Cand {
    float score;
    int32_t row;
    int32_t v;
  };
  // Job j's candidates from its rows of this step (depth k), into its next live beams.
  void advance(JobState& js, int k);

  const ReDrafterHead& head_;
  const Model& target_;
  ReDrafterScratch scratch_;
  std::vector<JobState> jobs_;
  std::vector<float> in_;               // [rows, dim + S]
  std::vector<const float*> h_rows_;    // [rows]
  std::vector<float> s_out_;            // [rows, S]
  std::vector<float> logits_;           // [rows, V_d]
  std::vector<int32_t> next_draft_;     // [M, C]
  std::vector<float> next_state_;       // [M, S]
  std::vector<float> next_prefix_;      // [M, C]
  std::vector<std::pair<float, int32_t>> best_;
  std::vector<Cand> cands_;
};

}  // namespace specdec
