// Timing program for the attention op on the shapes of the default model (SmolLM2-135M: 30
// layers, 9 query heads, 3 KV heads, head_dim 64, f16, f32 or q8_0 KV cache): one "pass" is the
// attention of n_new causal query tokens over n_past cached tokens in each of the 30 layers, each
// layer with its own K/V buffers, as in a forward pass. Not part of ctest.
//
// Build: cmake --build <build dir> --target bench_attention
// Run: <build dir>/bench_attention [--isa scalar|avx2|avxvnni|avx512] [--threads N] [--rounds R]
//        [--no-flush] [--case N_PAST,N_NEW]... [--layers L] [--tree] [--kv-type f16|f32|q8_0]
// The rounds of the cases alternate (round r of every case, then round r + 1), so that a busy
// host disturbs them alike; "x n_new=1" is the median over rounds of a case's time over that of
// the n_new = 1 case at the same n_past (when one is run), the verification cost ratio of
// speculative decoding. --case may repeat.
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
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/k_tiles.h"
#include "kv/kv_cache.h"

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
  KvType kv_type = KvType::kF16;
  std::vector<Case> cases = {{512, 1},  {512, 8},   {512, 16}, {2048, 1},
                             {2048, 8}, {2048, 16}, {0, 512}};
  bool default_cases = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--isa" && i + 1 < argc) {
      const std::string v = argv[++i];
      isa = v == "scalar"    ? Isa::kScalar
            : v == "avx2"    ? Isa::kAvx2
            : v == "avxvnni" ? Isa::kAvxVnni
                             : Isa::kAvx512;
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
    } else if (a == "--kv-type" && i + 1 < argc && parse_kv_type(argv[i + 1])) {
      kv_type = *parse_kv_type(argv[++i]);
    } else if (a == "--case" && i + 1 < argc) {
      long long n_past = 0, n_new = 0;
      if (std::sscanf(argv[++i], "%lld,%lld", &n_past, &n_new) != 2 || n_past < 0 || n_new < 1) {
        std::fprintf(stderr, "--case wants N_PAST,N_NEW\n");
        return 2;
      }
      if (default_cases) cases.clear();
      default_cases = false;
      cases.push_back({n_past, n_new});
    } else {
      std::fprintf(stderr,
                   "usage: %s [--isa scalar|avx2|avxvnni|avx512] [--threads N] [--rounds R] "
                   "[--no-flush] [--case N_PAST,N_NEW]... [--layers L] [--tree] "
                   "[--kv-type f16|f32|q8_0]\n",
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
      " %s KV, %s, %s mask, median of %d rounds\n",
      layers, kHeads, kKvHeads, kHeadDim, isa_name(isa), threads, kv_type_name(kv_type),
      flush ? "K/V cold (caches flushed)" : "K/V cache-warm", tree ? "binary-tree" : "causal",
      rounds);
  std::printf("%8s %6s %12s %12s %12s %12s %12s\n", "n_past", "n_new", "ms/pass", "us/layer",
              "KV GB/s", "best ms", "x n_new=1");
  std::vector<float> big(flush ? (size_t{128} << 20) / sizeof(float) : 0, 1.0f);
  float sink = 0.0f;
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // One case's inputs and its times.
  struct Run {
    AttentionShape s;
    int64_t kv_elems = 0;
    std::unique_ptr<KvCache> cache;        // [layers] slots [0, n_past + n_new) of kv_type
    std::vector<float> q;                  // [n_new, n_heads, head_dim]
    std::vector<float> out;                // [n_new, n_heads, head_dim]
    std::vector<uint8_t> mask;             // [n_new, n_new] with --tree
    std::vector<double> times;             // [rounds] seconds per pass
  };
  std::vector<Run> runs(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Run& run = runs[i];
    run.s.n_past = c.n_past;
    run.s.n_new = c.n_new;
    run.s.n_heads = kHeads;
    run.s.n_kv_heads = kKvHeads;
    run.s.head_dim = kHeadDim;
    run.s.scale = 0.125f;
    run.kv_elems = (c.n_past + c.n_new) * kKvHeads * kHeadDim;
    const int64_t slots = c.n_past + c.n_new;
    run.cache = std::make_unique<KvCache>(layers, kKvHeads, kHeadDim, slots, kv_type);
    std::vector<float> k(static_cast<size_t>(run.kv_elems)), v(k.size());
    for (int l = 0; l < layers; ++l) {
      for (float& x : k) x = dist(gen);
      for (float& x : v) x = dist(gen);
      run.cache->write(l, 0, slots, k.data(), v.data());
    }
    run.cache->append(slots);
    run.q.resize(static_cast<size_t>(c.n_new * kHeads * kHeadDim));
    for (float& x : run.q) x = dist(gen);
    run.out.resize(run.q.size());
    if (tree) {
      run.mask.assign(static_cast<size_t>(c.n_new * c.n_new), 0);
      for (int64_t t = 0; t < c.n_new; ++t) {
        for (int64_t a = t;; a = (a - 1) / 2) {
          run.mask[static_cast<size_t>(t * c.n_new + a)] = 1;
          if (a == 0) break;
        }
      }
    }
  }
  for (int r = 0; r < rounds + 1; ++r) {
    for (Run& run : runs) {
      if (flush) sink += flush_caches(big);
      const double t0 = now_s();
      const SeqKv seq = run.cache->seq();
      for (int l = 0; l < layers; ++l) {
        attention_isa(isa, run.s, run.q.data(), seq.storage->view(l, seq.table.data()),
                      tree ? run.mask.data() : nullptr, run.out.data(), &pool);
      }
      const double t = now_s() - t0;
      if (r > 0) run.times.push_back(t);  // round 0 warms up the pool and the scratch
      sink += run.out[0];
    }
  }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  for (const Run& run : runs) {
    const double med = median(run.times);
    const double best = *std::min_element(run.times.begin(), run.times.end());
    const double kv_bytes =  // codes or values, and q8_0's scales
        2.0 * layers *
        (static_cast<double>(run.kv_elems) * static_cast<double>(kv_type_bytes(kv_type)) +
         static_cast<double>(run.kv_elems / kHeadDim) *
             static_cast<double>(kv_scale_bytes(kv_type)));
    std::printf("%8lld %6lld %12.3f %12.1f %12.2f %12.3f", static_cast<long long>(run.s.n_past),
                static_cast<long long>(run.s.n_new), med * 1e3, med * 1e6 / layers,
                kv_bytes / med * 1e-9, best * 1e3);
    const Run* one = nullptr;  // the n_new = 1 case at the same n_past
    for (const Run& other : runs) {
      if (other.s.n_past == run.s.n_past && other.s.n_new == 1) one = &other;
    }
    if (one != nullptr) {
      std::vector<double> ratios;  // [rounds]
      for (size_t i = 0; i < run.times.size(); ++i) ratios.push_back(run.times[i] / one->times[i]);
      std::printf(" %12.3f", median(ratios));
    }
    std::printf("\n");
  }
  std::printf("(checksum %g)\n", static_cast<double>(sink));
  return 0;
}

}  // namespace
}  // namespace specdec

int main(int argc, char** argv) {
  return specdec::run_bench(argc, argv);
}
