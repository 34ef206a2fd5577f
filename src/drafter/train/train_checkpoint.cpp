#include "drafter/train/train_checkpoint.h"

#include <cstdlib>

#include <fmt/format.h>

#include "drafter/safetensors.h"
#include "drafter/train/redrafter_params.h"
#include "util/check.h"

namespace specdec {
namespace {

std::string rng_to_string(const Rng::State& s) {
  return fmt::format("{:016x},{:016x},{:016x},{:016x}", s[0], s[1], s[2], s[3]);
}

Rng::State rng_from_string(const std::string& text, const std::string& path) {
  Rng::State s{};
  size_t pos = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t end = text.find(',', pos);
    const std::string word = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    char* stop = nullptr;
    s[i] = std::strtoull(word.c_str(), &stop, 16);
    if (word.empty() || *stop != 0 || (i < 3 && end == std::string::npos)) {
      throw Error(fmt::format("{}: metadata 'checkpoint.rng' = '{}' is not four hex words", path,
                              text));
    }
    pos = end + 1;
  }
  if (s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0) {
    throw Error(fmt::format("{}: metadata 'checkpoint.rng' is all zero", path));
  }
  return s;
}

int64_t meta_i64(const StFile& f, const std::string& path, const std::string& key) {
  const std::string& v = f.require_meta(path, key);
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != 0 || n < 0) {
    throw Error(fmt::format("{}: metadata '{}' = '{}' is not a count", path, key, v));
  }
  return n;
}

}  // namespace

void save_train_checkpoint(const std::string& path, const TrainCheckpoint& c) {
  StFile f = redrafter_to_st(c.weights, StDtype::kF32);
  ReDrafterWeights m = c.adam.m, v = c.adam.v;  // redrafter_param_tensors wants mutable heads
  for (const ParamTensor& p : redrafter_param_tensors(m)) {
    f.tensors.push_back(st_from_f32("adam.m." + p.name, {static_cast<int64_t>(p.data.size())},
                                    p.data));
  }
  for (const ParamTensor& p : redrafter_param_tensors(v)) {
    f.tensors.push_back(st_from_f32("adam.v." + p.name, {static_cast<int64_t>(p.data.size())},
                                    p.data));
  }
  f.metadata["checkpoint.step"] = std::to_string(c.step);
  f.metadata["checkpoint.adam_t"] = std::to_string(c.adam.t);
  f.metadata["checkpoint.rng"] = rng_to_string(c.epoch_rng);
  f.metadata["checkpoint.config"] = c.config;
  f.metadata["checkpoint.elapsed_s"] = fmt::format("{:.3f}", c.elapsed_s);
  write_safetensors(path, f);
}

TrainCheckpoint load_train_checkpoint(const std::string& path) {
  const StFile f = read_safetensors(path);
  if (f.metadata.find("checkpoint.step") == f.metadata.end()) {
    throw Error(fmt::format("{}: not a training checkpoint (no 'checkpoint.step')", path));
  }
  TrainCheckpoint c;
  c.weights = redrafter_from_st(f, path);
  c.adam = make_adamw_state(c.weights);
  for (const char* which : {"m", "v"}) {
    ReDrafterWeights& dst = which[0] == 'm' ? c.adam.m : c.adam.v;
    for (ParamTensor& p : redrafter_param_tensors(dst)) {
      const std::string name = fmt::format("adam.{}.{}", which, p.name);
      const int64_t n = static_cast<int64_t>(p.data.size());
      const std::vector<float> values = f.require(path, name, std::span<const int64_t>(&n, 1)).to_f32();
      std::copy(values.begin(), values.end(), p.data.begin());
    }
  }
  c.step = meta_i64(f, path, "checkpoint.step");
  c.adam.t = meta_i64(f, path, "checkpoint.adam_t");
  c.epoch_rng = rng_from_string(f.require_meta(path, "checkpoint.rng"), path);
  c.config = f.require_meta(path, "checkpoint.config");
  c.elapsed_s = std::strtod(f.require_meta(path, "checkpoint.elapsed_s").c_str(), nullptr);
  return c;
}

}  // namespace specdec
