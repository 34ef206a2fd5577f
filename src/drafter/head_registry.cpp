#include "drafter/head_registry.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "drafter/safetensors.h"
#include "model/model.h"
#include "util/check.h"
#include "util/paths.h"

#ifndef SPECDEC_HEADS_DIR
#define SPECDEC_HEADS_DIR ""
#endif

namespace specdec {

std::vector<std::string> drafter_head_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SPECDEC_HEADS"); env != nullptr && *env != 0) {
    dirs.emplace_back(env);
  }
  if (*SPECDEC_HEADS_DIR != 0) dirs.emplace_back(SPECDEC_HEADS_DIR);
  dirs.push_back(cache_dir() + "/heads");
  return dirs;
}

std::string find_drafter_head(const Model& target, const std::string& kind) {
  const std::string& fp = target.fingerprint();
  for (const std::string& dir : drafter_head_dirs()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      try {
        const auto meta = read_safetensors_metadata(f);
        auto k = meta.find("specdec.kind");
        auto t = meta.find("specdec.target");
        if (k != meta.end() && k->second == kind && t != meta.end() && t->second == fp) return f;
      } catch (const Error&) {
        // Not a head file (or a broken one): not a candidate.
      }
    }
  }
  return "";
}

}  // namespace specdec
