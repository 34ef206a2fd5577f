// Element-wise ops of the CUDA backend (cuda_ops.h): rmsnorm, add, swiglu, rope. Each matches the
// CPU reference (backend/cpu/ops_ref.cpp) formula for formula - products and sums rounded
// separately where the CPU rounds them separately - so the results agree with the CPU to the
// last bit or within the ulps of the transcendental functions (expf, powf, sin, cos).
// (get_rows lives in cuda_matmul.cu, beside the dequantization it shares with matmul.)
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks < 1 ? 1 : blocks) : 65536);
}

// ---- rmsnorm: one thread block per row ------------------------------------------------------------
//
// Sum of squares in double (as the CPU reference), each thread over its strided elements, then
// a fixed tree over the threads; inv = float(1 / sqrt(sum / dim + eps)) in double; y = (x·inv)·w.
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const float* x, const float* __restrict__ weight, float eps, int64_t dim,
                   float* y) {
  __shared__ double partial[kThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const double v = static_cast<double>(xr[i]);
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + half]);
    }
    __syncthreads();
  }
  const double total = partial[0];
  const float inv = static_cast<float>(
      1.0 / sqrt(total / static_cast<double>(dim) + static_cast<double>(eps)));
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), weight[i]);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __fadd_rn(x[i], y[i]);
  }
}

__device__ __forceinline__ float swiglu_one(float g, float u) {
  // g / (1 + exp(-g)) * up, each step rounded as on the CPU.
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = swiglu_one(gate[i], up[i]);
  }
}

// gu: [n_rows, 2 ffn] (gate | up), out: [n_rows, ffn].
__global__ void swiglu_rows_kernel(const float* __restrict__ gu, int64_t n_rows, int64_t ffn,
                                   float* __restrict__ out) {
  const int64_t total = n_rows * ffn;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / ffn, c = i % ffn;
    const float* row = gu + r * 2 * ffn;
    out[i] = swiglu_one(row[c], row[ffn + c]);
  }
}

// ---- rope -------------------------------------------------------------------------------------------
//
// One thread per (token, pair i): the angle once, then every head. The CPU computes
//   inv_freq_i = powf(base, -2.0f * i / rope_dim)   (float exponent, float pow)
//   theta = pos * freq_scale * inv_freq_i            (float, left to right)
//   c, s = cosf(theta), sinf(theta)
// inv_freq is computed on the host exactly as the CPU does (the same std::pow) and passed by
// value in the kernel's arguments (no upload, nothing to synchronize; graph-capturable), so
// theta has the CPU's bits. cos / sin come from double cos / sin rounded to float: the correctly
// rounded values, which glibc's cosf / sinf give too in all but rare cases (then 1 ulp apart).
// The rotation rounds each product, as rope_apply_ref does.
constexpr int kMaxRopePairs = 256;
struct RopeFreqs {
  float inv[kMaxRopePairs];
};

__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions, int64_t n_tokens,
                            int n_heads, int head_dim, int rope_dim, float freq_scale, int neox,
                            const RopeFreqs freqs) {
  const int n_pairs = rope_dim / 2;
  const int64_t total = n_tokens * n_pairs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / n_pairs;
    const int i = static_cast<int>(idx % n_pairs);
    const float pos = static_cast<float>(positions[t]);
    const float theta = __fmul_rn(__fmul_rn(pos, freq_scale), freqs.inv[i]);
    const float c = static_cast<float>(cos(static_cast<double>(theta)));
    const float s = static_cast<float>(sin(static_cast<double>(theta)));
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + n_pairs : 2 * i + 1;
    float* xt = x + t * n_heads * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* xh = xt + static_cast<int64_t>(h) * head_dim;
      const float x0 = xh[a], x1 = xh[b];
      xh[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
      xh[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
  }
}

}  // namespace

void rmsnorm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t dim,
             float* y) {
  if (n_rows < 0 || dim < 0) throw Error("cuda::rmsnorm: negative shape");
  if (n_rows == 0 || dim == 0) return;
  if (n_rows > 0x7fffffffLL) throw Error("cuda::rmsnorm: too many rows");
  rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, detail::stream()>>>(x, weight, eps,
                                                                                   dim, y);
  CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

void add(float* x, const float* y, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, detail::stream()>>>(x, y, n);
  CUDA_CHECK_LAUNCH("add_kernel");
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (n <= 0) return;
  swiglu_kernel<<<grid_for(n, kThreads), kThreads, 0, detail::stream()>>>(gate, up, n, out);
  CUDA_CHECK_LAUNCH("swiglu_kernel");
}

void swiglu_rows(const float* gu, int64_t n_rows, int64_t ffn, float* out) {
  if (n_rows <= 0 || ffn <= 0) return;
  swiglu_rows_kernel<<<grid_for(n_rows * ffn, kThreads), kThreads, 0, detail::stream()>>>(
      gu, n_rows, ffn, out);
  CUDA_CHECK_LAUNCH("swiglu_rows_kernel");
}

void rope(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
          int rope_dim, float freq_base, float freq_scale, RopeStyle style) {
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    throw Error("cuda::rope: rope_dim must be even and in (0, head_dim], got " +
                std::to_string(rope_dim));
  }
  if (rope_dim / 2 > kMaxRopePairs) {
    throw Error("cuda::rope: rope_dim " + std::to_string(rope_dim) + " above " +
                std::to_string(2 * kMaxRopePairs));
  }
  if (n_tokens <= 0 || n_heads <= 0) return;
  RopeFreqs freqs{};
  for (int i = 0; i < rope_dim / 2; ++i) {  // as rope_angles (ops_ref.cpp)
    freqs.inv[i] =
        std::pow(freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(rope_dim));
  }
  const int64_t total = n_tokens * (rope_dim / 2);
  rope_kernel<<<grid_for(total, 128), 128, 0, detail::stream()>>>(
      x, positions, n_tokens, n_heads, head_dim, rope_dim, freq_scale,
      style == RopeStyle::kNeox ? 1 : 0, freqs);
  CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace specdec::cuda
