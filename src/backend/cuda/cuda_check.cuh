// Internal to the CUDA backend (and its tests / benchmarks): the error check of every CUDA call
// and the one stream of the process. Host code only (no device code), so .cpp files that link
// cudart may include it too (bench/cuda uses it for events and graph capture).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "backend/cuda/cuda_ops.h"  // DeviceBuffer
#include "util/check.h"

namespace specdec::cuda::detail {

// Throws specdec::Error: "<call> failed: <cudaGetErrorString> (<file>:<line>)".
[[noreturn]] void throw_cuda_error(const char* call, cudaError_t err, const char* file, int line);

// The one stream every op of the backend queues its work on: created (non-blocking) at first
// use, never destroyed (it lives as long as the process).
cudaStream_t stream();

// An op's device scratch on the stream (matmul's quantized activations, the split attention's
// tiles): get(bytes) grows it to at least max(bytes, min_bytes) - after waiting for the stream,
// since queued work may still use the old buffer - and never during a stream capture, where it
// throws "cuda::<what> of N bytes needed during a graph capture ...". Callers keep one for the
// process (never destroyed: no cudaFree after the runtime's teardown).
class StreamScratch {
 public:
  StreamScratch(const char* what, size_t min_bytes) : what_(what), min_bytes_(min_bytes) {}
  void* get(size_t bytes);

 private:
  const char* what_;
  size_t min_bytes_;
  DeviceBuffer buf_;
};

}  // namespace specdec::cuda::detail

#define CUDA_CHECK(call)                                                            \
  do {                                                                              \
    const cudaError_t specdec_cuda_err_ = (call);                                   \
    if (specdec_cuda_err_ != cudaSuccess) {                                         \
      ::specdec::cuda::detail::throw_cuda_error(#call, specdec_cuda_err_, __FILE__, \
                                                __LINE__);                          \
    }                                                                               \
  } while (0)

// After a kernel launch: a bad configuration shows here (the kernel's own faults show at the
// next synchronizing call).
#define CUDA_CHECK_LAUNCH(what) CUDA_CHECK(cudaGetLastError())
