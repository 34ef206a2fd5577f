#include "drafter/head_file.h"

#include <cmath>
#include <cstdlib>
#include <unordered_set>

#include <fmt/format.h>

#include "model/model.h"
#include "util/check.h"

namespace specdec {

int head_meta_int(const StFile& f, const std::string& path, const std::string& key) {
  const std::string& v = f.require_meta(path, key);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != 0 || n < 0 || n > (1 << 24)) {
    throw Error(fmt::format("{}: metadata '{}' = '{}' is not a valid size", path, key, v));
  }
  return static_cast<int>(n);
}

std::vector<int32_t> head_draft_vocab(const StFile& f, const std::string& path, int n_target_vocab) {
  const StTensor* vocab = f.find("draft_vocab");
  if (!vocab || vocab->shape.size() != 1 || vocab->shape[0] == 0) {
    throw Error(fmt::format("{}: tensor 'draft_vocab' is missing, empty or not a vector", path));
  }
  std::vector<int32_t> ids = vocab->to_i32();
  std::unordered_set<int32_t> seen;
  for (int32_t id : ids) {
    if (id < 0 || id >= n_target_vocab || !seen.insert(id).second) {
      throw Error(fmt::format("{}: draft_vocab holds {} (out of range or repeated)", path, id));
    }
  }
  return ids;
}

void check_head_target(const std::string& fp, int dim, int n_vocab, const Model& target,
                       const std::string& path) {
  const std::string& own = target.fingerprint();
  if (dim != target.config().dim || n_vocab != target.config().n_vocab || fp != own) {
    throw Error(fmt::format(
        "{}: this drafter head was trained for another model (its target: {}; this model: {}); "
        "train one for this model with `specdec train-drafter`",
        path, fp, own));
  }
}

void matvec_ref(const std::vector<float>& w, const float* x, int rows, int cols, const float* b,
                float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* wr = w.data() + static_cast<int64_t>(r) * cols;
    double acc = b ? b[r] : 0.0;
    for (int c = 0; c < cols; ++c) acc += static_cast<double>(wr[c]) * x[c];
    y[r] = static_cast<float>(acc);
  }
}

float silu_ref(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace specdec
