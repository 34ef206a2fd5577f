// Timing program for the attention op on the shapes of the default model (SmolLM2-135M: 30
// layers, 9 query heads, 3 KV heads, head_dim 64, F32 KV cache): one "pass" is the attention of
// n_new causal query tokens over n_past cached tokens in each of the 30 layers, each layer with
// its own K/V buffers, as in a forward pass. Not part of ctest.
//
// Build: cmake --build <build dir> --target bench_attention
// Run: <build dir>/bench_attention [--isa scalar|avx2|avx512] [--threads N] [--rounds R]
//        [--no-flush] [--case N_PAST,N_NEW] [--layers L] [--tree]
// --tree replaces the causal mask of the new tokens by a binary token tree (token i's parent is
// (i - 1) / 2; it sees itself and its ancestors), as in tree verification.
// By default a 128 MiB buffer is read between passes, so the K/V start in DRAM as they do in
// the model, where ~100 MB of weights stream through the caches between two attention calls of
// one layer; --no-flush times a cache-warm op instead (the 512-token K/V fit in a large L3), and
// --layers 1 --no-flush keeps one layer's K/V in L2 (compute-bound timing). "best ms" is the
// fastest round, less disturbed than the median on a busy host.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace {

constexpr int kHeads = 9;
constexpr int kKvHeads = 3;
constexpr int kHeadDim = 64;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Reads every cache line of a buffer larger than the last-level cache.
float flush_caches(const std::vector<float>& big) {
  float sum = 0.0f;
  for (size_t i = 0; i < big.size(); i += 16) sum += big[i];
  return sum;
}

struct Case {
  int64_t n_past;
  int64_t n_new;
};

int run_bench(int argc, char** argv) {
  Isa isa = active_isa();
  int threads = 2;
  int rounds = 15;
  bool flush = true;
  int layers = 30;
  bool tree = false;
  std::vector<Case> cases = {{512, 1},  {512, 8},   {512, 16}, {2048, 1},
                             {2048, 8}, {2048, 16}, {0, 512}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--isa" && i + 1 < argc) {
      const std::string v = argv[++i];
      isa = v == "scalar" ? Isa::kScalar : v == "avx2" ? Isa::kAvx2 : Isa::kAvx512;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--layers" && i + 1 < argc) {
      layers = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-flush") {
      flush = false;
    } else if (a == "--tree") {
      tree = true;
    } else if (a == "--case" && i + 1 < argc) {
      long long n_past = 0, n_new = 0;
      if (std::sscanf(argv[++i], "%lld,%lld", &n_past, &n_new) != 2 || n_past < 0 || n_new < 1) {
        std::fprintf(stderr, "--case wants N_PAST,N_NEW\n");
        return 2;
      }
      cases = {{n_past, n_new}};
    } else {
      std::fprintf(stderr,
                   "usage: %s [--isa scalar|avx2|avx512] [--threads N] [--rounds R] "
                   "[--no-flush] [--case N_PAST,N_NEW] [--layers L] [--tree]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!isa_supported(isa)) {
    std::fprintf(stderr, "ISA %s not supported here\n", isa_name(isa));
    return 2;
  }
  ThreadPool pool(threads);
  std::printf(
      "attention, SmolLM2-135M shapes (%d layers, %d/%d heads of %d), isa %s, %d threads,"
      " %s, %s mask, median of %d rounds\n",
      layers, kHeads, kKvHeads, kHeadDim, isa_name(isa), threads,
      flush ? "K/V cold (caches flushed)" : "K/V cache-warm", tree ? "binary-tree" : "causal",
      rounds);
  std::printf("%8s %6s %12s %12s %12s %12s\n", "n_past", "n_new", "ms/pass", "us/layer", "KV GB/s",
              "best ms");
  std::vector<float> big(flush ? (size_t{128} << 20) / sizeof(float) : 0, 1.0f);
  float sink = 0.0f;
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Case& c : cases) {
    AttentionShape s;
    s.n_past = c.n_past;
    s.n_new = c.n_new;
    s.n_heads = kHeads;
    s.n_kv_heads = kKvHeads;
    s.head_dim = kHeadDim;
    s.scale = 0.125f;
    const int64_t kv_elems = (c.n_past + c.n_new) * kKvHeads * kHeadDim;
    std::vector<std::vector<float>> k(layers), v(layers);  // [layer][n_kv, n_kv_heads, hd]
    for (int l = 0; l < layers; ++l) {
      k[l].resize(static_cast<size_t>(kv_elems));
      v[l].resize(static_cast<size_t>(kv_elems));
      for (float& x : k[l]) x = dist(gen);
      for (float& x : v[l]) x = dist(gen);
    }
    std::vector<float> q(static_cast<size_t>(c.n_new * kHeads * kHeadDim));  // [n_new, 9, 64]
    for (float& x : q) x = dist(gen);
    std::vector<float> out(q.size());  // [n_new, 9, 64]
    std::vector<uint8_t> mask;         // [n_new, n_new] with --tree
    if (tree) {
      mask.assign(static_cast<size_t>(c.n_new * c.n_new), 0);
      for (int64_t i = 0; i < c.n_new; ++i) {
        for (int64_t a = i;; a = (a - 1) / 2) {
          mask[static_cast<size_t>(i * c.n_new + a)] = 1;
          if (a == 0) break;
        }
      }
    }
    std::vector<double> times;
    for (int r = 0; r < rounds + 1; ++r) {
      if (flush) sink += flush_caches(big);
      const double t0 = now_s();
      for (int l = 0; l < layers; ++l) {
        attention_isa(isa, s, q.data(), k[l].data(), v[l].data(), tree ? mask.data() : nullptr,
                      out.data(), &pool);
      }
      const double t = now_s() - t0;
      if (r > 0) times.push_back(t);  // round 0 warms up the pool and the scratch
      sink += out[0];
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double kv_bytes = 2.0 * layers * static_cast<double>(kv_elems) * sizeof(float);
    std::printf("%8lld %6lld %12.3f %12.1f %12.2f %12.3f\n", static_cast<long long>(c.n_past),
                static_cast<long long>(c.n_new), median * 1e3, median * 1e6 / layers,
                kv_bytes / median * 1e-9, times.front() * 1e3);
  }
  std::printf("(checksum %g)\n", static_cast<double>(sink));
  return 0;
}

}  // namespace
}  // namespace specdec

int main(int argc, char** argv) {
  return specdec::run_bench(argc, argv);
}
