// The packed-weight matmul of matmul_packed_avx2.cpp compiled for AVX-VNNI (-mavxvnni): the same
// source with its int8 dot products done by vpdpbusd (see that file's head). One source, so the
// two levels cannot drift apart; the tests compare both with the scalar reference bit for bit.
#define SPECDEC_PACKED_VNNI 1
#include "backend/cpu/matmul_packed_avx2.cpp"  // NOLINT(bugprone-suspicious-include)
