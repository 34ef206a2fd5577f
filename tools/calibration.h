// The machine constants of the engine's cost model, measured once by `specdec bench --calibrate`
// and read by every command that runs the engine, so that no policy ever reads a clock during a
// run (the same --seed gives the same output however busy the machine is).
//
// File (JSON): {"calibrations": [{"verify_cost_ratio": r8, "verify_token_cost": (r8 - 1) / 7,
//               "pass_cost": [[1, 1], [2, r2], [4, r4], [8, r8], ...],
//               "isa": "avx512", "threads": 2, "context": 512, "model": PATH, "cpu": "..."},
//               ...]}: one entry per model (by file name) and kernels (pass_cost: the cost curve
//               of engine/pass_cost.h, absent in files written before it); `bench --calibrate`
// replaces its model's entry for its kernels and keeps the others. The cost of a token more in a
// pass depends on the model (an 8-token pass costs 2.1 one-token passes of SmolLM2-135M but 1.6
// of Qwen2.5-Coder-1.5B on the same AVX-512 machine), so a run takes only its own model's entry.
// A file holding one bare object (the format before) is read as one entry.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/device.h"

namespace specdec::cli {

struct Calibration {
  double verify_cost_ratio = 0;  // a pass over 8 new tokens / a pass over 1
  double verify_token_cost = 0;  // cost of one more token in a pass, in one-token passes
  // (n, a pass over n new tokens / a pass over 1), n ascending from (1, 1); empty: not measured.
  std::vector<std::pair<int, double>> pass_cost;
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

// Writes `c` into the file at `path`, replacing the entry of the same model file name and
// kernels and keeping the others (a malformed file is an error: nothing is written).
void write_calibration(const std::string& path, const Calibration& c);

// The kernels a calibration is measured with: "cuda" on the GPU, else the CPU's ISA path
// ("avx512", "avx2", "scalar"): a GPU pass and a CPU pass cost differently.
std::string calibration_kernels(Device device);
// The cost model's verify_token_cost for a run of the model at `model_path` with `kernels`
// (calibration_kernels): the entry for that model file name and those kernels, from `file` (an
// error if it does not exist; an explicit file with no such entry gives its entry for those
// kernels, then its first) or, with file empty, from the default file; otherwise `fallback`
// (with a note on stderr unless quiet).
double calibrated_verify_token_cost(const std::string& file, double fallback, bool quiet,
                                    const std::string& kernels, const std::string& model_path);
// The same entry's pass-cost curve (empty when there is no entry or it has none; no note).
std::vector<std::pair<int, double>> calibrated_pass_cost(const std::string& file,
                                                         const std::string& kernels,
                                                         const std::string& model_path);
// Every entry of the file; empty when the file does not exist; specdec::Error naming the file
// when it is malformed.
std::vector<Calibration> read_calibrations(const std::string& path);

}  // namespace specdec::cli
