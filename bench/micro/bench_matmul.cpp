// Timing program for the matmul kernels on the shapes of the default model (SmolLM2-135M:
// dim 576, FFN 1536, KV 192, 30 layers, Q4_1 weights, Q8_0 tied 49152 x 576 output), compared
// with the machine's measured ceilings (backend/cpu/roofline.h). Not part of ctest.
//
// Build (the CMake build does not glob bench/ yet):
//   g++ -O2 -std=c++20 -Isrc bench/micro/bench_matmul.cpp build-kernels/libspecdec_core.a \
//       -lpthread -o build-kernels/bench_matmul
// Run: build-kernels/bench_matmul [--isa scalar|avx2|avx512] [--threads N] [--rounds R] [--quick]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
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
  WeightMatrix view() const {
    return WeightMatrix{type, data.data(), rows, cols, ggml_row_bytes(type, cols)};
  }
  int64_t bytes() const { return rows * ggml_row_bytes(type, cols); }
};

Matrix make_matrix(const std::string& name, GgmlType type, int64_t rows, int64_t cols,
                   std::mt19937& rng) {
  Matrix m{name, type, rows, cols, {}};
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
    {"576x576 Q5_1", GgmlType::kQ5_1, 576, 576},     {"576x576 F16", GgmlType::kF16, 576, 576},
    {"576x576 F32", GgmlType::kF32, 576, 576}};
constexpr int kNumShapes = sizeof(kShapes) / sizeof(kShapes[0]);
constexpr int64_t kModelBatches[] = {1, 2, 4, 8, 16};

// Best (smallest time / largest rate) of every measurement over all rounds. The machines this
// runs on are shared VMs whose speed drifts by tens of percent over minutes, so each round
// measures everything once and the report keeps each item's best round.
struct Results {
  double bandwidth = 0, peak_f32 = 0, peak_i8 = 0, round_trip_us = 1e30;
  double model[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
  double shape_n1[kNumShapes], shape_n8[kNumShapes], shape_prefill[kNumShapes];
  Results() {
    for (int i = 0; i < kNumShapes; ++i) shape_n1[i] = shape_n8[i] = shape_prefill[i] = 1e30;
  }
};

int run_bench(int argc, char** argv) {
  Isa isa = active_isa();
  int threads = 2;
  int rounds = 3;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--isa" && i + 1 < argc) {
      const std::string v = argv[++i];
      isa = v == "scalar" ? Isa::kScalar : v == "avx2" ? Isa::kAvx2 : Isa::kAvx512;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
      rounds = 1;
    }
  }
  if (!isa_supported(isa)) {
    std::fprintf(stderr, "%s not supported here\n", isa_name(isa));
    return 1;
  }
  ThreadPool pool(threads);
  const int reps = quick ? 3 : 8;
  const int64_t n_prefill = quick ? 128 : 512;
  std::printf("isa %s, %d threads, best of %d rounds\n", isa_name(isa), threads, rounds);

  std::mt19937 rng(1);
  const std::vector<Matrix> model = make_model(rng);
  int64_t model_bytes = 0;
  for (const Matrix& m : model) model_bytes += m.bytes();
  std::vector<std::vector<Matrix>> shape_mats(kNumShapes);
  for (int s = 0; s < kNumShapes; ++s) {
    const Shape& sh = kShapes[s];
    const int64_t one = ggml_row_bytes(sh.type, sh.cols) * sh.rows;
    const int64_t copies = std::max<int64_t>(1, (128 << 20) / one);  // > last-level cache
    for (int64_t c = 0; c < copies; ++c) {
      shape_mats[s].push_back(make_matrix(sh.name, sh.type, sh.rows, sh.cols, rng));
    }
  }

  Results r;
  for (int round = 0; round < rounds; ++round) {
    r.bandwidth = std::max(r.bandwidth, measure_read_bandwidth_gbs(&pool));
    r.peak_f32 = std::max(r.peak_f32, measure_peak_gflops(isa, &pool));
    r.peak_i8 = std::max(r.peak_i8, measure_peak_int8_gops(isa, &pool));
    {
      const int kJobs = 20000;
      const double t0 = now_s();
      for (int j = 0; j < kJobs; ++j) pool.run([](int, int) {});
      r.round_trip_us = std::min(r.round_trip_us, (now_s() - t0) / kJobs * 1e6);
    }
    for (int b = 0; b < 5; ++b) {
      r.model[b] = std::min(r.model[b], model_pass(isa, model, kModelBatches[b], &pool, reps));
    }
    for (int s = 0; s < kNumShapes; ++s) {
      const std::vector<Matrix>& mats = shape_mats[s];
      r.shape_n1[s] = std::min(r.shape_n1[s], shape_time(isa, mats, 1, &pool, reps));
      r.shape_n8[s] = std::min(r.shape_n8[s], shape_time(isa, mats, 8, &pool, reps));
      const std::vector<Matrix> single(mats.begin(), mats.begin() + 1);
      r.shape_prefill[s] =
          std::min(r.shape_prefill[s], shape_time(isa, single, n_prefill, &pool, quick ? 2 : 3));
    }
    std::fprintf(stderr, "round %d done\n", round + 1);
  }

  std::printf(
      "ceilings: read bandwidth %.1f GB/s, fp32 FMA peak %.1f GFLOP/s, int8 peak %.1f GOP/s\n",
      r.bandwidth, r.peak_f32, r.peak_i8);
  std::printf("thread pool: empty run() round trip %.2f us\n", r.round_trip_us);
  std::printf("\nwhole model (%zu matmuls, %.1f MB of weights per token):\n", model.size(),
              static_cast<double>(model_bytes) * 1e-6);
  for (int b = 0; b < 5; ++b) {
    const double t = r.model[b];
    const double gbs = static_cast<double>(model_bytes) / t * 1e-9;
    std::printf(
        "  n=%-3lld %8.3f ms/pass  %6.1f GB/s (%4.1f%% of read bandwidth)  time / time(n=1) %.2f\n",
        static_cast<long long>(kModelBatches[b]), t * 1e3, gbs, gbs / r.bandwidth * 100,
        t / r.model[0]);
  }
  std::printf("\nper shape (n=1 and n=8 stream weights from DRAM; n=%lld is compute bound):\n",
              static_cast<long long>(n_prefill));
  for (int s = 0; s < kNumShapes; ++s) {
    const Shape& sh = kShapes[s];
    const int64_t one = ggml_row_bytes(sh.type, sh.cols) * sh.rows;
    const double a = r.shape_n1[s], b = r.shape_n8[s], c = r.shape_prefill[s];
    const double gops = 2.0 * static_cast<double>(sh.rows * sh.cols * n_prefill) / c * 1e-9;
    const bool quantized = ggml_type_traits(sh.type).block_size > 1;
    const double peak = quantized ? r.peak_i8 : r.peak_f32;
    std::printf(
        "  %-15s n=1 %8.2f us %5.1f GB/s | n=8 %8.2f us (x%.2f) | prefill %7.1f G%s/s = %4.1f%% of "
        "%s peak (%3.0f%% of fp32 peak)\n",
        sh.name, a * 1e6, static_cast<double>(one) / a * 1e-9, b * 1e6, b / a, gops,
        quantized ? "OP" : "FLOP", gops / peak * 100, quantized ? "int8" : "fp32",
        gops / r.peak_f32 * 100);
  }
  return 0;
}

}  // namespace
}  // namespace specdec

int main(int argc, char** argv) {
  return specdec::run_bench(argc, argv);
}
