#include "util/paths.h"

#include <cstdlib>

namespace specdec {

std::string cache_dir() {
  if (const char* env = std::getenv("SPECDEC_CACHE"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/specdec";
}

std::string default_model_path() { return cache_dir() + "/" + kDefaultModelFile; }

}  // namespace specdec
