// The cache-blocked loop nest of train_gemm (BLIS's five loops), shared by the per-ISA
// translation units: each includes this header and instantiates blocked_gemm_tile with its own
// micro-kernel. Everything here has internal linkage (an unnamed namespace), so the AVX2 and
// AVX-512 copies never merge at link time.
//
//   for jc in steps of NC            (columns of C)
//     for pc in steps of KC          (the reduction, in order)
//       pack B[pc.., jc..]   -> bp [NC / NR][KC][NR]  (zero columns past n)
//       for ic in steps of MC        (rows of C)
//         pack A[ic.., pc..] -> ap [MC / MR][KC][MR]  (zero rows past m)
//         for each NR panel, for each MR panel: micro-kernel on the MR x NR tile of C
//
// The micro-kernel continues each element's fma chain from C when pc > 0 (or accumulating),
// from zero otherwise; a float stored and reloaded is exact, so cutting k into KC pieces leaves
// the chain - and the bits - unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "drafter/train/train_gemm.h"
#include "util/check.h"

namespace specdec {
namespace detail {
namespace {

// A 64-byte aligned float buffer per thread and slot that only grows.
class GemmScratch {
 public:
  ~GemmScratch() { std::free(data_); }
  float* get(size_t n) {
    if (n > cap_) {
      std::free(data_);
      cap_ = (n + 15) / 16 * 16;
      data_ = static_cast<float*>(std::aligned_alloc(64, cap_ * sizeof(float)));
      SPECDEC_CHECK(data_ != nullptr, "out of memory for the GEMM's packed panels");
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t cap_ = 0;
};

// ap[kc][MR] = A(i0 + i, p0 + p) for i < rows (zeros for rows <= i < MR).
template <int MR>
void pack_a_panel(const MatView& a, int64_t i0, int rows, int64_t p0, int64_t kc, float* ap) {
  if (rows < MR) {
    for (int64_t p = 0; p < kc; ++p) {
      for (int i = rows; i < MR; ++i) ap[p * MR + i] = 0.0f;
    }
  }
  if (a.cs == 1) {  // row-major A: each row contiguous in p
    for (int i = 0; i < rows; ++i) {
      const float* src = a.data + (i0 + i) * a.rs + p0;
      for (int64_t p = 0; p < kc; ++p) ap[p * MR + i] = src[p];
    }
  } else if (a.rs == 1 && rows == MR) {  // transposed A: MR contiguous values per p
    for (int64_t p = 0; p < kc; ++p) {
      std::memcpy(ap + p * MR, a.data + (p0 + p) * a.cs + i0, MR * sizeof(float));
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = a.data + (p0 + p) * a.cs + i0 * a.rs;
      for (int i = 0; i < rows; ++i) ap[p * MR + i] = src[i * a.rs];
    }
  }
}

// bp[kc][NR] = B(p0 + p, j0 + j) for j < cols (zeros for cols <= j < NR).
template <int NR>
void pack_b_panel(const MatView& b, int64_t p0, int64_t kc, int64_t j0, int cols, float* bp) {
  if (b.cs == 1) {  // row-major B: NR contiguous values per p
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = b.data + (p0 + p) * b.rs + j0;
      float* dst = bp + p * NR;
      std::memcpy(dst, src, cols * sizeof(float));
      for (int j = cols; j < NR; ++j) dst[j] = 0.0f;
    }
    return;
  }
  if (cols < NR) {
    for (int64_t p = 0; p < kc; ++p) {
      for (int j = cols; j < NR; ++j) bp[p * NR + j] = 0.0f;
    }
  }
  if (b.rs == 1) {  // transposed B (Wᵀ): each column contiguous in p
    for (int j = 0; j < cols; ++j) {
      const float* src = b.data + (j0 + j) * b.cs + p0;
      for (int64_t p = 0; p < kc; ++p) bp[p * NR + j] = src[p];
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = b.data + (p0 + p) * b.rs + j0 * b.cs;
      for (int j = 0; j < cols; ++j) bp[p * NR + j] = src[j * b.cs];
    }
  }
}

// K: the kernel's traits - kMR, kNR, kKC, kMC (multiple of kMR), kNC (multiple of kNR),
// optional fast packers K::pack_a / K::pack_b with the signatures above (returning false to fall
// back), and K::micro(ap, bp, kc, c, ldc, load_c, rows, cols, c_next) computing the MR x NR
// tile at c (rows <= MR and cols <= NR of it valid) and prefetching the tile at c_next, the next
// one it will be called for (an address hint only: it may lie past the matrix).
template <class K>
void blocked_gemm_tile(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, const MatView& a,
                       const MatView& b, float* c, int64_t ldc, bool accumulate) {
  constexpr int MR = K::kMR, NR = K::kNR;
  if (i0 >= i1 || j0 >= j1) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = i0; i < i1; ++i) std::fill(c + i * ldc + j0, c + i * ldc + j1, 0.0f);
    }
    return;
  }
  static thread_local GemmScratch scratch_a, scratch_b;
  float* ap = scratch_a.get(static_cast<size_t>(K::kMC) * K::kKC);  // [MC / MR][KC][MR]
  float* bp = scratch_b.get(static_cast<size_t>(K::kNC) * K::kKC);  // [NC / NR][KC][NR]
  for (int64_t jc = j0; jc < j1; jc += K::kNC) {
    const int64_t nc = std::min<int64_t>(K::kNC, j1 - jc);
    for (int64_t pc = 0; pc < k; pc += K::kKC) {
      const int64_t kc = std::min<int64_t>(K::kKC, k - pc);
      const bool load_c = accumulate || pc > 0;
      for (int64_t jr = 0; jr < nc; jr += NR) {
        const int cols = static_cast<int>(std::min<int64_t>(NR, nc - jr));
        float* dst = bp + jr * kc;
        if (!K::pack_b(b, pc, kc, jc + jr, cols, dst)) pack_b_panel<NR>(b, pc, kc, jc + jr, cols, dst);
      }
      for (int64_t ic = i0; ic < i1; ic += K::kMC) {
        const int64_t mc = std::min<int64_t>(K::kMC, i1 - ic);
        for (int64_t ir = 0; ir < mc; ir += MR) {
          const int rows = static_cast<int>(std::min<int64_t>(MR, mc - ir));
          float* dst = ap + ir * kc;
          if (!K::pack_a(a, ic + ir, rows, pc, kc, dst)) pack_a_panel<MR>(a, ic + ir, rows, pc, kc, dst);
        }
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int cols = static_cast<int>(std::min<int64_t>(NR, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int rows = static_cast<int>(std::min<int64_t>(MR, mc - ir));
            // The next tile of C: down this column of tiles, else the top of the next column.
            const float* c_next = ir + MR < mc ? c + (ic + ir + MR) * ldc + jc + jr
                                               : c + ic * ldc + jc + std::min(jr + NR, nc - 1);
            K::micro(ap + ir * kc, bp + jr * kc, kc, c + (ic + ir) * ldc + jc + jr, ldc, load_c,
                     rows, cols, c_next);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace detail
}  // namespace specdec
