#include "calibration.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "engine/pass_cost.h"
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

namespace {

nlohmann::json to_json(const Calibration& c) {
  return nlohmann::json{{"verify_cost_ratio", c.verify_cost_ratio},
                        {"verify_token_cost", c.verify_token_cost},
                        {"pass_cost", c.pass_cost},
                        {"isa", c.isa},
                        {"threads", c.threads},
                        {"context", c.context},
                        {"model", c.model},
                        {"cpu", c.cpu}};
}

Calibration from_json(const nlohmann::json& j, const std::string& path) {
  Calibration c;
  c.verify_cost_ratio = j.at("verify_cost_ratio").get<double>();
  c.verify_token_cost = j.at("verify_token_cost").get<double>();
  c.isa = j.value("isa", "");
  c.threads = j.value("threads", 0);
  c.context = j.value("context", 0);
  c.model = j.value("model", "");
  c.cpu = j.value("cpu", "");
  if (!(c.verify_token_cost >= 0 && c.verify_token_cost < 10)) {
    throw Error(fmt::format("calibration file {}: verify_token_cost {} is out of range [0, 10)",
                            path, c.verify_token_cost));
  }
  if (j.contains("pass_cost")) {
    c.pass_cost = j.at("pass_cost").get<std::vector<std::pair<int, double>>>();
    const bool sane = std::all_of(c.pass_cost.begin(), c.pass_cost.end(),
                                  [](const std::pair<int, double>& p) { return p.second < 1000.0; });
    if (!c.pass_cost.empty() && (!pass_cost_curve_valid(c.pass_cost) || !sane)) {
      throw Error(fmt::format("calibration file {}: pass_cost must rise from [1, 1] with n; "
                              "run `specdec bench --calibrate` again",
                              path));
    }
  }
  return c;
}

// The model file's name: entries are per model file, wherever it lies.
std::string model_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace

std::vector<Calibration> read_calibrations(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::vector<Calibration> out;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.is_object() && j.contains("calibrations")) {
      for (const nlohmann::json& e : j.at("calibrations")) out.push_back(from_json(e, path));
    } else {
      out.push_back(from_json(j, path));  // one bare entry: the format before
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("calibration file {} is malformed ({}); run `specdec bench "
                            "--calibrate` again or delete it",
                            path, e.what()));
  }
  return out;
}

void write_calibration(const std::string& path, const Calibration& c) {
  std::vector<Calibration> entries = read_calibrations(path);
  std::erase_if(entries, [&](const Calibration& e) {
    return e.isa == c.isa && model_name(e.model) == model_name(c.model);
  });
  entries.push_back(c);
  nlohmann::json j;
  j["calibrations"] = nlohmann::json::array();
  for (const Calibration& e : entries) j["calibrations"].push_back(to_json(e));
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw Error(fmt::format("cannot write the calibration file {}", tmp));
    out << j.dump(2) << "\n";
    if (!out) throw Error(fmt::format("cannot write the calibration file {}", tmp));
  }
  std::filesystem::rename(tmp, path);
}

std::string calibration_kernels(Device device) {
  return device == Device::kCuda ? "cuda" : isa_name(active_isa());
}

namespace {

// The entry for the model file name and kernels, from `file` (an error if it does not exist; an
// explicit file with no such entry gives its entry for those kernels, then its first) or, with
// file empty, from the default file; nullopt when there is none.
std::optional<Calibration> pick_calibration(const std::string& file, const std::string& kernels,
                                            const std::string& model_path) {
  const bool explicit_file = !file.empty();
  const std::string path = explicit_file ? file : default_calibration_path();
  const std::vector<Calibration> entries = read_calibrations(path);
  if (explicit_file && entries.empty()) throw Error(fmt::format("--calibration: no file {}", path));
  const std::string name = model_name(model_path);
  const Calibration* pick = nullptr;
  for (const Calibration& e : entries) {
    if (e.isa == kernels && model_name(e.model) == name) pick = &e;
  }
  if (!pick && explicit_file) {
    for (const Calibration& e : entries) {
      if (!pick && e.isa == kernels) pick = &e;
    }
    if (!pick) pick = &entries.front();
  }
  if (!pick) return std::nullopt;
  return *pick;
}

}  // namespace

std::vector<std::pair<int, double>> calibrated_pass_cost(const std::string& file,
                                                         const std::string& kernels,
                                                         const std::string& model_path) {
  const std::optional<Calibration> pick = pick_calibration(file, kernels, model_path);
  return pick ? pick->pass_cost : std::vector<std::pair<int, double>>{};
}

double calibrated_verify_token_cost(const std::string& file, double fallback, bool quiet,
                                    const std::string& kernels, const std::string& model_path) {
  const std::optional<Calibration> pick = pick_calibration(file, kernels, model_path);
  if (pick) return pick->verify_token_cost;
  const std::string path = file.empty() ? default_calibration_path() : file;
  const std::string name = model_name(model_path);
  if (!quiet) {
    fmt::print(stderr,
               "note: no calibration for {} with the {} kernels ({}); the cost model uses its "
               "default (verify_token_cost {:.3f}); run `specdec bench --calibrate -m {}` once\n",
               name, kernels, path, fallback, model_path);
  }
  return fallback;
}

}  // namespace specdec::cli
