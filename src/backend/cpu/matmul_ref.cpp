// The scalar reference matmul: the oracle every SIMD variant is compared with, bit for bit.
// It spells out the arithmetic documented in quant_kernels.h with no cleverness: one output at a
// time, sub-blocks decoded by decode_sub_block, products summed exactly in integers, floats
// combined with std::fma in the documented order.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace detail {

void quantize_activations_ref(const float* x, int64_t cols, int8_t* q, float* d, int32_t* s16) {
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    const float* xb = x + b * kActBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kActBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const bool nonzero = amax >= kMinActivationAmax;
    const float scale = nonzero ? amax / 127.0f : 0.0f;
    const float inv = nonzero ? 1.0f / scale : 0.0f;
    d[b] = scale;
    for (int64_t half = 0; half < 2; ++half) {
      int32_t sum = 0;
      for (int64_t j = 16 * half; j < 16 * half + 16; ++j) {
        const float v = std::nearbyint(xb[j] * inv);
        const int32_t qi = static_cast<int32_t>(std::fmin(std::fmax(v, -128.0f), 127.0f));
        q[b * kActBlock + j] = static_cast<int8_t>(qi);
        sum += qi;
      }
      s16[2 * b + half] = sum;
    }
  }
}

namespace {

float load_weight(GgmlType type, const uint8_t* row, int64_t k) {
  uint16_t h;
  switch (type) {
    case GgmlType::kF32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case GgmlType::kF16:
      std::memcpy(&h, row + 2 * k, 2);
      return fp16_to_fp32(h);
    default:  // kBF16
      std::memcpy(&h, row + 2 * k, 2);
      return bf16_to_fp32(h);
  }
}

void float_rows(const WeightMatrix& w, const float* x, int64_t n, float* y, int64_t r0,
                int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * w.cols;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc = std::fma(load_weight(w.type, row, k), xi[k], acc);
      y[i * w.rows + r] = acc;
    }
  }
}

struct QuantizedActivations {
  std::vector<int8_t> q;     // [n, cols]
  std::vector<float> d;      // [n, cols / 32]
  std::vector<int32_t> s16;  // [n, cols / 16]
};

void quantized_rows(const WeightMatrix& w, const QuantizedActivations& xq, int64_t n, float* y,
                    int64_t r0, int64_t r1) {
  const QuantLayout layout = quant_layout(w.type);
  const int64_t sub = layout.sub;
  const int64_t num_sub = w.cols / sub;
  std::vector<uint8_t> qw(static_cast<size_t>(w.cols));  // [cols] codes of one weight row
  std::vector<float> dw(static_cast<size_t>(num_sub));   // [num_sub]
  std::vector<float> mw(static_cast<size_t>(num_sub));   // [num_sub]
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
    for (int64_t b = 0; b < num_sub; ++b) {
      decode_sub_block(w.type, row, b, qw.data() + b * sub, &dw[b], &mw[b]);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int8_t* qx = xq.q.data() + i * w.cols;
      const float* dx = xq.d.data() + i * (w.cols / kActBlock);
      const int32_t* s16 = xq.s16.data() + i * (w.cols / 16);
      float acc[2] = {0.0f, 0.0f};
      for (int64_t b = 0; b < num_sub; ++b) {
        int32_t isum = 0;
        for (int64_t j = 0; j < sub; ++j) {
          const int64_t k = b * sub + j;
          isum += (static_cast<int32_t>(qw[k]) - layout.offset) * qx[k];
        }
        const float d_x = dx[b * sub / kActBlock];
        const float t = static_cast<float>(isum) * d_x;
        acc[b & 1] = std::fma(t, dw[b], acc[b & 1]);
        if (layout.has_min) {
          const int32_t s32 = s16[2 * b] + s16[2 * b + 1];  // has_min implies sub == 32
          acc[b & 1] = std::fma(mw[b], static_cast<float>(s32) * d_x, acc[b & 1]);
        }
      }
      y[i * w.rows + r] = acc[0] + acc[1];
    }
  }
}

}  // namespace

void matmul_ref(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  const QuantLayout layout = quant_layout(w.type);
  if (layout.sub == 0) {
    auto body = [&](int64_t r0, int64_t r1) { float_rows(w, x, n, y, r0, r1); };
    if (pool) {
      pool->parallel_for(w.rows, 1, body);
    } else {
      body(0, w.rows);
    }
    return;
  }
  QuantizedActivations xq;
  xq.q.resize(static_cast<size_t>(n * w.cols));
  xq.d.resize(static_cast<size_t>(n * (w.cols / kActBlock)));
  xq.s16.resize(static_cast<size_t>(n * (w.cols / 16)));
  for (int64_t i = 0; i < n; ++i) {
    quantize_activations_ref(x + i * w.cols, w.cols, xq.q.data() + i * w.cols,
                             xq.d.data() + i * (w.cols / kActBlock),
                             xq.s16.data() + i * (w.cols / 16));
  }
  auto body = [&](int64_t r0, int64_t r1) { quantized_rows(w, xq, n, y, r0, r1); };
  if (pool) {
    pool->parallel_for(w.rows, 1, body);
  } else {
    body(0, w.rows);
  }
}

}  // namespace detail
}  // namespace specdec
