// Drivers of the roofline measurements: run the per-ISA loop on every thread of the pool at
// once, time each thread, keep the best of a few runs.
#include "backend/cpu/roofline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "util/check.h"
#include "util/huge_pages.h"

namespace specdec {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

volatile double g_sink = 0.0;

// Scalar stand-ins: independent multiply-add pairs (no FMA in the baseline ISA).
double fma_loop_scalar(long iters, double* ops_per_iter) {
  *ops_per_iter = 8.0 * 2;
  float a[8] = {1.0f, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f, 1.6f, 1.7f};
  const float m = 0.999999f, c = 1e-7f;
  for (long it = 0; it < iters; ++it) {
    for (float& v : a) {
      v = v * m + c;
      __asm__("" : "+x"(v));
    }
  }
  double s = 0;
  for (float v : a) s += v;
  return s;
}

double int8_loop_scalar(long iters, double* ops_per_iter) {
  *ops_per_iter = 8.0 * 2;
  int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int32_t m = 3, c = 1;
  for (long it = 0; it < iters; ++it) {
    for (int32_t& v : a) {
      v = v * m + c;
      __asm__("" : "+r"(v));
    }
  }
  double s = 0;
  for (int32_t v : a) s += v;
  return s;
}

using LoopFn = double (*)(long, double*);

// Every thread runs `loop` for `iters` iterations; returns total ops / slowest thread's time.
double run_loop_on_pool(LoopFn loop, long iters, ThreadPool* pool) {
  const int threads = pool ? pool->size() : 1;
  std::vector<double> seconds(static_cast<size_t>(threads), 0.0);
  std::vector<double> ops(static_cast<size_t>(threads), 0.0);
  auto body = [&](int ti, int nt) {
    double per_iter = 0.0;
    const double t0 = now_s();
    g_sink = g_sink + loop(iters, &per_iter);
    seconds[static_cast<size_t>(ti)] = now_s() - t0;
    ops[static_cast<size_t>(ti)] = per_iter * static_cast<double>(iters);
    (void)nt;
  };
  if (pool) {
    pool->run(body);
  } else {
    body(0, 1);
  }
  double total = 0.0, slowest = 0.0;
  for (int t = 0; t < threads; ++t) {
    total += ops[static_cast<size_t>(t)];
    slowest = std::max(slowest, seconds[static_cast<size_t>(t)]);
  }
  return total / slowest;
}

// Calibrates the iteration count to ~20 ms per run, then keeps the best of 15 runs: short runs,
// many of them, so that a quiet moment is caught on a shared (virtualized) machine.
double best_rate(LoopFn loop, ThreadPool* pool) {
  long iters = 1 << 14;
  for (;;) {
    double per_iter = 0.0;
    const double t0 = now_s();
    g_sink = g_sink + loop(iters, &per_iter);
    if (now_s() - t0 > 0.01 || iters > (1L << 40)) break;
    iters *= 2;
  }
  iters *= 2;
  double best = 0.0;
  for (int rep = 0; rep < 15; ++rep) best = std::max(best, run_loop_on_pool(loop, iters, pool));
  return best;
}

LoopFn pick(Isa isa, LoopFn scalar, LoopFn avx2, LoopFn avx512, LoopFn avxvnni = nullptr) {
  if (!isa_supported(isa))
    throw Error(std::string("roofline: ") + isa_name(isa) + " not supported");
  switch (isa) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvxVnni:
      return avxvnni != nullptr ? avxvnni : avx2;
    case Isa::kAvx2:
      return avx2;
    default:
      return scalar;
  }
}

}  // namespace

double measure_peak_gflops(Isa isa, ThreadPool* pool) {
  return best_rate(pick(isa, fma_loop_scalar, detail::fma_loop_avx2, detail::fma_loop_avx512),
                   pool) *
         1e-9;
}

double measure_peak_int8_gops(Isa isa, ThreadPool* pool) {
  return best_rate(pick(isa, int8_loop_scalar, detail::int8_loop_avx2, detail::int8_loop_avx512,
                        detail::int8_loop_avxvnni),
                   pool) *
         1e-9;
}

double measure_read_bandwidth_gbs(ThreadPool* pool) {
  constexpr size_t kBytes = size_t{512} << 20;
  const int threads = pool ? pool->size() : 1;
  // In huge pages where the system allows, like the weights the decode step streams.
  HugeBuffer buffer(kBytes, HugeBuffer::Init::kNone);
  unsigned char* bytes = buffer.data();
  const size_t share = kBytes / static_cast<size_t>(threads) / 4096 * 4096;
  // Touch every page once (each thread its own share, so pages land near the reader).
  auto touch = [&](int ti, int) { std::memset(bytes + share * static_cast<size_t>(ti), 1, share); };
  if (pool) {
    pool->run(touch);
  } else {
    touch(0, 1);
  }
  const Isa isa = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                  : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                              : Isa::kScalar;
  double best = 0.0;
  for (int rep = 0; rep < 8; ++rep) {
    std::vector<double> sums(static_cast<size_t>(threads), 0.0);
    auto read = [&](int ti, int) {
      const unsigned char* p = bytes + share * static_cast<size_t>(ti);
      double s = 0.0;
      if (isa == Isa::kAvx512) {
        s = detail::read_sum_avx512(p, static_cast<long>(share));
      } else if (isa == Isa::kAvx2) {
        s = detail::read_sum_avx2(p, static_cast<long>(share));
      } else {
        const auto* w = reinterpret_cast<const uint64_t*>(p);
        uint64_t a = 0, b = 0;
        for (size_t i = 0; i + 1 < share / 8; i += 2) {
          a += w[i];
          b += w[i + 1];
        }
        s = static_cast<double>(a + b);
      }
      sums[static_cast<size_t>(ti)] = s;
    };
    const double t0 = now_s();
    if (pool) {
      pool->run(read);
    } else {
      read(0, 1);
    }
    const double dt = now_s() - t0;
    for (double s : sums) g_sink = g_sink + s;
    best = std::max(best, static_cast<double>(share) * threads / dt * 1e-9);
  }
  return best;
}

}  // namespace specdec
