// What every drafter head file shares (ReDrafter, Medusa): size metadata, the draft vocabulary
// tensor, the check that a head belongs to the loaded target, and the plain arithmetic of the
// heads' reference functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drafter/safetensors.h"

namespace specdec {

class Model;

// Metadata `key` as a size in [0, 2^24]; specdec::Error naming `path` and the key otherwise.
int head_meta_int(const StFile& f, const std::string& path, const std::string& key);

// The "draft_vocab" tensor: a vector of distinct ids below n_target_vocab (specdec::Error
// naming `path` otherwise).
std::vector<int32_t> head_draft_vocab(const StFile& f, const std::string& path, int n_target_vocab);

// specdec::Error, naming the file, when a head trained for the model with fingerprint `fp`
// (width dim, vocabulary n_vocab) is used with another target.
void check_head_target(const std::string& fp, int dim, int n_vocab, const Model& target,
                       const std::string& path);

// Reference arithmetic: y[rows] = W[rows, cols] · x[cols] (+ b), accumulated in double.
void matvec_ref(const std::vector<float>& w, const float* x, int rows, int cols, const float* b,
                float* y);
// x / (1 + e^-x)
float silu_ref(float x);

}  // namespace specdec
