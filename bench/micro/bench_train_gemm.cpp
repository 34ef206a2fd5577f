// GFLOP/s of the training GEMM (drafter/train/train_gemm.h) at the shapes of a ReDrafter
// training step, per variant and thread count, next to the measured fp32 FMA peak.
//   bench_train_gemm [rows=1024] [dim=576] [state=256] [vocab=4096]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/roofline.h"
#include "backend/cpu/thread_pool.h"
#include "drafter/train/train_gemm.h"

using namespace specdec;

namespace {

struct Shape {
  const char* name;
  int64_t m, n, k;
  int layout;  // 0: X·Wᵀ, 1: dY·W, 2: dYᵀ·X
};

double time_gemm(Isa isa, const Shape& s, ThreadPool* pool, std::vector<float>& a,
                 std::vector<float>& b, std::vector<float>& c) {
  MatView av, bv;
  if (s.layout == 0) {
    av = {a.data(), s.k, 1};
    bv = {b.data(), 1, s.k};
  } else if (s.layout == 1) {
    av = {a.data(), s.k, 1};
    bv = {b.data(), s.n, 1};
  } else {
    av = {a.data(), 1, s.m};
    bv = {b.data(), s.n, 1};
  }
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    train_gemm_isa(isa, s.m, s.n, s.k, av, bv, c.data(), s.n, s.layout == 2, pool);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * s.m * s.n * s.k / best * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int64_t dim = argc > 2 ? std::atoll(argv[2]) : 576;
  const int64_t state = argc > 3 ? std::atoll(argv[3]) : 256;
  const int64_t vocab = argc > 4 ? std::atoll(argv[4]) : 4096;
  const int64_t d = dim + state;
  const Shape shapes[] = {
      {"logits    X·W_oᵀ", rows, vocab, d, 0}, {"dX       dZ·W_o", rows, d, vocab, 1},
      {"dW_o     dZᵀ·X", vocab, d, rows, 2},    {"block    X·W_lᵀ", rows, d, d, 0},
      {"dX block dY·W_l", rows, d, d, 1},        {"dW block dYᵀ·X", d, d, rows, 2},
      {"rnn      E·W_eᵀ", rows, state, dim, 0},  {"dW_e     dPᵀ·E", state, dim, rows, 2},
  };
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  for (int nt : {1, 2}) {
    ThreadPool pool(nt);
    std::printf("threads %d: fp32 FMA peak avx512 %.1f GFLOP/s, avx2 %.1f GFLOP/s\n", nt,
                isa_supported(Isa::kAvx512) ? measure_peak_gflops(Isa::kAvx512, &pool) : 0.0,
                isa_supported(Isa::kAvx2) ? measure_peak_gflops(Isa::kAvx2, &pool) : 0.0);
    for (const Shape& s : shapes) {
      std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
      for (float& x : a) x = dist(gen);
      for (float& x : b) x = dist(gen);
      std::printf("  %-18s m %5lld n %5lld k %5lld:", s.name, (long long)s.m, (long long)s.n,
                  (long long)s.k);
      for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
        if (!isa_supported(isa)) continue;
        std::printf("  %s %6.1f", isa_name(isa), time_gemm(isa, s, &pool, a, b, c));
      }
      std::printf(" GFLOP/s\n");
    }
  }
  return 0;
}
