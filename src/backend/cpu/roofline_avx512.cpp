// AVX-512 loops for roofline.cpp: 24 independent zmm FMA / vpdpbusd chains (latency 4-5 cycles
// x 2 ports needs >= 10), and a 4-accumulator streaming read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "backend/cpu/roofline.h"

namespace specdec {
namespace detail {
namespace {

// The lanes' sum as a double. Not _mm512_reduce_add_epi32: GCC implements it with signed int
// additions, which overflow here (the sums only keep the loads alive and wrap by design) and are
// undefined behaviour (UBSan stops `specdec bench` there). The AVX2 loop sums the same way.
double lane_sum(__m512i v) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, v);
  double t = 0;
  for (int32_t x : lanes) t += x;
  return t;
}

}  // namespace

#define SPECDEC_REP24(X)                                                                       \
  X(0)                                                                                         \
  X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) \
      X(18) X(19) X(20) X(21) X(22) X(23)

double fma_loop_avx512(long iters, double* ops_per_iter) {
  *ops_per_iter = 24.0 * 16 * 2;
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + 0.001f * i);
  SPECDEC_REP24(DECL)
#undef DECL
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#define STEP(i) __asm__("vfmadd213ps %2, %1, %0" : "+v"(a##i) : "v"(m), "v"(c));
    SPECDEC_REP24(STEP)
#undef STEP
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, a##i);
  SPECDEC_REP24(SUM)
#undef SUM
  return _mm512_reduce_add_ps(s);
}

double int8_loop_avx512(long iters, double* ops_per_iter) {
  *ops_per_iter = 24.0 * 64 * 2;
#define DECL(i) __m512i a##i = _mm512_set1_epi32(i);
  SPECDEC_REP24(DECL)
#undef DECL
  const __m512i u = _mm512_set1_epi8(3), s8 = _mm512_set1_epi8(-2);
  for (long it = 0; it < iters; ++it) {
#define STEP(i) __asm__("vpdpbusd %2, %1, %0" : "+v"(a##i) : "v"(u), "v"(s8));
    SPECDEC_REP24(STEP)
#undef STEP
  }
  __m512i s = _mm512_setzero_si512();
#define SUM(i) s = _mm512_add_epi32(s, a##i);
  SPECDEC_REP24(SUM)
#undef SUM
  return lane_sum(s);
}

double read_sum_avx512(const void* data, long bytes) {
  const auto* p = static_cast<const __m512i*>(data);
  const long n = bytes / 64;
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = _mm512_add_epi32(s0, _mm512_load_si512(p + i));
    s1 = _mm512_add_epi32(s1, _mm512_load_si512(p + i + 1));
    s2 = _mm512_add_epi32(s2, _mm512_load_si512(p + i + 2));
    s3 = _mm512_add_epi32(s3, _mm512_load_si512(p + i + 3));
    s0 = _mm512_add_epi32(s0, _mm512_load_si512(p + i + 4));
    s1 = _mm512_add_epi32(s1, _mm512_load_si512(p + i + 5));
    s2 = _mm512_add_epi32(s2, _mm512_load_si512(p + i + 6));
    s3 = _mm512_add_epi32(s3, _mm512_load_si512(p + i + 7));
  }
  for (; i < n; ++i) s0 = _mm512_add_epi32(s0, _mm512_load_si512(p + i));
  const __m512i s = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
  return lane_sum(s);
}

}  // namespace detail
}  // namespace specdec
