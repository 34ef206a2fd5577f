// Run-time choice of the CPU kernel variant. One binary carries scalar, AVX2, AVX-VNNI and
// AVX-512 variants; detect_isa() picks the best the machine supports,
// SPECDEC_ISA=scalar|avx2|avxvnni|avx512 (or set_isa()) forces one, e.g. so tests can compare
// each variant with the scalar reference.
//
// AVX-VNNI (Intel Alder Lake and later client parts, Sapphire Rapids; AMD Zen 5) is the AVX2
// level plus the VEX-encoded vpdpbusd: it runs every AVX2 kernel except the int8 matmuls over
// packed weights, whose dot products it does with vpdpbusd (one instruction where AVX2 needs
// vpmaddubsw, vpmaddwd and adds). Same results bit for bit.
#pragma once

namespace specdec {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvxVnni = 3 };

// The 256-bit levels, which share the AVX2 kernels (AVX-VNNI replaces only the int8 dot products).
constexpr bool isa_avx2_class(Isa isa) {
  return isa == Isa::kAvx2 || isa == Isa::kAvxVnni;
}

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);  // kAvx2: AVX2+FMA+F16C+BMI2; kAvxVnni: + AVX-VNNI;
                              // kAvx512: F+BW+VL+DQ+VNNI
Isa detect_isa();             // best supported, or SPECDEC_ISA if set and supported
Isa active_isa();             // what the kernels dispatch on now
void set_isa(Isa isa);        // must be supported; not thread-safe against running kernels

}  // namespace specdec
