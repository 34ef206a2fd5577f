// Where specdec keeps what setup downloads: $SPECDEC_CACHE, or ~/.cache/specdec.
#pragma once

#include <string>

namespace specdec {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string cache_dir();
std::string default_model_path();  // cache_dir()/kDefaultModelFile

// Models that scripts/fetch-model.sh NAME puts into cache_dir(), e.g. "qwen2.5-coder-0.5b" ->
// "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf". Empty for an unknown name.
std::string known_model_file(const std::string& name);
// cache_dir()/known_model_file(name); empty for an unknown name.
std::string known_model_path(const std::string& name);

}  // namespace specdec
