// Timing program for the matmul kernels on the shapes of the default model (SmolLM2-135M:
// dim 576, FFN 1536, KV 192, 30 layers, Q4_1 weights, Q8_0 tied 49152 x 576 output), compared
// with the machine's measured ceilings (backend/cpu/roofline.h). Not part of ctest.
//
// Built by CMake as build/bench_matmul (bench/micro/*.cpp), or by hand from the repository root:
//   g++ -O2 -std=c++20 -Isrc bench/micro/bench_matmul.cpp build-kernels/libspecdec_core.a
//       -lpthread -o build-kernels/bench_matmul
// Run: build-kernels/bench_matmul [--isa scalar|avx2|avxvnni|avx512] [--threads N] [--rounds R]
//        [--quick] [--stream-mib M]   (per-shape copies of M MiB, default 128: more than the
//                                      last-level cache, so n=1 and n=8 stream from DRAM)
//        [--packed]   (AVX-512: Q4_0 / Q4_1 / Q8_0 / Q4_K matrices in the packed layout, as the
//        model
//                      loads them; see backend/cpu/packed_weights.h)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/roofline.h"
#include "backend/cpu/thread_pool.h"

namespace specdec {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Matrix {
  std::string name;
  GgmlType type;
  int64_t rows, cols;
  std::vector<uint8_t> data;
  std::shared_ptr<PackedWeights> packed;  // set with --packed for packable types
  WeightMatrix view() const {
    if (packed) return packed->stacked();
    return WeightMatrix{type, data.data(), rows, cols, ggml_row_bytes(type, cols)};
  }
  int64_t bytes() const { return rows * ggml_row_bytes(type, cols); }
};

bool g_packed = false;

Matrix make_plain_matrix(const std::string& name, GgmlType type, int64_t rows, int64_t cols,
                         std::mt19937& rng);

Matrix make_matrix(const std::string& name, GgmlType type, int64_t rows, int64_t cols,
                   std::mt19937& rng) {
  Matrix m = make_plain_matrix(name, type, rows, cols, rng);
  if (g_packed && packable(type)) {
    const WeightMatrix w{type, m.data.data(), rows, cols, ggml_row_bytes(type, cols)};
    m.packed = std::make_shared<PackedWeights>(PackedWeights::pack({&w, 1}, nullptr));
  }
  return m;
}

Matrix make_plain_matrix(const std::string& name, GgmlType type, int64_t rows, int64_t cols,
                         std::mt19937& rng) {
  Matrix m{name, type, rows, cols, {}, nullptr};
  m.data.resize(static_cast<size_t>(m.bytes()));
  for (auto& b : m.data) b = static_cast<uint8_t>(rng());
  const GgmlTypeTraits& t = ggml_type_traits(type);
  const uint16_t scale = fp32_to_fp16(0.01f);
  if (t.block_size == 1) {  // float weights: small values instead of random bit patterns
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (type == GgmlType::kF32) {
        const float v = 0.01f * static_cast<float>(i % 97);
        std::memcpy(m.data.data() + 4 * i, &v, 4);
      } else {
        std::memcpy(m.data.data() + 2 * i, &scale, 2);
      }
    }
    return m;
  }
  const int64_t blocks = m.bytes() / t.block_bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = m.data.data() + b * t.block_bytes;
    const int64_t at = type == GgmlType::kQ6_K ? 208 : 0;
    std::memcpy(blk + at, &scale, 2);
    if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 || type == GgmlType::kQ4_K ||
        type == GgmlType::kQ5_K) {
      std::memcpy(blk + 2, &scale, 2);
    }
  }
  return m;
}

// The weight matrices of one decode step, in forward order.
std::vector<Matrix> make_model(std::mt19937& rng) {
  std::vector<Matrix> model;
  for (int layer = 0; layer < 30; ++layer) {
    model.push_back(make_matrix("q", GgmlType::kQ4_1, 576, 576, rng));
    model.push_back(make_matrix("k", GgmlType::kQ4_1, 192, 576, rng));
    model.push_back(make_matrix("v", GgmlType::kQ4_1, 192, 576, rng));
    model.push_back(make_matrix("o", GgmlType::kQ4_1, 576, 576, rng));
    model.push_back(make_matrix("gate", GgmlType::kQ4_1, 1536, 576, rng));
    model.push_back(make_matrix("up", GgmlType::kQ4_1, 1536, 576, rng));
    model.push_back(make_matrix("down", GgmlType::kQ4_1, 576, 1536, rng));
  }
  model.push_back(make_matrix("output", GgmlType::kQ8_0, 49152, 576, rng));
  return model;
}

std::vector<float> activations(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = normal(rng);
  return x;
}

// Seconds of the fastest of `reps` passes of fn (after one warm-up pass).
template <class F>
double best_time(int reps, F&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

// One decode-like pass over all matrices with n tokens.
double model_pass(Isa isa, const std::vector<Matrix>& model, int64_t n, ThreadPool* pool,
                  int reps) {
  std::mt19937 rng(3);
  const std::vector<float> x576 = activations(n, 576, rng);
  const std::vector<float> x1536 = activations(n, 1536, rng);
  std::vector<float> y(static_cast<size_t>(n * 49152));
  return best_time(reps, [&] {
    for (const Matrix& m : model) {
      matmul_isa(isa, m.view(), m.cols == 576 ? x576.data() : x1536.data(), n, y.data(), pool);
    }
  });
}

// Time of one matmul of this shape with n tokens, cycling through copies that together exceed
// the last-level cache, so that weights come from DRAM as they do in the model.
double shape_time(Isa isa, const std::vector<Matrix>& copies, int64_t n, ThreadPool* pool,
                  int reps) {
  std::mt19937 rng(4);
  const std::vector<float> x = activations(n, copies[0].cols, rng);
  std::vector<float> y(static_cast<size_t>(n * copies[0].rows));
  const double total = best_time(reps, [&] {
    for (const Matrix& m : copies) matmul_isa(isa, m.view(), x.data(), n, y.data(), pool);
  });
  return total / static_cast<double>(copies.size());
}

struct Shape {
  const char* name;
  GgmlType type;
  int64_t rows, cols;
};

constexpr Shape kShapes[] = {
    {"576x576 Q4_1", GgmlType::kQ4_1, 576, 576},     {"192x576 Q4_1", GgmlType::kQ4_1, 192, 576},
    {"1536x576 Q4_1", GgmlType::kQ4_1, 1536, 576},   {"576x1536 Q4_1", GgmlType::kQ4_1, 576, 1536},
    {"49152x576 Q8_0", GgmlType::kQ8_0, 49152, 576}, {"576x768 Q4_K", GgmlType::kQ4_K, 576, 768},
    {"576x768 Q6_K", GgmlType::kQ6_K, 576, 768},     {"576x576 Q4_0", GgmlType::kQ4_0, 576, 576},
    {"576x576 Q5_1", GgmlType::kQ5_1, 576, 576},     {"896x896 Q5_0", GgmlType::kQ5_0, 896, 896},
    {"4864x896 Q5_0", GgmlType::kQ5_0, 4864, 896},   {"576x576 F16", GgmlType::kF16, 576, 576},
    {"576x576 F32", GgmlType::kF32, 576, 576}};
constexpr int kNumShapes = sizeof(kShapes) / sizeof(kShapes[0]);
constexpr int64_t kModelBatches[] = {1, 2, 4, 8, 16};

// One round measures the ceilings and every kernel once. The machines this runs on are shared VMs
// whose speed drifts by tens of percent over minutes (and whose two vCPUs are sometimes SMT
// siblings of one core), so each kernel is compared with the ceilings of its own round, and the
// report gives the best and the median of those per-round ratios.
struct Round {
  double bandwidth = 0, peak_f32 = 0, peak_i8 = 0, round_trip_us = 0;
  double model[5] = {};
  double shape_n1[kNumShapes] = {}, shape_n8[kNumShapes] = {}, shape_prefill[kNumShapes] = {};
};

// Best and median of f(round) over the rounds ("best" = largest, or smallest if !larger).
template <class F>
std::pair<double, double> best_and_median(const std::vector<Round>& rounds, F f, bool larger) {
  std::vector<double> v;
  for (const Round& r : rounds) v.push_back(f(r));
  std::sort(v.begin(), v.end());
  if (!larger) std::reverse(v.begin(), v.end());
  return {v.back(), v[v.size() / 2]};
}

int run_bench(int argc, char** argv) {
  Isa isa = active_isa();
  int threads = 2;
  int num_rounds = 3;
  bool quick = false;
  int64_t stream_mib =
      128;  // per shape: copies of at least this much (beyond the last-level cache)
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
      num_rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--stream-mib" && i + 1 < argc) {
      stream_mib = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (a == "--packed") {
      g_packed = true;
    } else if (a == "--quick") {
      quick = true;
      num_rounds = 1;
    }
  }
  if (!isa_supported(isa)) {
    std::fprintf(stderr, "%s not supported here\n", isa_name(isa));
    return 1;
  }
  ThreadPool pool(threads);
  const int reps = quick ? 3 : 8;
  const int64_t n_prefill = quick ? 128 : 512;
  std::printf("isa %s%s, %d threads, %d rounds: best round (median round)\n", isa_name(isa),
              g_packed ? " (packed weights)" : "", threads, num_rounds);

  std::mt19937 rng(1);
  const std::vector<Matrix> model = make_model(rng);
  int64_t model_bytes = 0;
  for (const Matrix& m : model) model_bytes += m.bytes();
  std::vector<std::vector<Matrix>> shape_mats(kNumShapes);
  for (int s = 0; s < kNumShapes; ++s) {
    const Shape& sh = kShapes[s];
    const int64_t one = ggml_row_bytes(sh.type, sh.cols) * sh.rows;
    const int64_t copies = std::max<int64_t>(1, (stream_mib << 20) / one);
    for (int64_t c = 0; c < copies; ++c) {
      shape_mats[s].push_back(make_matrix(sh.name, sh.type, sh.rows, sh.cols, rng));
    }
  }

  std::vector<Round> rounds(static_cast<size_t>(num_rounds));
  for (int ri = 0; ri < num_rounds; ++ri) {
    Round& r = rounds[static_cast<size_t>(ri)];
    r.bandwidth = measure_read_bandwidth_gbs(&pool);
    r.peak_f32 = measure_peak_gflops(isa, &pool);
    r.peak_i8 = measure_peak_int8_gops(isa, &pool);
    const int kJobs = 20000;
    const double t0 = now_s();
    for (int j = 0; j < kJobs; ++j) pool.run([](int, int) {});
    r.round_trip_us = (now_s() - t0) / kJobs * 1e6;
    for (int b = 0; b < 5; ++b) r.model[b] = model_pass(isa, model, kModelBatches[b], &pool, reps);
    for (int s = 0; s < kNumShapes; ++s) {
      const std::vector<Matrix>& mats = shape_mats[s];
      r.shape_n1[s] = shape_time(isa, mats, 1, &pool, reps);
      r.shape_n8[s] = shape_time(isa, mats, 8, &pool, reps);
      const std::vector<Matrix> single(mats.begin(), mats.begin() + 1);
      r.shape_prefill[s] = shape_time(isa, single, n_prefill, &pool, quick ? 2 : 3);
    }
    std::fprintf(stderr, "round %d done\n", ri + 1);
  }

  auto [bw, bw_med] = best_and_median(
      rounds, [](const Round& r) { return r.bandwidth; }, true);
  auto [f32, f32_med] = best_and_median(
      rounds, [](const Round& r) { return r.peak_f32; }, true);
  auto [i8, i8_med] = best_and_median(
      rounds, [](const Round& r) { return r.peak_i8; }, true);
  auto [rt, rt_med] = best_and_median(
      rounds, [](const Round& r) { return r.round_trip_us; }, false);
  std::printf(
      "ceilings: read bandwidth %.1f (%.1f) GB/s, fp32 FMA peak %.1f (%.1f) GFLOP/s, "
      "int8 peak %.1f (%.1f) GOP/s\n",
      bw, bw_med, f32, f32_med, i8, i8_med);
  std::printf("thread pool: empty run() round trip %.2f (%.2f) us\n", rt, rt_med);

  std::printf("\nwhole model (%zu matmuls, %.1f MB of weights per token):\n", model.size(),
              static_cast<double>(model_bytes) * 1e-6);
  const double mb = static_cast<double>(model_bytes);
  for (int b = 0; b < 5; ++b) {
    auto [t, t_med] = best_and_median(
        rounds, [&](const Round& r) { return r.model[b]; }, false);
    auto [pct, pct_med] = best_and_median(
        rounds, [&](const Round& r) { return mb / r.model[b] * 1e-9 / r.bandwidth * 100; }, true);
    auto [ratio, ratio_med] = best_and_median(
        rounds, [&](const Round& r) { return r.model[b] / r.model[0]; }, false);
    std::printf(
        "  n=%-3lld %7.3f (%7.3f) ms/pass  %5.1f GB/s = %4.1f%% (%4.1f%%) of its round's "
        "read bandwidth  time / time(n=1) %.2f (%.2f)\n",
        static_cast<long long>(kModelBatches[b]), t * 1e3, t_med * 1e3, mb / t * 1e-9, pct, pct_med,
        ratio, ratio_med);
  }

  std::printf("\nper shape (n=1 and n=8 stream weights from DRAM; n=%lld is compute bound):\n",
              static_cast<long long>(n_prefill));
  for (int s = 0; s < kNumShapes; ++s) {
    const Shape& sh = kShapes[s];
    const double one = static_cast<double>(ggml_row_bytes(sh.type, sh.cols) * sh.rows);
    const double ops = 2.0 * static_cast<double>(sh.rows * sh.cols * n_prefill);
    const bool quantized = ggml_type_traits(sh.type).block_size > 1;
    auto [t1, t1_med] = best_and_median(
        rounds, [&](const Round& r) { return r.shape_n1[s]; }, false);
    auto [x8, x8_med] = best_and_median(
        rounds, [&](const Round& r) { return r.shape_n8[s] / r.shape_n1[s]; }, false);
    auto [g, g_med] = best_and_median(
        rounds, [&](const Round& r) { return ops / r.shape_prefill[s] * 1e-9; }, true);
    auto [pct, pct_med] = best_and_median(
        rounds,
        [&](const Round& r) {
          return ops / r.shape_prefill[s] * 1e-9 / (quantized ? r.peak_i8 : r.peak_f32) * 100;
        },
        true);
    std::printf(
        "  %-15s n=1 %7.2f us %5.1f GB/s | n=8/n=1 %.2f (%.2f) | prefill %6.1f (%6.1f) "
        "G%s/s = %4.1f%% (%4.1f%%) of its round's %s peak\n",
        sh.name, t1 * 1e6, one / t1 * 1e-9, x8, x8_med, g, g_med, quantized ? "OP" : "FLOP", pct,
        pct_med, quantized ? "int8" : "fp32");
  }
  return 0;
}

}  // namespace
}  // namespace specdec

int main(int argc, char** argv) {
  return specdec::run_bench(argc, argv);
}
