// The q8_0 KV cache's rows (KvType::kQ8): each (slot, KV head) row of head_dim floats x becomes
// int8 codes c and one float scale d with x ≈ d · c:
//   amax = max |x_i|,  d = amax / 127,  c_i = round-half-even(x_i · (127 / amax)) in [-127, 127]
// (amax = 0: d = 0 and every code 0). Like llama.cpp's q8_0 block, but one scale per head row
// (64 values for SmolLM2) rather than per 32, so a row is one run of codes and one scale.
// A row holding a NaN or an infinity stores d = NaN and codes 0, so attention over it gives NaN,
// as the f16 cache's would. Deterministic: the same bits on every x86-64 machine.
#pragma once

#include <emmintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace specdec {

// x: [n] floats -> codes: [n]; returns the scale d. SSE2, 4 values at a time (no libm calls:
// this runs for every new token's K and V head rows of every layer); the same bits as one value
// at a time (maxps is exact, cvtps2dq rounds each lane as cvtss2si does).
inline float quantize_kv_row(const float* x, int64_t n, int8_t* codes) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128 amax4 = _mm_setzero_ps();
  __m128 bad4 = _mm_setzero_ps();  // lanes that saw a NaN or an infinity
  const __m128 big = _mm_set1_ps(FLT_MAX);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 a = _mm_and_ps(_mm_loadu_ps(x + i), abs_mask);
    bad4 = _mm_or_ps(bad4, _mm_cmpnle_ps(a, big));  // NaN or > FLT_MAX: not (a <= FLT_MAX)
    amax4 = _mm_max_ps(amax4, a);
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, amax4);
  float amax = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  bool bad = _mm_movemask_ps(bad4) != 0;
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    bad = bad || !(a <= FLT_MAX);
    amax = std::max(amax, a);
  }
  if (bad || amax == 0.0f) {
    std::fill_n(codes, n, int8_t{0});
    return bad ? NAN : 0.0f;
  }
  const float inv = 127.0f / amax;
  const __m128 inv4 = _mm_set1_ps(inv);
  i = 0;
  for (; i + 4 <= n; i += 4) {
    // |x · inv| <= 127 (+ rounding): the int32 -> int16 -> int8 packs do not saturate.
    const __m128i t = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i), inv4));
    const __m128i b = _mm_packs_epi16(_mm_packs_epi32(t, t), _mm_setzero_si128());
    const int32_t four = _mm_cvtsi128_si32(b);
    std::memcpy(codes + i, &four, 4);
  }
  for (; i < n; ++i) {
    // cvtss2si rounds to nearest even (the default MXCSR mode).
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
