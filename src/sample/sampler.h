// Token sampling from logits: repetition penalty, top-k, top-p, min-p, temperature, and a draw
// with the sequence's own seeded Rng.
//
// The chain, in llama.cpp's default order (common/sampling):
//   1. repetition penalty: every distinct token among the last repeat_last_n of `history` gets
//      logit > 0 ? logit / penalty : logit * penalty (once, however often it occurs);
//   2. top-k: keep the k largest logits (ties: the lower token id first);
//   3. top-p: over softmax(logits) of what is left (temperature 1), keep the smallest prefix of
//      the sorted tokens whose probability sum reaches top_p;
//   4. min-p: keep tokens whose probability is at least min_p times the largest
//      (logit >= max_logit + ln(min_p));
//   5. temperature: p = softmax(logit / temperature) over the kept tokens, 0 elsewhere.
// temperature 0 is greedy: the first largest penalized logit, whatever the filters say (the top
// token survives every filter anyway); its distribution is one-hot.
//
// `distribution` returns exactly the vector that `sample` draws from (one Rng::uniform() per
// draw, inverse CDF in token order), so speculative verification can use it as p.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "sample/rng.h"
#include "specdec/sampling_params.h"

namespace specdec {

class Sampler {
 public:
  // Validates `params` (throws specdec::Error) and seeds the Rng with params.seed.
  explicit Sampler(const SamplingParams& params);

  // The next token for `logits` ([n_vocab]) after `history` (the sequence so far, used by the
  // repetition penalty). Greedy draws do not advance the Rng. Does not allocate once the scratch
  // has grown to n_vocab.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  // The probabilities `sample` draws from: probs = [n_vocab], zero outside the kept set, summing
  // to 1 up to rounding. Uses member scratch, so one Sampler must not run two calls at once.
  void distribution(std::span<const float> logits, std::span<const int32_t> history,
                    std::vector<float>* probs) const;

  const SamplingParams& params() const { return params_; }
  Rng& rng() { return rng_; }

 private:
  // A token and its penalized logit; sorting these directly (no indirection) keeps it fast.
  struct Candidate {
    float logit;
    int32_t id;
    // Larger logit first; on ties the lower id.
    static bool better(const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    }
  };

  // Whether the repetition penalty changes any logit given this history.
  bool penalizes(std::span<const int32_t> history) const;
  // logits_ = penalized logits; returns the largest. Throws on empty / NaN / out-of-range input.
  float penalize(std::span<const float> logits, std::span<const int32_t> history) const;
  // The first token whose penalized logit equals `max`.
  int32_t first_max(float max) const;
  // Greedy choice without a repetition penalty: the first largest logit, read in place (the
  // same checks and errors as penalize()).
  int32_t greedy_unpenalized(std::span<const float> logits) const;
  // Fills candidates_ with every token whose logit is >= floor (all of them by default; returns
  // how many), the best `need` or more of them first (n_front_).
  int64_t start_sorting(int64_t need,
                        float floor = -std::numeric_limits<float>::infinity()) const;
  // Sorts candidates_ far enough that candidates_[0, m) are the m best of candidates_[0, n), in
  // order (m <= n).
  void ensure_sorted(int64_t m, int64_t n) const;

  SamplingParams params_;
  Rng rng_;
  mutable std::vector<float> logits_;          // [n_vocab] penalized logits
  mutable std::vector<Candidate> candidates_;  // [n_vocab] a permutation of the tokens
  mutable std::vector<Candidate> spill_;       // [n_vocab] scratch of ensure_sorted
  mutable int64_t n_sorted_ = 0;  // candidates_[0, n_sorted_): sorted, better than the rest
  mutable int64_t n_front_ = 0;   // candidates_[0, n_front_): better than the rest
  // What the last distribution() kept: candidates_[0, n_kept_) when kept_sorted_, else every
  // token with a positive probability.
  mutable bool kept_sorted_ = false;
  mutable int64_t n_kept_ = 0;
  mutable std::vector<uint8_t> penalized_;  // [n_vocab] 1 while a token's penalty is applied
  std::vector<float> probs_;                // [n_vocab] scratch of sample()
  std::vector<int32_t> kept_ids_;           // [n_kept] scratch of sample()
  std::vector<double> block_sums_;          // [n_vocab / 64] scratch of sample()
};

}  // namespace specdec
