// Element-wise ops of the CUDA backend (cuda_ops.h): rmsnorm, add, swiglu, rope. Each matches the
// CPU reference (backend/cpu/ops_ref.cpp) formula for formula - products and sums rounded
// separately where the CPU rounds them separately - so the results agree with the CPU to the
// last bit or within the ulps of the transcendental functions (expf, powf, sin, cos).
// (get_rows lives in cuda_matmul.cu, beside the dequantization it shares with matmul.)
//
// The fused ops of the forward pass live here too, beside the kernels whose bits they repeat
// (they share the device functions, so they cannot drift apart): add_rmsnorm (add, then
// rmsnorm) and rope_qkv / rope_qkv_kv_write (rope of q and k, the copy of v, and kv_write).
#include <cuda_fp16.h>

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
// The one step of a thread's sum of squares (element x).
__device__ __forceinline__ double add_square(double sum, float x) {
  const double v = static_cast<double>(x);
  return __dadd_rn(sum, __dmul_rn(v, v));
}

// The fixed tree over the threads' sums, then inv = float(1 / sqrt(total / dim + eps)).
__device__ __forceinline__ float rms_inverse(double (&partial)[kThreads], double sum, int64_t dim,
                                             float eps) {
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + half]);
    }
    __syncthreads();
  }
  const double total = partial[0];
  return static_cast<float>(1.0 / sqrt(total / static_cast<double>(dim) + static_cast<double>(eps)));
}

__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const float* x, const float* __restrict__ weight, float eps, int64_t dim,
                   float* y) {
  __shared__ double partial[kThreads];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) sum = add_square(sum, xr[i]);
  const float inv = rms_inverse(partial, sum, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), weight[i]);
  }
}

// add then rmsnorm: x[r] += y[r] (each sum rounded as add_kernel rounds it), out[r] =
// rmsnorm(x[r]) * weight - the same threads, elements, order and tree as rmsnorm_kernel, so the
// bits of add() followed by rmsnorm(). Thread i re-reads only the elements it wrote itself.
__global__ void __launch_bounds__(kThreads)
    add_rmsnorm_kernel(float* x, const float* __restrict__ y, const float* __restrict__ weight,
                       float eps, int64_t dim, float* __restrict__ out) {
  __shared__ double partial[kThreads];
  const int64_t r = blockIdx.x;
  float* xr = x + r * dim;
  const float* yr = y + r * dim;
  float* outr = out + r * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = __fadd_rn(xr[i], yr[i]);
    xr[i] = v;
    sum = add_square(sum, v);
  }
  const float inv = rms_inverse(partial, sum, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    outr[i] = __fmul_rn(__fmul_rn(xr[i], inv), weight[i]);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __fadd_rn(x[i], y[i]);
  }
}

// y: [n_rows] rows of `stride` floats; the first cols get bias added (rounded as add_kernel).
__global__ void add_bias_rows_kernel(float* y, int64_t stride, const float* __restrict__ bias,
                                     int64_t n_rows, int64_t cols) {
  const int64_t total = n_rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    y[r * stride + c] = __fadd_rn(y[r * stride + c], bias[c]);
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

// cos / sin of pair i's angle at position `position` (the only place they are computed).
__device__ __forceinline__ void rope_cos_sin(int32_t position, float freq_scale, float inv_freq,
                                             float* c, float* s) {
  const float pos = static_cast<float>(position);
  const float theta = __fmul_rn(__fmul_rn(pos, freq_scale), inv_freq);
  *c = static_cast<float>(cos(static_cast<double>(theta)));
  *s = static_cast<float>(sin(static_cast<double>(theta)));
}
// The rotated pair (x0, x1) -> (r0, r1), each product rounded.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float* r0,
                                            float* r1) {
  *r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *r1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions, int64_t n_tokens,
                            int n_heads, int head_dim, int rope_dim, float freq_scale, int neox,
                            const RopeFreqs freqs) {
  const int n_pairs = rope_dim / 2;
  const int64_t total = n_tokens * n_pairs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / n_pairs;
    const int i = static_cast<int>(idx % n_pairs);
    float c, s;
    rope_cos_sin(positions[t], freq_scale, freqs.inv[i], &c, &s);
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + n_pairs : 2 * i + 1;
    float* xt = x + t * n_heads * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* xh = xt + static_cast<int64_t>(h) * head_dim;
      const float x0 = xh[a], x1 = xh[b];
      rope_rotate(x0, x1, c, s, &xh[a], &xh[b]);
    }
  }
}

// ---- rope_qkv / rope_qkv_kv_write ------------------------------------------------------------------
//
// One launch for the attention's inputs: q (rotated) into q_out, k (rotated) and v into k_out /
// v_out - float rows t (kPhys false) or the KV cache's rows phys[t] in its type T (kPhys true:
// float or half, rounded to nearest even as kv_write). Work items of token t, one per thread:
//   [0, heads * n_pairs)                      pair i of head hh (q heads, then k heads)
//   [.., + heads * (head_dim - rope_dim))     a pass-through dim of a q / k head
//   [.., + kv_dim)                            an element of v
// (heads = n_heads + n_kv_heads). The angle of every rotated pair comes from rope_cos_sin and
// its values from rope_rotate, as in rope_kernel, so the bits of rope() (then kv_write()).
__device__ __forceinline__ float to_kv(float v, float*) { return v; }
// x + bias[i] rounded as add_bias_rows_kernel, or x without a bias.
__device__ __forceinline__ float biased(float x, const float* bias, int64_t i) {
  return bias != nullptr ? __fadd_rn(x, bias[i]) : x;
}
__device__ __forceinline__ __half to_kv(float v, __half*) { return __float2half_rn(v); }

template <class T, bool kPhys>
__global__ void __launch_bounds__(128)
    rope_qkv_kernel(const QkvSource src, const int32_t* __restrict__ positions,
                    const int64_t* __restrict__ phys, int64_t n_tokens, int n_heads,
                    int n_kv_heads, int head_dim, int rope_dim, float freq_scale, int neox,
                    const RopeFreqs freqs, float* __restrict__ q_out, T* __restrict__ k_out,
                    T* __restrict__ v_out) {
  const int n_pairs = rope_dim / 2;
  const int n_pass = head_dim - rope_dim;
  const int heads = n_heads + n_kv_heads;
  const int64_t q_dim = static_cast<int64_t>(n_heads) * head_dim;
  const int64_t kv_dim = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t n_rot = static_cast<int64_t>(heads) * n_pairs;
  const int64_t n_copy = static_cast<int64_t>(heads) * n_pass;
  const int64_t per_token = n_rot + n_copy + kv_dim;
  const int64_t total = n_tokens * per_token;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / per_token;
    int64_t j = idx - t * per_token;
    const int64_t kv_row = kPhys ? phys[t] : t;
    if (j < n_rot) {
      const int hh = static_cast<int>(j / n_pairs);
      const int i = static_cast<int>(j - static_cast<int64_t>(hh) * n_pairs);
      float c, s;
      rope_cos_sin(positions[t], freq_scale, freqs.inv[i], &c, &s);
      const int a = neox ? i : 2 * i;
      const int b = neox ? i + n_pairs : 2 * i + 1;
      float r0, r1;
      if (hh < n_heads) {
        const int64_t h0 = static_cast<int64_t>(hh) * head_dim;
        const float* xh = src.q + t * src.q_stride + h0;
        rope_rotate(biased(xh[a], src.q_bias, h0 + a), biased(xh[b], src.q_bias, h0 + b), c, s,
                    &r0, &r1);
        float* o = q_out + t * q_dim + static_cast<int64_t>(hh) * head_dim;
        o[a] = r0;
        o[b] = r1;
      } else {
        const int kh = hh - n_heads;
        const int64_t h0 = static_cast<int64_t>(kh) * head_dim;
        const float* xh = src.k + t * src.k_stride + h0;
        rope_rotate(biased(xh[a], src.k_bias, h0 + a), biased(xh[b], src.k_bias, h0 + b), c, s,
                    &r0, &r1);
        T* o = k_out + kv_row * kv_dim + static_cast<int64_t>(kh) * head_dim;
        o[a] = to_kv(r0, o);
        o[b] = to_kv(r1, o);
      }
      continue;
    }
    j -= n_rot;
    if (j < n_copy) {
      const int hh = static_cast<int>(j / n_pass);
      const int d = rope_dim + static_cast<int>(j - static_cast<int64_t>(hh) * n_pass);
      if (hh < n_heads) {
        const int64_t at = static_cast<int64_t>(hh) * head_dim + d;
        q_out[t * q_dim + at] = biased(src.q[t * src.q_stride + at], src.q_bias, at);
      } else {
        const int64_t at = static_cast<int64_t>(hh - n_heads) * head_dim + d;
        T* o = k_out + kv_row * kv_dim + at;
        *o = to_kv(biased(src.k[t * src.k_stride + at], src.k_bias, at), o);
      }
      continue;
    }
    j -= n_copy;
    T* o = v_out + kv_row * kv_dim + j;
    *o = to_kv(biased(src.v[t * src.v_stride + j], src.v_bias, j), o);
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

void add_bias_rows(float* y, int64_t stride, const float* bias, int64_t n_rows, int64_t cols) {
  if (n_rows < 0 || cols < 0 || stride < cols) throw Error("cuda::add_bias_rows: bad shape");
  if (n_rows == 0 || cols == 0) return;
  add_bias_rows_kernel<<<grid_for(n_rows * cols, kThreads), kThreads, 0, detail::stream()>>>(
      y, stride, bias, n_rows, cols);
  CUDA_CHECK_LAUNCH("add_bias_rows_kernel");
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (n <= 0) return;
  swiglu_kernel<<<grid_for(n, kThreads), kThreads, 0, detail::stream()>>>(gate, up, n, out);
  CUDA_CHECK_LAUNCH("swiglu_kernel");
}

namespace {

// silu(v) = v / (1 + exp(-v)), each step rounded as the CPU's drafter heads round it.
__device__ __forceinline__ float silu_one(float v) {
  return __fdiv_rn(v, __fadd_rn(1.0f, expf(-v)));
}

// s_pre, s_out: [n, S]; b: [S]; h: [dim]; x: [n, dim + S].
__global__ void redrafter_state_kernel(const float* __restrict__ s_pre, const float* __restrict__ b,
                                       const float* __restrict__ h, int64_t n, int64_t dim,
                                       int64_t state, float* __restrict__ s_out,
                                       float* __restrict__ x) {
  const int64_t width = dim + state;
  const int64_t total = n * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    if (c < dim) {
      x[i] = h[c];
    } else {
      const float v = silu_one(__fadd_rn(s_pre[r * state + (c - dim)], b[c - dim]));
      s_out[r * state + (c - dim)] = v;
      x[i] = v;
    }
  }
}

// x, y: [n, d]; b: [d].
__global__ void bias_silu_residual_kernel(float* __restrict__ x, const float* __restrict__ y,
                                          const float* __restrict__ b, int64_t n, int64_t d) {
  const int64_t total = n * d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __fadd_rn(x[i], silu_one(__fadd_rn(y[i], b[i % d])));
  }
}

}  // namespace

void redrafter_state(const float* s_pre, const float* b, const float* h, int64_t n, int64_t dim,
                     int64_t state, float* s_out, float* x) {
  if (n <= 0) return;
  redrafter_state_kernel<<<grid_for(n * (dim + state), kThreads), kThreads, 0,
                           detail::stream()>>>(s_pre, b, h, n, dim, state, s_out, x);
  CUDA_CHECK_LAUNCH("redrafter_state_kernel");
}

void bias_silu_residual(float* x, const float* y, const float* b, int64_t n, int64_t d) {
  if (n <= 0 || d <= 0) return;
  bias_silu_residual_kernel<<<grid_for(n * d, kThreads), kThreads, 0, detail::stream()>>>(
      x, y, b, n, d);
  CUDA_CHECK_LAUNCH("bias_silu_residual_kernel");
}

void swiglu_rows(const float* gu, int64_t n_rows, int64_t ffn, float* out) {
  if (n_rows <= 0 || ffn <= 0) return;
  swiglu_rows_kernel<<<grid_for(n_rows * ffn, kThreads), kThreads, 0, detail::stream()>>>(
      gu, n_rows, ffn, out);
  CUDA_CHECK_LAUNCH("swiglu_rows_kernel");
}

namespace {

void check_rope(const char* op, int head_dim, int rope_dim) {
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    throw Error(std::string("cuda::") + op + ": rope_dim must be even and in (0, head_dim], got " +
                std::to_string(rope_dim));
  }
  if (rope_dim / 2 > kMaxRopePairs) {
    throw Error(std::string("cuda::") + op + ": rope_dim " + std::to_string(rope_dim) +
                " above " + std::to_string(2 * kMaxRopePairs));
  }
}

RopeFreqs rope_freqs(int rope_dim, float freq_base) {
  RopeFreqs freqs{};
  for (int i = 0; i < rope_dim / 2; ++i) {  // as rope_angles (ops_ref.cpp)
    freqs.inv[i] =
        std::pow(freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(rope_dim));
  }
  return freqs;
}

}  // namespace

void rope(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
          int rope_dim, float freq_base, float freq_scale, RopeStyle style) {
  check_rope("rope", head_dim, rope_dim);
  if (n_tokens <= 0 || n_heads <= 0) return;
  const RopeFreqs freqs = rope_freqs(rope_dim, freq_base);
  const int64_t total = n_tokens * (rope_dim / 2);
  rope_kernel<<<grid_for(total, 128), 128, 0, detail::stream()>>>(
      x, positions, n_tokens, n_heads, head_dim, rope_dim, freq_scale,
      style == RopeStyle::kNeox ? 1 : 0, freqs);
  CUDA_CHECK_LAUNCH("rope_kernel");
}

// ---- fused ops ------------------------------------------------------------------------------------

void add_rmsnorm(float* x, const float* y, const float* weight, float eps, int64_t n_rows,
                 int64_t dim, float* out) {
  if (n_rows < 0 || dim < 0) throw Error("cuda::add_rmsnorm: negative shape");
  if (n_rows == 0 || dim == 0) return;
  if (n_rows > 0x7fffffffLL) throw Error("cuda::add_rmsnorm: too many rows");
  if (out == x) throw Error("cuda::add_rmsnorm: out must not alias x");
  add_rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, detail::stream()>>>(
      x, y, weight, eps, dim, out);
  CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

void rope_qkv(const QkvSource& src, const int32_t* positions, int64_t n_tokens, int n_heads,
              int n_kv_heads, int head_dim, int rope_dim, float freq_base, float freq_scale,
              RopeStyle style, float* q_out, float* k_out, float* v_out) {
  check_rope("rope_qkv", head_dim, rope_dim);
  if (n_tokens <= 0) return;
  if (n_heads <= 0 || n_kv_heads <= 0) throw Error("cuda::rope_qkv: bad head counts");
  const int64_t per_token = static_cast<int64_t>(n_heads + n_kv_heads) * (head_dim - rope_dim / 2) +
                            static_cast<int64_t>(n_kv_heads) * head_dim;
  rope_qkv_kernel<float, false><<<grid_for(n_tokens * per_token, 128), 128, 0,
                                   detail::stream()>>>(
      src, positions, nullptr, n_tokens, n_heads, n_kv_heads, head_dim, rope_dim, freq_scale,
      style == RopeStyle::kNeox ? 1 : 0, rope_freqs(rope_dim, freq_base), q_out, k_out, v_out);
  CUDA_CHECK_LAUNCH("rope_qkv_kernel");
}

void rope_qkv_kv_write(const QkvSource& src, const int32_t* positions, const int64_t* phys_slots,
                       int64_t n_tokens, int n_heads, int rope_dim, float freq_base,
                       float freq_scale, RopeStyle style, const DeviceKvLayer& layer,
                       float* q_out) {
  if (layer.k == nullptr || layer.v == nullptr || layer.n_kv_heads <= 0 || layer.head_dim <= 0 ||
      layer.block_slots <= 0) {
    throw Error("cuda::rope_qkv_kv_write: bad KV layer");
  }
  check_rope("rope_qkv_kv_write", layer.head_dim, rope_dim);
  if (n_tokens <= 0) return;
  if (n_heads <= 0) throw Error("cuda::rope_qkv_kv_write: bad head count");
  const int head_dim = layer.head_dim, n_kv_heads = layer.n_kv_heads;
  const int64_t per_token = static_cast<int64_t>(n_heads + n_kv_heads) * (head_dim - rope_dim / 2) +
                            static_cast<int64_t>(n_kv_heads) * head_dim;
  const unsigned grid = grid_for(n_tokens * per_token, 128);
  const int neox = style == RopeStyle::kNeox ? 1 : 0;
  const RopeFreqs freqs = rope_freqs(rope_dim, freq_base);
  if (layer.type == KvType::kF16) {
    rope_qkv_kernel<__half, true><<<grid, 128, 0, detail::stream()>>>(
        src, positions, phys_slots, n_tokens, n_heads, n_kv_heads, head_dim, rope_dim, freq_scale,
        neox, freqs, q_out, static_cast<__half*>(layer.k), static_cast<__half*>(layer.v));
  } else {
    rope_qkv_kernel<float, true><<<grid, 128, 0, detail::stream()>>>(
        src, positions, phys_slots, n_tokens, n_heads, n_kv_heads, head_dim, rope_dim, freq_scale,
        neox, freqs, q_out, static_cast<float*>(layer.k), static_cast<float*>(layer.v));
  }
  CUDA_CHECK_LAUNCH("rope_qkv_kernel");
}

}  // namespace specdec::cuda
