// Where specdec keeps what setup downloads: $SPECDEC_CACHE, or ~/.cache/specdec.
#pragma once

#include <string>

namespace specdec {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string cache_dir();
std::string default_model_path();  // cache_dir()/kDefaultModelFile

}  // namespace specdec
