// Where drafter heads are found when a command names none: every *.safetensors file in
//   $SPECDEC_HEADS (a directory), then the heads/ directory of the source tree specdec was built
//   from (the head trained for the default model ships there), then <cache>/heads,
// whose metadata says it is a head of `kind` ("redrafter", "medusa") trained for this very model
// (Model::fingerprint). Only headers are read.
#pragma once

#include <string>
#include <vector>

namespace specdec {

class Model;

// The directories searched, in order (those that do not exist included).
std::vector<std::string> drafter_head_dirs();

// The first matching head's path (files in a directory in name order), or "" when none.
std::string find_drafter_head(const Model& target, const std::string& kind);

}  // namespace specdec
