// The options of every command that runs the engine (generate, bench, serve): KV pool, prefix
// cache, step budget; and how the speculation options become a request's SpecParams.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/device.h"
#include "spec_options.h"
#include "specdec/engine.h"

namespace CLI {
class App;
}

namespace specdec::cli {

struct EngineOptions {
  int64_t kv_cache_mib = 256;
  int block_size = 16;
  bool no_prefix_cache = false;
  int max_batch_tokens = 512;
  int max_prefill_tokens_decoding = 0;  // 0: from the cost model, -1: no limit
  int max_seqs = 64;
  std::string calibration;  // cost-model constants (bench --calibrate); "": the default file
};

void add_engine_options(CLI::App* cmd, EngineOptions* o);

// The engine's configuration; kv_type already validated ("f16" / "f32"), max_context the
// context per sequence (0: the model's). The cost model's constants come from --calibration or
// the default calibration file, the target's entry measured with the kernels in use (those of
// `device`: calibration_kernels); otherwise the built-in default (a note on stderr unless quiet).
EngineConfig make_engine_config(const EngineOptions& o, const std::string& kv_type,
                                int64_t max_context, const Model& target, Model* draft_model,
                                bool quiet = false, Device device = Device::kCpu);

// A request's speculation from the CLI options (validated: specdec::Error naming the option);
// *description says what it is, e.g. "ngram (n 1..4, chain, adaptive <= 8)".
SpecParams make_spec_params(const SpecOptions& o, std::string* description);
// The draft model of --spec draft (null otherwise), on `device` (the target's).
std::unique_ptr<Model> load_draft_model(const SpecOptions& o, bool quiet,
                                        Device device = Device::kCpu);

}  // namespace specdec::cli
