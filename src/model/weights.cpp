#include "model/weights.h"

#include <fmt/format.h>

#include "backend/ggml_type.h"
#include "util/check.h"

namespace specdec {

const GgufTensor& require_matrix(const GgufFile& file, const std::string& name, int64_t rows,
                                 int64_t cols) {
  const GgufTensor* t = file.find_tensor(name);
  if (!t) throw Error(fmt::format("{}: tensor '{}' is missing", file.path(), name));
  if (t->ne.size() != 2 || t->ne[0] != cols || t->ne[1] != rows) {
    std::string shape;
    for (int64_t d : t->ne) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}, {}]", file.path(),
                            name, shape, cols, rows));
  }
  return *t;
}

const GgufTensor& require_f32_vector(const GgufFile& file, const std::string& name, int64_t n) {
  const GgufTensor* t = file.find_tensor(name);
  if (!t) throw Error(fmt::format("{}: tensor '{}' is missing", file.path(), name));
  if (t->ne.size() != 1 || t->ne[0] != n) {
    throw Error(fmt::format("{}: tensor '{}' should be a vector of {} elements", file.path(),
                            name, n));
  }
  if (t->type != GgmlType::kF32) {
    throw Error(fmt::format("{}: tensor '{}' has type {}, expected F32", file.path(), name,
                            ggml_type_traits(t->type).name));
  }
  return *t;
}

}  // namespace specdec
