#include "cli_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "model/gguf.h"
#include "util/check.h"
#include "util/paths.h"

namespace specdec::cli {

std::string resolve_model_path(const std::string& flag_value, const char* option) {
  struct stat st;
  if (!flag_value.empty()) {
    // A known name (scripts/fetch-model.sh NAME) unless a file of that name is in the way.
    const std::string known = known_model_path(flag_value);
    if (::stat(flag_value.c_str(), &st) == 0) return flag_value;
    if (known.empty()) {
      // Said here, before anything is loaded or bound (serve would listen first otherwise).
      throw Error(fmt::format("{} {}: no such file (a GGUF model file, or a name that "
                              "scripts/fetch-model.sh knows)",
                              option, flag_value));
    }
    if (::stat(known.c_str(), &st) != 0) {
      throw Error(fmt::format(
          "model '{}' is not at {}; run scripts/fetch-model.sh {} to download it", flag_value,
          known, flag_value));
    }
    return known;
  }
  const std::string path = default_model_path();
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(fmt::format("the default model is not at {}; run scripts/setup.sh to download it "
                            "or pass -m PATH",
                            path));
  }
  return path;
}

std::unique_ptr<Model> load_model_with_progress(const std::string& path, bool quiet,
                                                Device device) {
  const auto t0 = std::chrono::steady_clock::now();
  if (device == Device::kCuda) {  // the weights are copied to the GPU while loading
    if (!quiet) fmt::print(stderr, "loading {} onto the GPU ...\n", path);
    std::unique_ptr<Model> model = Model::load(path, device);
    if (!quiet) {
      fmt::print(stderr, "loaded {} in {:.2f} s on {}\n{}\n", path, seconds_since(t0), gpu_name(),
                 model->config().summary());
    }
    return model;
  }
  if (!quiet) fmt::print(stderr, "loading {} ...\n", path);
  std::unique_ptr<Model> model = Model::load(path);
  // Touch every page of every tensor once, reporting progress.
  const auto& tensors = model->file().tensors();
  uint64_t total = 0, done = 0;
  for (const auto& t : tensors) total += t.nbytes;
  const long page = ::sysconf(_SC_PAGESIZE);
  volatile uint8_t sink = 0;
  int last_pct = -1;
  for (const auto& t : tensors) {
    for (uint64_t off = 0; off < t.nbytes; off += static_cast<uint64_t>(page)) sink = static_cast<uint8_t>(sink ^ t.data[off]);
    done += t.nbytes;
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (!quiet && pct / 10 != last_pct / 10) {
      fmt::print(stderr, "\rloading weights: {:3d}%", pct);
      last_pct = pct;
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet) {
    fmt::print(stderr, "\rloaded {} in {:.2f} s\n{}\n", path, secs, model->config().summary());
  }
  return model;
}

const CLI::Validator& finite_number() {
  static const CLI::Validator check(
      [](std::string& value) -> std::string {
        const char* begin = value.c_str();
        char* end = nullptr;
        const double v = std::strtod(begin, &end);
        if (end == begin || *end != '\0' || !std::isfinite(v)) {
          return "Value " + value + " is not a finite number";
        }
        return {};
      },
      "FINITE", "finite");
  return check;
}

void add_device_option(CLI::App* cmd, std::string* value) {
  cmd->add_option("--device", *value,
                  "Where the model runs: cpu, or cuda (an NVIDIA GPU; needs a build with "
                  "-DSPECDEC_CUDA=ON)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

Device device_from_option(const std::string& value) {
  const std::optional<Device> d = parse_device(value);
  if (!d) throw Error(fmt::format("--device: unknown device '{}' (cpu or cuda)", value));
  return *d;
}

void add_kv_type_option(CLI::App* cmd, std::string* value) {
  cmd->add_option("--kv-type", *value,
                  "KV cache element type: f16, f32, or q8_0 (int8 codes and a scale per head "
                  "row: 0.53x the bytes of f16, CPU only)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0"}))
      ->capture_default_str();
}

KvType kv_type_from_option(const std::string& value) {
  const std::optional<KvType> t = parse_kv_type(value);
  if (!t) throw Error(fmt::format("--kv-type: unknown type '{}' (f16, f32 or q8_0)", value));
  return *t;
}

}  // namespace specdec::cli
