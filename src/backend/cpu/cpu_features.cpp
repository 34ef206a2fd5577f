// CPU feature detection with cpuid/xgetbv, and the process-wide choice of kernel variant.
//
// A variant is usable only when the CPU has the instructions AND the OS saves the wider
// registers on context switch (XCR0): YMM state for AVX2, YMM + opmask + ZMM state for AVX-512.
// The *_avx2.cpp / *_avx512.cpp files are compiled with -mbmi2 as well, so BMI2 is required too.
#include "backend/cpu/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "util/check.h"

namespace specdec {
namespace {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C + BMI2, OS saves YMM
  bool avxvnni = false;  // the AVX2 set + AVX-VNNI (VEX vpdpbusd)
  bool avx512 = false;  // AVX-512 F/BW/VL/DQ/VNNI (+ the AVX2 set), OS saves ZMM and opmasks
};

uint64_t read_xcr0() {
  uint32_t eax = 0;
  uint32_t edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures query_cpu() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0 || a < 7) return f;
  const unsigned max_leaf = a;
  __get_cpuid(1, &a, &b, &c, &d);
  const bool fma = c & (1u << 12);
  const bool osxsave = c & (1u << 27);
  const bool avx = c & (1u << 28);
  const bool f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (max_leaf < 7) return f;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const bool avx2 = b & (1u << 5);
  const bool bmi2 = b & (1u << 8);
  const bool avx512f = b & (1u << 16);
  const bool avx512dq = b & (1u << 17);
  const bool avx512bw = b & (1u << 30);
  const bool avx512vl = b & (1u << 31);
  const bool avx512vnni = c & (1u << 11);
  f.avx2 = os_ymm && avx2 && fma && f16c && bmi2;
  __get_cpuid_count(7, 1, &a, &b, &c, &d);
  const bool avx_vnni = a & (1u << 4);  // CPUID.(EAX=7, ECX=1):EAX[4]
  f.avxvnni = f.avx2 && avx_vnni;
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  return f;
}

const CpuFeatures& cpu() {
  static const CpuFeatures features = query_cpu();
  return features;
}

Isa best_supported() {
  if (cpu().avx512) return Isa::kAvx512;
  if (cpu().avxvnni) return Isa::kAvxVnni;
  if (cpu().avx2) return Isa::kAvx2;
  return Isa::kScalar;
}

// -1 until the first active_isa() / set_isa().
std::atomic<int> g_active_isa{-1};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvxVnni:
      return "avxvnni";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return cpu().avx2;
    case Isa::kAvx512:
      return cpu().avx512;
    case Isa::kAvxVnni:
      return cpu().avxvnni;
  }
  return false;
}

Isa detect_isa() {
  const char* env = std::getenv("SPECDEC_ISA");
  if (env == nullptr || env[0] == '\0') return best_supported();
  Isa wanted;
  if (std::strcmp(env, "scalar") == 0) {
    wanted = Isa::kScalar;
  } else if (std::strcmp(env, "avx2") == 0) {
    wanted = Isa::kAvx2;
  } else if (std::strcmp(env, "avxvnni") == 0) {
    wanted = Isa::kAvxVnni;
  } else if (std::strcmp(env, "avx512") == 0) {
    wanted = Isa::kAvx512;
  } else {
    throw Error(std::string("SPECDEC_ISA=") + env + " is not one of scalar, avx2, avxvnni, avx512");
  }
  if (isa_supported(wanted)) return wanted;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    std::fprintf(stderr, "specdec: SPECDEC_ISA=%s is not supported by this CPU; using %s\n", env,
                 isa_name(best_supported()));
  }
  return best_supported();
}

Isa active_isa() {
  int v = g_active_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    int expected = -1;
    const int detected = static_cast<int>(detect_isa());
    g_active_isa.compare_exchange_strong(expected, detected, std::memory_order_relaxed);
    v = g_active_isa.load(std::memory_order_relaxed);
  }
  return static_cast<Isa>(v);
}

void set_isa(Isa isa) {
  if (!isa_supported(isa)) {
    throw Error(std::string("set_isa: ") + isa_name(isa) + " is not supported by this CPU");
  }
  g_active_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace specdec
