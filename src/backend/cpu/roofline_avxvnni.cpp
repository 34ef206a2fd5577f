// The AVX-VNNI int8 loop for roofline.cpp: 12 independent ymm vpdpbusd chains (the int8 peak of
// the AVX-VNNI level, which the packed matmul kernels run at; fma and read are AVX2's).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/roofline.h"

namespace specdec {
namespace detail {

#define SPECDEC_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// vpdpbusd: 32 u8 x s8 products per instruction, summed in fours into s32 lanes.
double int8_loop_avxvnni(long iters, double* ops_per_iter) {
  *ops_per_iter = 12.0 * 32 * 2;
#define DECL(i) __m256i a##i = _mm256_set1_epi32(i);
  SPECDEC_REP12(DECL)
#undef DECL
  const __m256i u = _mm256_set1_epi8(3), s8 = _mm256_set1_epi8(-2);
  for (long it = 0; it < iters; ++it) {
#define STEP(i) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(a##i) : "x"(u), "x"(s8));
    SPECDEC_REP12(STEP)
#undef STEP
  }
  __m256i s = _mm256_setzero_si256();
#define SUM(i) s = _mm256_add_epi32(s, a##i);
  SPECDEC_REP12(SUM)
#undef SUM
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  double t = 0;
  for (int32_t v : out) t += v;
  return t;
}

}  // namespace detail
}  // namespace specdec
