// Pieces shared by the specdec sub-commands.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model.h"

namespace specdec::cli {

// -m PATH, or the default model from the setup cache (with a hint to run setup when missing).
std::string resolve_model_path(const std::string& flag_value);

// Loads the model, printing progress to stderr (mapping, then touching every weight page so
// that the first token does not pay for page faults).
std::unique_ptr<Model> load_model_with_progress(const std::string& path, bool quiet);

int default_threads();

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace specdec::cli
