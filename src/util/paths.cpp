#include "util/paths.h"

#include <cstdlib>

namespace specdec {

std::string cache_dir() {
  if (const char* env = std::getenv("SPECDEC_CACHE"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/specdec";
}

std::string default_model_path() { return cache_dir() + "/" + kDefaultModelFile; }

std::string known_model_file(const std::string& name) {
  // Keep in step with the MODELS table of scripts/fetch-model.sh.
  static constexpr struct {
    const char* name;
    const char* file;
  } kKnown[] = {
      {"qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"},
      {"qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"},
  };
  for (const auto& k : kKnown) {
    if (name == k.name) return k.file;
  }
  return "";
}

std::string known_model_path(const std::string& name) {
  const std::string file = known_model_file(name);
  return file.empty() ? file : cache_dir() + "/" + file;
}

}  // namespace specdec
