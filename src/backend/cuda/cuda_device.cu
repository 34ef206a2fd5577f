// Device, stream and memory of the CUDA backend (cuda_ops.h).
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda {
namespace detail {

void throw_cuda_error(const char* call, cudaError_t err, const char* file, int line) {
  throw Error(std::string("CUDA: ") + call + " failed: " + cudaGetErrorString(err) + " (" + file +
              ":" + std::to_string(line) + ")");
}

cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t created = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    return created;
  }();
  return s;
}

void* StreamScratch::get(size_t bytes) {
  if (bytes > buf_.bytes()) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream(), &st));
    if (st != cudaStreamCaptureStatusNone) {
      throw Error(std::string("cuda::") + what_ + " of " + std::to_string(bytes) +
                  " bytes needed during a graph capture (run the shape once before capturing)");
    }
    CUDA_CHECK(cudaStreamSynchronize(stream()));  // the old buffer may still be in use
    buf_ = DeviceBuffer(std::max(bytes, min_bytes_));
  }
  return buf_.data();
}

}  // namespace detail

using detail::stream;

bool available() {
  static const bool ok = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-less error state
      return false;
    }
    return count > 0;
  }();
  return ok;
}

DeviceInfo device_info() {
  if (!available()) throw Error("CUDA: no device available");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  DeviceInfo info;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.total_bytes = static_cast<int64_t>(total_b);
  info.free_bytes = static_cast<int64_t>(free_b);
  return info;
}

double measure_bandwidth_gbs(int64_t bytes) {
  if (bytes <= 0) throw Error("measure_bandwidth_gbs: bytes must be positive");
  DeviceBuffer src(static_cast<size_t>(bytes));
  DeviceBuffer dst(static_cast<size_t>(bytes));
  zero(src.data(), static_cast<size_t>(bytes));
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  try {
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes),
                               cudaMemcpyDeviceToDevice, stream()));  // warm-up
    for (int i = 0; i < 5; ++i) {
      CUDA_CHECK(cudaEventRecord(start, stream()));
      CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes),
                                 cudaMemcpyDeviceToDevice, stream()));
      CUDA_CHECK(cudaEventRecord(stop, stream()));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  const double median_s = static_cast<double>(ms[ms.size() / 2]) * 1e-3;
  return 2.0 * static_cast<double>(bytes) / median_s / 1e9;
}

void* alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!available()) throw Error("CUDA alloc: no device available");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    const bool have = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
    throw Error("CUDA alloc of " + std::to_string(bytes) + " bytes failed: " +
                cudaGetErrorString(err) +
                (have ? " (free " + std::to_string(free_b) + " of " + std::to_string(total_b) +
                            " bytes)"
                      : std::string()));
  }
  return p;
}

void release(void* p) {
  if (p == nullptr) return;
  // No throw (destructors call it): an error here is reported by the next checked call.
  (void)cudaFree(p);
}

void upload(void* dst_device, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst_device, src_host, bytes, cudaMemcpyHostToDevice, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void download(void* dst_host, const void* src_device, size_t bytes) {
  if (bytes == 0) {
    synchronize();
    return;
  }
  CUDA_CHECK(cudaMemcpyAsync(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void copy_device(void* dst_device, const void* src_device, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void zero(void* dst_device, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst_device, 0, bytes, stream()));
}

void synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec::cuda
