#include "drafter/redrafter_weights.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "drafter/head_file.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec {

int64_t ReDrafterShape::num_params() const {
  const int64_t d = width();
  return int64_t{state_dim} * dim + int64_t{state_dim} * state_dim + state_dim +
         n_blocks * (d * d + d) + int64_t{n_draft_vocab} * d;
}

ReDrafterWeights make_redrafter(const ReDrafterShape& shape, std::vector<int32_t> draft_vocab,
                                std::string target_fingerprint) {
  SPECDEC_CHECK(static_cast<int>(draft_vocab.size()) == shape.n_draft_vocab,
                "draft vocabulary size differs from the shape");
  ReDrafterWeights w;
  w.shape = shape;
  w.target_fingerprint = std::move(target_fingerprint);
  w.draft_vocab = std::move(draft_vocab);
  const int64_t s = shape.state_dim, dim = shape.dim, d = shape.width();
  w.w_embed.assign(static_cast<size_t>(s * dim), 0.0f);
  w.w_state.assign(static_cast<size_t>(s * s), 0.0f);
  w.b_state.assign(static_cast<size_t>(s), 0.0f);
  w.w_block.assign(shape.n_blocks, std::vector<float>(static_cast<size_t>(d * d), 0.0f));
  w.b_block.assign(shape.n_blocks, std::vector<float>(static_cast<size_t>(d), 0.0f));
  w.w_out.assign(static_cast<size_t>(shape.n_draft_vocab * d), 0.0f);
  return w;
}

std::vector<float> redrafter_rnn_rows(const ReDrafterWeights& w) {
  const int64_t s = w.shape.state_dim, dim = w.shape.dim;
  std::vector<float> rnn(static_cast<size_t>(s * (dim + s)));
  for (int64_t i = 0; i < s; ++i) {
    std::copy_n(w.w_embed.data() + i * dim, dim, rnn.data() + i * (dim + s));
    std::copy_n(w.w_state.data() + i * s, s, rnn.data() + i * (dim + s) + dim);
  }
  return rnn;
}

StFile redrafter_to_st(const ReDrafterWeights& w, StDtype dtype) {
  const ReDrafterShape& sh = w.shape;
  const int64_t s = sh.state_dim, dim = sh.dim, d = sh.width(), v = sh.n_draft_vocab;
  StFile f;
  f.metadata = {{"specdec.kind", "redrafter"},
                {"specdec.target", w.target_fingerprint},
                {"specdec.dim", std::to_string(sh.dim)},
                {"specdec.state_dim", std::to_string(sh.state_dim)},
                {"specdec.n_blocks", std::to_string(sh.n_blocks)},
                {"specdec.n_target_vocab", std::to_string(sh.n_target_vocab)}};
  for (const auto& [k, val] : w.info) f.metadata[k] = val;
  f.tensors.push_back(st_from_f32("rnn.w_embed", {s, dim}, w.w_embed, dtype));
  f.tensors.push_back(st_from_f32("rnn.w_state", {s, s}, w.w_state, dtype));
  f.tensors.push_back(st_from_f32("rnn.bias", {s}, w.b_state, dtype));
  for (int l = 0; l < sh.n_blocks; ++l) {
    f.tensors.push_back(st_from_f32(fmt::format("blocks.{}.weight", l), {d, d}, w.w_block[l], dtype));
    f.tensors.push_back(st_from_f32(fmt::format("blocks.{}.bias", l), {d}, w.b_block[l], dtype));
  }
  f.tensors.push_back(st_from_f32("lm_head.weight", {v, d}, w.w_out, dtype));
  f.tensors.push_back(st_from_i32("draft_vocab", {v}, w.draft_vocab));
  return f;
}

ReDrafterWeights redrafter_from_st(const StFile& f, const std::string& path) {
  const std::string& kind = f.require_meta(path, "specdec.kind");
  if (kind != "redrafter") {
    throw Error(fmt::format("{}: a '{}' head, not a ReDrafter head", path, kind));
  }
  ReDrafterShape sh;
  sh.dim = head_meta_int(f, path, "specdec.dim");
  sh.state_dim = head_meta_int(f, path, "specdec.state_dim");
  sh.n_blocks = head_meta_int(f, path, "specdec.n_blocks");
  sh.n_target_vocab = head_meta_int(f, path, "specdec.n_target_vocab");
  std::vector<int32_t> ids = head_draft_vocab(f, path, sh.n_target_vocab);
  sh.n_draft_vocab = static_cast<int>(ids.size());
  if (sh.dim <= 0 || sh.state_dim <= 0 || sh.n_target_vocab <= 0) {
    throw Error(fmt::format("{}: empty dimensions in the metadata", path));
  }
  const int64_t s = sh.state_dim, dim = sh.dim, d = sh.width(), v = sh.n_draft_vocab;
  auto require = [&](const std::string& name,
                     std::initializer_list<int64_t> shape) -> const StTensor& {
    return f.require(path, name, std::span<const int64_t>(shape.begin(), shape.size()));
  };
  // The file's tensors against the metadata's sizes before anything of those sizes is allocated
  // (metadata that lies, e.g. 2^24 blocks, would otherwise ask for all the memory there is).
  require("rnn.w_embed", {s, dim});
  require("rnn.w_state", {s, s});
  require("rnn.bias", {s});
  for (int l = 0; l < sh.n_blocks; ++l) {
    require(fmt::format("blocks.{}.weight", l), {d, d});
    require(fmt::format("blocks.{}.bias", l), {d});
  }
  require("lm_head.weight", {v, d});
  ReDrafterWeights w = make_redrafter(sh, std::move(ids), f.require_meta(path, "specdec.target"));
  auto get = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    return require(name, shape).to_f32();
  };
  w.w_embed = get("rnn.w_embed", {s, dim});
  w.w_state = get("rnn.w_state", {s, s});
  w.b_state = get("rnn.bias", {s});
  for (int l = 0; l < sh.n_blocks; ++l) {
    w.w_block[l] = get(fmt::format("blocks.{}.weight", l), {d, d});
    w.b_block[l] = get(fmt::format("blocks.{}.bias", l), {d});
  }
  w.w_out = get("lm_head.weight", {v, d});
  for (const auto& [k, val] : f.metadata) {
    if (k.rfind("train.", 0) == 0) w.info[k] = val;
  }
  return w;
}

void save_redrafter(const std::string& path, const ReDrafterWeights& w, StDtype dtype) {
  write_safetensors(path, redrafter_to_st(w, dtype));
}

ReDrafterWeights load_redrafter(const std::string& path) {
  return redrafter_from_st(read_safetensors(path), path);
}

void check_redrafter_target(const ReDrafterWeights& w, const Model& target, const std::string& path) {
  check_head_target(w.target_fingerprint, w.shape.dim, w.shape.n_target_vocab, target, path);
}

void redrafter_step_ref(const ReDrafterWeights& w, const float* h, const float* e,
                        const float* s_prev, float* s_out, float* logits) {
  const ReDrafterShape& sh = w.shape;
  const int s = sh.state_dim, dim = sh.dim, d = sh.width();
  std::vector<float> a(s), b(s), x(d), y(d);
  matvec_ref(w.w_embed, e, s, dim, w.b_state.data(), a.data());
  matvec_ref(w.w_state, s_prev, s, s, nullptr, b.data());
  for (int i = 0; i < s; ++i) s_out[i] = silu_ref(a[i] + b[i]);
  std::copy(h, h + dim, x.begin());
  std::copy(s_out, s_out + s, x.begin() + dim);
  for (int l = 0; l < sh.n_blocks; ++l) {
    matvec_ref(w.w_block[l], x.data(), d, d, w.b_block[l].data(), y.data());
    for (int i = 0; i < d; ++i) x[i] += silu_ref(y[i]);
  }
  matvec_ref(w.w_out, x.data(), sh.n_draft_vocab, d, nullptr, logits);
}

}  // namespace specdec
