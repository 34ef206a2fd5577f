// AVX2 loops for roofline.cpp: 12 independent ymm FMA / vpmaddubsw (or AVX-VNNI vpdpbusd)
// chains, and a 4-accumulator streaming read.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/roofline.h"

namespace specdec {
namespace detail {

#define SPECDEC_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

double fma_loop_avx2(long iters, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 8 * 2;
#define DECL(i) __m256 a##i = _mm256_set1_ps(1.0f + 0.001f * i);
  SPECDEC_REP12(DECL)
#undef DECL
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#define STEP(i) __asm__("vfmadd213ps %2, %1, %0" : "+x"(a##i) : "x"(m), "x"(c));
    SPECDEC_REP12(STEP)
#undef STEP
  }
  __m256 s = _mm256_setzero_ps();
#define SUM(i) s = _mm256_add_ps(s, a##i);
  SPECDEC_REP12(SUM)
#undef SUM
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

// The int8 loops: 12 independent chains of one instruction that does 32 u8 x s8 products.
// AVX2: vpmaddubsw (pair sums into s16 lanes); AVX-VNNI: the VEX-encoded vpdpbusd (sums of four
// added into s32 lanes). The instruction is inline assembly, so this file needs no AVX-VNNI
// flag; the loop runs only where the CPU has it (roofline.cpp).
template <bool kVnni>
double int8_loop(long iters, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 32 * 2;
#define DECL(i) __m256i a##i = _mm256_set1_epi8(static_cast<char>(i + 1));
  SPECDEC_REP12(DECL)
#undef DECL
  const __m256i u8 = _mm256_set1_epi8(3), s8 = _mm256_set1_epi8(1);
  for (long it = 0; it < iters; ++it) {
    if constexpr (kVnni) {
#define STEP(i) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(a##i) : "x"(u8), "x"(s8));
      SPECDEC_REP12(STEP)
#undef STEP
    } else {
#define STEP(i) __asm__("vpmaddubsw %1, %0, %0" : "+x"(a##i) : "x"(s8));
      SPECDEC_REP12(STEP)
#undef STEP
    }
  }
  __m256i s = _mm256_setzero_si256();
#define SUM(i) s = _mm256_xor_si256(s, a##i);
  SPECDEC_REP12(SUM)
#undef SUM
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  double t = 0;
  for (int32_t v : out) t += v;
  return t;
}

double int8_loop_avx2(long iters, double* ops_per_iter) {
  return int8_loop<false>(iters, ops_per_iter);
}

double int8_loop_avxvnni(long iters, double* ops_per_iter) {
  return int8_loop<true>(iters, ops_per_iter);
}

double read_sum_avx2(const void* data, long bytes) {
  const auto* p = static_cast<const __m256i*>(data);
  const long n = bytes / 32;
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = _mm256_add_epi32(s0, _mm256_load_si256(p + i));
    s1 = _mm256_add_epi32(s1, _mm256_load_si256(p + i + 1));
    s2 = _mm256_add_epi32(s2, _mm256_load_si256(p + i + 2));
    s3 = _mm256_add_epi32(s3, _mm256_load_si256(p + i + 3));
    s0 = _mm256_add_epi32(s0, _mm256_load_si256(p + i + 4));
    s1 = _mm256_add_epi32(s1, _mm256_load_si256(p + i + 5));
    s2 = _mm256_add_epi32(s2, _mm256_load_si256(p + i + 6));
    s3 = _mm256_add_epi32(s3, _mm256_load_si256(p + i + 7));
  }
  for (; i < n; ++i) s0 = _mm256_add_epi32(s0, _mm256_load_si256(p + i));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3));
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  double t = 0;
  for (int32_t v : out) t += v;
  return t;
}

}  // namespace detail
}  // namespace specdec
