// The machine constants of the engine's cost model, measured once by `specdec bench --calibrate`
// and read by every command that runs the engine, so that no policy ever reads a clock during a
// run (the same --seed gives the same output however busy the machine is).
//
// File (JSON): {"verify_cost_ratio": r8, "verify_token_cost": (r8 - 1) / 7, "isa": "avx512",
//               "threads": 2, "context": 512, "model": PATH, "cpu": "..."}
#pragma once

#include <optional>
#include <string>

#include "model/device.h"

namespace specdec::cli {

struct Calibration {
  double verify_cost_ratio = 0;  // a pass over 8 new tokens / a pass over 1
  double verify_token_cost = 0;  // cost of one more token in a pass, in one-token passes
  std::string isa;
  int threads = 0;
  int context = 0;
  std::string model;
  std::string cpu;
};

// $SPECDEC_CACHE/calibration.json (default ~/.cache/specdec/calibration.json).
std::string default_calibration_path();
// The CPU's model name (/proc/cpuinfo), "" when unknown.
std::string cpu_model_name();

void write_calibration(const std::string& path, const Calibration& c);

// The kernels a calibration is measured with: "cuda" on the GPU, else the CPU's ISA path
// ("avx512", "avx2", "scalar"): a GPU pass and a CPU pass cost differently.
std::string calibration_kernels(Device device);
// The cost model's verify_token_cost for this run: from `file` (an error if it does not exist),
// or, with file empty, from the default file when it was measured with `kernels`
// (calibration_kernels); otherwise `fallback` (with a note on stderr unless quiet).
double calibrated_verify_token_cost(const std::string& file, double fallback, bool quiet,
                                    const std::string& kernels);
// nullopt when the file does not exist; specdec::Error naming the file when it is malformed.
std::optional<Calibration> read_calibration(const std::string& path);

}  // namespace specdec::cli
