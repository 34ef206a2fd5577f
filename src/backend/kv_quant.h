// The q8_0 KV cache's rows (KvType::kQ8): each (slot, KV head) row of head_dim floats x becomes
// int8 codes c and one float scale d with x ≈ d · c:
//   amax = max |x_i|,  d = amax / 127,  c_i = round-half-even(x_i · (127 / amax)) in [-127, 127]
// (amax = 0: d = 0 and every code 0). Like llama.cpp's q8_0 block, but one scale per head row
// (64 values for SmolLM2) rather than per 32, so a row is one run of codes and one scale.
// A row holding a NaN or an infinity stores d = NaN and codes 0, so attention over it gives NaN,
// as the f16 cache's would. Deterministic: the same bits on every x86-64 machine.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

namespace specdec {

// x: [n] floats -> codes: [n]; returns the scale d. Inline SSE (no libm calls: this runs for
// every new token's K and V rows of every layer).
inline float quantize_kv_row(const float* x, int64_t n, int8_t* codes) {
  float amax = 0.0f;
  bool bad = false;  // a NaN or an infinity
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    bad = bad || !(a <= FLT_MAX);
    amax = std::max(amax, a);
  }
  if (bad || amax == 0.0f) {
    std::fill_n(codes, n, int8_t{0});
    return bad ? NAN : 0.0f;
  }
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) {
    // cvtss2si rounds to nearest even (the default MXCSR mode); |x · inv| <= 127 (+ rounding).
    const int t = _mm_cvt_ss2si(_mm_set_ss(x[i] * inv));
    codes[i] = static_cast<int8_t>(std::clamp(t, -127, 127));
  }
  return amax / 127.0f;
}

// The value a code stands for: d · c (one rounding).
inline float dequantize_kv(int8_t code, float scale) {
  return scale * static_cast<float>(code);
}

}  // namespace specdec
