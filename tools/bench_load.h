// The load mode of `specdec bench` (--concurrency N / --num-requests N): many requests through
// the engine at once, as a serving benchmark sees them. See bench_load.cpp for the JSON shape.
#pragma once

#include <string>

#include "engine_options.h"
#include "spec_options.h"
#include "specdec/sampling_params.h"

namespace CLI {
class App;
}

namespace specdec::cli {

// The options only the load mode has (-1: not given).
struct LoadOptions {
  int concurrency = -1;    // requests in flight at once
  int num_requests = -1;   // requests per run
  double input_mean = -1;  // synthetic prompt tokens (default: -p)
  double input_stdev = 0;
  double output_mean = -1;  // synthetic output tokens (default: -n)
  double output_stdev = 0;
  int prefix_len = 0;  // synthetic tokens every request starts with
  std::string dump_outputs;
  EngineOptions engine;
};

void add_load_options(CLI::App* cmd, LoadOptions* o);
// Whether the options ask for the load mode (--concurrency or --num-requests given).
bool load_mode_requested(const LoadOptions& o);

// What the load mode shares with the other bench modes.
struct LoadBenchInput {
  std::string model;  // -m as given (resolved by the run)
  int threads = 0;
  std::string prompts_file;
  bool chat = false;
  SamplingParams sampling;
  int n_prompt = 512;  // default --input-mean
  int n_gen = 128;     // default --output-mean; the output length of --prompts requests
  int ctx_size = 4096;
  std::string kv_type = "f16";
  std::string device = "cpu";  // --device (validated)
  SpecOptions spec;
  int repeats = 1;  // plain/spec pairs of runs
  bool interleave = false;
  bool json = false;
};

// Runs the load benchmark and prints its report (text, or one JSON object) to stdout. Throws
// specdec::Error naming the option when a value is out of range.
void run_load_bench(const LoadOptions& o, const LoadBenchInput& in);

}  // namespace specdec::cli
