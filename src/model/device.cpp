#include "model/device.h"

#include "util/check.h"

#ifdef SPECDEC_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace specdec {

std::optional<Device> parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return std::nullopt;
}

const char* device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

#ifdef SPECDEC_CUDA

bool cuda_built() { return true; }
bool cuda_available() { return cuda::available(); }

std::string gpu_name() {
  if (!cuda::available()) throw Error("no CUDA device");
  return cuda::device_info().name;
}

double gpu_bandwidth_gbs() {
  if (!cuda::available()) throw Error("no CUDA device");
  return cuda::measure_bandwidth_gbs();
}

#else

namespace {
[[noreturn]] void no_cuda() {
  throw Error("specdec was built without CUDA (cmake -DSPECDEC_CUDA=ON)");
}
}  // namespace

bool cuda_built() { return false; }
bool cuda_available() { return false; }
std::string gpu_name() { no_cuda(); }
double gpu_bandwidth_gbs() { no_cuda(); }

#endif

}  // namespace specdec
