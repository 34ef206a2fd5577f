// Pieces shared by the specdec sub-commands.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "backend/kv_type.h"
#include "model/device.h"
#include "model/gguf.h"
#include "model/model.h"
#include "util/thread_count.h"  // compute_threads: -t N, capped at the cores

namespace CLI {
class App;
class Validator;
}

namespace specdec::cli {

// -m PATH (or a name scripts/fetch-model.sh knows, e.g. qwen2.5-coder-0.5b: its file in the
// cache, with a hint to run the script when missing), or the default model from the setup cache
// (with a hint to run setup when missing) when the flag is empty. A path that does not exist is
// a specdec::Error naming `option`.
std::string resolve_model_path(const std::string& flag_value, const char* option = "-m");

// Loads the model, printing progress to stderr (mapping, then touching every weight page so
// that the first token does not pay for page faults); on Device::kCuda the weights go to the GPU.
std::unique_ptr<Model> load_model_with_progress(const std::string& path, bool quiet,
                                                Device device = Device::kCpu);

// A check for floating-point options: the value must be a finite number. (CLI::Range,
// CLI::PositiveNumber and CLI::NonNegativeNumber compare with < and >, which NaN passes.)
const CLI::Validator& finite_number();

// --device cpu|cuda on `cmd` into *value (default cpu).
void add_device_option(CLI::App* cmd, std::string* value);
// The Device of a --device value (specdec::Error naming the option for another value).
Device device_from_option(const std::string& value);

// --kv-type f16|f32 on `cmd` into *value (the default, f16, is llama.cpp's cache type).
void add_kv_type_option(CLI::App* cmd, std::string* value);
// The KvType of a validated --kv-type value.
KvType kv_type_from_option(const std::string& value);

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace specdec::cli
