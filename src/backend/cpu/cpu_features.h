// Run-time choice of the CPU kernel variant. One binary carries scalar, AVX2 and AVX-512
// variants; detect_isa() picks the best the machine supports, SPECDEC_ISA=scalar|avx2|avx512
// (or set_isa()) forces one, e.g. so tests can compare each variant with the scalar reference.
#pragma once

namespace specdec {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);  // kAvx2: AVX2+FMA+F16C; kAvx512: F+BW+VL+DQ+VNNI
Isa detect_isa();             // best supported, or SPECDEC_ISA if set and supported
Isa active_isa();             // what the kernels dispatch on now
void set_isa(Isa isa);        // must be supported; not thread-safe against running kernels

}  // namespace specdec
