// Where a model runs: the CPU (always built) or an NVIDIA GPU (built with -DSPECDEC_CUDA=ON).
#pragma once

#include <optional>
#include <string>

namespace specdec {

enum class Device { kCpu, kCuda };

// "cpu" | "cuda" (nullopt otherwise).
std::optional<Device> parse_device(const std::string& name);
const char* device_name(Device device);  // "cpu" | "cuda"

// True when this build has the CUDA backend (a GPU may still be missing: cuda_available()).
bool cuda_built();
// True when the CUDA backend is built and a device answers (never throws).
bool cuda_available();

// The GPU's name and its measured device-memory bandwidth (GB/s, cuda::measure_bandwidth_gbs);
// both throw specdec::Error without a CUDA build or device.
std::string gpu_name();
double gpu_bandwidth_gbs();

}  // namespace specdec
