#include "drafter/medusa_weights.h"

#include <fmt/format.h>

#include "drafter/head_file.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec {

int64_t MedusaShape::num_params() const {
  return int64_t{n_heads} * (int64_t{dim} * dim + dim + int64_t{n_draft_vocab} * dim);
}

MedusaWeights make_medusa(const MedusaShape& shape, std::vector<int32_t> draft_vocab,
                          std::string target_fingerprint) {
  SPECDEC_CHECK(static_cast<int>(draft_vocab.size()) == shape.n_draft_vocab,
                "draft vocabulary size differs from the shape");
  MedusaWeights w;
  w.shape = shape;
  w.target_fingerprint = std::move(target_fingerprint);
  w.draft_vocab = std::move(draft_vocab);
  const size_t dim = static_cast<size_t>(shape.dim);
  w.w_res.assign(shape.n_heads, std::vector<float>(dim * dim, 0.0f));
  w.b_res.assign(shape.n_heads, std::vector<float>(dim, 0.0f));
  w.w_out.assign(shape.n_heads, std::vector<float>(static_cast<size_t>(shape.n_draft_vocab) * dim, 0.0f));
  return w;
}

StFile medusa_to_st(const MedusaWeights& w, StDtype dtype) {
  const MedusaShape& sh = w.shape;
  const int64_t dim = sh.dim, v = sh.n_draft_vocab;
  StFile f;
  f.metadata = {{"specdec.kind", "medusa"},
                {"specdec.target", w.target_fingerprint},
                {"specdec.dim", std::to_string(sh.dim)},
                {"specdec.n_heads", std::to_string(sh.n_heads)},
                {"specdec.n_target_vocab", std::to_string(sh.n_target_vocab)}};
  for (const auto& [k, val] : w.info) f.metadata[k] = val;
  for (int k = 0; k < sh.n_heads; ++k) {
    f.tensors.push_back(st_from_f32(fmt::format("heads.{}.weight", k), {dim, dim}, w.w_res[k], dtype));
    f.tensors.push_back(st_from_f32(fmt::format("heads.{}.bias", k), {dim}, w.b_res[k], dtype));
    f.tensors.push_back(st_from_f32(fmt::format("heads.{}.lm_head", k), {v, dim}, w.w_out[k], dtype));
  }
  f.tensors.push_back(st_from_i32("draft_vocab", {v}, w.draft_vocab));
  return f;
}

MedusaWeights medusa_from_st(const StFile& f, const std::string& path) {
  const std::string& kind = f.require_meta(path, "specdec.kind");
  if (kind != "medusa") throw Error(fmt::format("{}: a '{}' head, not Medusa heads", path, kind));
  MedusaShape sh;
  sh.dim = head_meta_int(f, path, "specdec.dim");
  sh.n_heads = head_meta_int(f, path, "specdec.n_heads");
  sh.n_target_vocab = head_meta_int(f, path, "specdec.n_target_vocab");
  if (sh.dim <= 0 || sh.n_heads <= 0 || sh.n_heads > 16 || sh.n_target_vocab <= 0) {
    throw Error(fmt::format("{}: bad dimensions in the metadata", path));
  }
  std::vector<int32_t> ids = head_draft_vocab(f, path, sh.n_target_vocab);
  sh.n_draft_vocab = static_cast<int>(ids.size());
  const int64_t dim = sh.dim, v = sh.n_draft_vocab;
  auto require = [&](const std::string& name,
                     std::initializer_list<int64_t> shape) -> const StTensor& {
    return f.require(path, name, std::span<const int64_t>(shape.begin(), shape.size()));
  };
  // The file's tensors against the metadata's sizes before anything of those sizes is allocated
  // (a dim that lies would otherwise ask for dim^2 floats per head).
  for (int k = 0; k < sh.n_heads; ++k) {
    require(fmt::format("heads.{}.weight", k), {dim, dim});
    require(fmt::format("heads.{}.bias", k), {dim});
    require(fmt::format("heads.{}.lm_head", k), {v, dim});
  }
  MedusaWeights w = make_medusa(sh, std::move(ids), f.require_meta(path, "specdec.target"));
  auto get = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    return require(name, shape).to_f32();
  };
  for (int k = 0; k < sh.n_heads; ++k) {
    w.w_res[k] = get(fmt::format("heads.{}.weight", k), {dim, dim});
    w.b_res[k] = get(fmt::format("heads.{}.bias", k), {dim});
    w.w_out[k] = get(fmt::format("heads.{}.lm_head", k), {v, dim});
  }
  for (const auto& [k, val] : f.metadata) {
    if (k.rfind("train.", 0) == 0) w.info[k] = val;
  }
  return w;
}

void save_medusa(const std::string& path, const MedusaWeights& w, StDtype dtype) {
  write_safetensors(path, medusa_to_st(w, dtype));
}

MedusaWeights load_medusa(const std::string& path) {
  return medusa_from_st(read_safetensors(path), path);
}

void check_medusa_target(const MedusaWeights& w, const Model& target, const std::string& path) {
  check_head_target(w.target_fingerprint, w.shape.dim, w.shape.n_target_vocab, target, path);
}

void medusa_head_ref(const MedusaWeights& w, int k, const float* h, float* logits) {
  const int dim = w.shape.dim;
  std::vector<float> y(dim), x(dim);
  matvec_ref(w.w_res[k], h, dim, dim, w.b_res[k].data(), y.data());
  for (int i = 0; i < dim; ++i) x[i] = h[i] + silu_ref(y[i]);
  matvec_ref(w.w_out[k], x.data(), w.shape.n_draft_vocab, dim, nullptr, logits);
}

}  // namespace specdec
