// Sampling parameters of one request (public API). The chain they drive is described in
// src/sample/sampler.h.
#pragma once

#include <cstdint>

namespace specdec {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // in (0, 1]; 1: off
  float min_p = 0.0f;               // in [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  int repeat_last_n = 64;           // tokens of history the penalty looks at; 0: none, -1: all
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }

  // Throws specdec::Error naming the first option out of range.
  void validate() const;
};

}  // namespace specdec
