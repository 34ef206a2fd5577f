#include "calibration.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "util/check.h"
#include "util/paths.h"

namespace specdec::cli {

std::string default_calibration_path() {
  return cache_dir() + "/calibration.json";
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return {};
}

void write_calibration(const std::string& path, const Calibration& c) {
  nlohmann::json j;
  j["verify_cost_ratio"] = c.verify_cost_ratio;
  j["verify_token_cost"] = c.verify_token_cost;
  j["isa"] = c.isa;
  j["threads"] = c.threads;
  j["context"] = c.context;
  j["model"] = c.model;
  j["cpu"] = c.cpu;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw Error(fmt::format("cannot write the calibration file {}", tmp));
    out << j.dump(2) << "\n";
    if (!out) throw Error(fmt::format("cannot write the calibration file {}", tmp));
  }
  std::filesystem::rename(tmp, path);
}

std::optional<Calibration> read_calibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  Calibration c;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    c.verify_cost_ratio = j.at("verify_cost_ratio").get<double>();
    c.verify_token_cost = j.at("verify_token_cost").get<double>();
    c.isa = j.value("isa", "");
    c.threads = j.value("threads", 0);
    c.context = j.value("context", 0);
    c.model = j.value("model", "");
    c.cpu = j.value("cpu", "");
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("calibration file {} is malformed ({}); run `specdec bench "
                            "--calibrate` again or delete it",
                            path, e.what()));
  }
  if (!(c.verify_token_cost >= 0 && c.verify_token_cost < 10)) {
    throw Error(fmt::format("calibration file {}: verify_token_cost {} is out of range [0, 10)",
                            path, c.verify_token_cost));
  }
  return c;
}

std::string calibration_kernels(Device device) {
  return device == Device::kCuda ? "cuda" : isa_name(active_isa());
}

double calibrated_verify_token_cost(const std::string& file, double fallback, bool quiet,
                                    const std::string& kernels) {
  const bool explicit_file = !file.empty();
  const std::string path = explicit_file ? file : default_calibration_path();
  const std::optional<Calibration> cal = read_calibration(path);
  if (explicit_file && !cal) throw Error(fmt::format("--calibration: no file {}", path));
  if (cal && (explicit_file || cal->isa == kernels)) return cal->verify_token_cost;
  if (!quiet) {
    fmt::print(stderr,
               "note: no calibration for the {} kernels ({}); the cost model uses its default "
               "(verify_token_cost {:.3f}); run `specdec bench --calibrate` once\n",
               kernels, path, fallback);
  }
  return fallback;
}

}  // namespace specdec::cli
