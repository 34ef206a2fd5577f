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

class ReDrafterBeamSearch {
 public:
  // head and target must outlive the search; the target gives the token embeddings.
  ReDrafterBeamSearch(const ReDrafterHead& head, const Model& target);

  // h: [dim] the target's hidden state before the root.
  void run(std::span<const float> h, int32_t root, const BeamSearchConfig& c, Beams* out,
           ThreadPool* pool);

 private:
  const ReDrafterHead& head_;
  const Model& target_;
  ReDrafterScratch scratch_;
  std::vector<float> in_;        // [M, dim + S]
  std::vector<float> state_;     // [M, S] the live beams' states
  std::vector<float> s_out_;     // [M, S]
  std::vector<float> logits_;    // [M, V_d]
  std::vector<int32_t> draft_;   // [M, C] live beams' draft indices
  std::vector<int32_t> next_draft_;
  std::vector<float> next_state_;
  std::vector<float> score_;     // [M]
  std::vector<float> prefix_;    // [M, C] live beams' prefix scores
  std::vector<float> next_prefix_;
  std::vector<int32_t> last_tok_;  // [M] target ids of the live beams' last tokens
  struct Cand {
    float score;
    int32_t row;
    int32_t v;
  };
  std::vector<Cand> cands_;
};

}  // namespace specdec
