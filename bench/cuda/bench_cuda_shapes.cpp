// The decode-pass cost of a Llama-3-8B-shaped model on the GPU as a function of the number of
// tokens per pass (n = 1, 2, 4, 8, 16): what speculative verification of n tokens costs against
// decoding one.
//
// Random weights of one type (--type Q8_0 default, F16, Q4_1 or any matmul type) in the shapes of
// Llama 3 8B: dim 4096, 32 layers of q 4096x4096, k/v 1024x4096, o 4096x4096, gate/up
// 14336x4096, down 4096x14336, and the output matrix 128256x4096. A "pass" is, per layer,
// rmsnorm, the q/k/v/o matmuls, add, rmsnorm, gate/up, swiglu, down, add; then the final rmsnorm
// and the output matmul. ATTENTION IS OMITTED (its cost depends on the context length; o takes
// q's output as its input). Timed with CUDA events on the backend's stream: 2 passes of warm-up,
// then the median of 10. --graph captures each pass in a CUDA graph and times its replay too.
//
// Output, JSON lines: first {"gpu":..., "measured_bw_gbs":...}, then one line per (type, kernel,
// mode, n):
//   {"type", "n", "mode" ("stream" / "graph"), "ms", "weight_bytes", "achieved_gbs" (weight
//    bytes / time), "fraction_of_measured_bw", "cost_vs_n1", "kernel" ("new" / "legacy")}
// Each type's weights are freed before the next type's are made.
//
//   bench_cuda_shapes [--type Q8_0 | --types Q8_0,Q4_1,F16 | --all] [--graph] [--ab] [--legacy]
//                     [--layers 32]
//   --all: Q8_0, Q4_1 and F16 with --graph. --ab: each type also with the legacy matmul kernel
//   (cuda::set_matmul_legacy), --legacy: only with it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quant_blocks.h"  // fp32_to_fp16 / fp32_to_bf16
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/ggml_type.h"

namespace {

using namespace specdec;

constexpr int64_t kDim = 4096;
constexpr int64_t kKvDim = 1024;
constexpr int64_t kFfn = 14336;
constexpr int64_t kVocab = 128256;
constexpr int64_t kMaxN = 16;

GgmlType parse_type(const std::string& name) {
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const GgmlTypeTraits* t = ggml_type_traits(raw);
    if (t != nullptr && name == t->name) {
      const auto type = static_cast<GgmlType>(raw);
      if (cuda::matmul_supported(type)) return type;
    }
  }
  std::fprintf(stderr, "bench_cuda_shapes: --type %s is not a supported weight type\n",
               name.c_str());
  std::exit(2);
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// A host pattern of valid random blocks (sane f16 scales), whole blocks, about `bytes` long.
std::vector<uint8_t> random_pattern(GgmlType type, size_t bytes) {
  const GgmlTypeTraits& t = ggml_type_traits(type);
  const size_t bb = static_cast<size_t>(t.block_bytes);
  std::vector<uint8_t> out(bytes / bb * bb);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_real_distribution<float> scale(0.0005f, 0.002f);
  for (size_t off = 0; off < out.size(); off += bb) {
    uint8_t* b = out.data() + off;
    if (type == GgmlType::kF32) {
      const float v = normal(rng);
      std::memcpy(b, &v, 4);
      continue;
    }
    if (type == GgmlType::kF16 || type == GgmlType::kBF16) {
      const float v = normal(rng);
      const uint16_t h = type == GgmlType::kF16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(b, &h, 2);
      continue;
    }
    for (size_t i = 0; i < bb; i += 4) {
      const uint32_t r = rng();
      std::memcpy(b + i, &r, std::min<size_t>(4, bb - i));
    }
    switch (type) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        put_f16(b, scale(rng));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        put_f16(b, scale(rng));
        put_f16(b + 2, -8.0f * scale(rng));
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        put_f16(b, scale(rng) * 0.05f);
        put_f16(b + 2, scale(rng) * 0.05f);
        break;
      case GgmlType::kQ6_K:
        put_f16(b + 208, scale(rng) * 0.02f);
        break;
      default:
        break;
    }
  }
  return out;
}

struct Matrix {
  cuda::DeviceBuffer buf;
  cuda::DeviceMatrix m;
};

// A [rows, cols] matrix filled from the device copy of the pattern (whole blocks each time).
Matrix make_matrix(GgmlType type, int64_t rows, int64_t cols, const cuda::DeviceBuffer& pattern,
                   size_t pattern_bytes, int64_t* total_bytes) {
  Matrix x;
  const int64_t row_bytes = ggml_row_bytes(type, cols);
  const size_t bytes = static_cast<size_t>(rows * row_bytes);
  x.buf = cuda::DeviceBuffer(bytes);
  for (size_t off = 0; off < bytes; off += pattern_bytes) {
    cuda::copy_device(static_cast<uint8_t*>(x.buf.data()) + off, pattern.data(),
                      std::min(pattern_bytes, bytes - off));
  }
  x.m.type = type;
  x.m.data = x.buf.data();
  x.m.rows = rows;
  x.m.cols = cols;
  x.m.row_bytes = row_bytes;
  *total_bytes += static_cast<int64_t>(bytes);
  return x;
}

struct Layer {
  Matrix q, k, v, o, gate, up, down;
};

struct Acts {
  cuda::DeviceBuffer x, h, q, k, v, o, g, u, logits, norm;
};

void pass(const std::vector<Layer>& layers, const Matrix& output, Acts& a, int64_t n) {
  const float eps = 1e-5f;
  float* x = a.x.as<float>();
  float* h = a.h.as<float>();
  const float* nw = a.norm.as<float>();
  for (const Layer& L : layers) {
    cuda::rmsnorm(x, nw, eps, n, kDim, h);
    cuda::matmul(L.q.m, h, n, a.q.as<float>());
    cuda::matmul(L.k.m, h, n, a.k.as<float>());
    cuda::matmul(L.v.m, h, n, a.v.as<float>());
    // (attention omitted: o reads q's output)
    cuda::matmul(L.o.m, a.q.as<float>(), n, a.o.as<float>());
    cuda::add(x, a.o.as<float>(), n * kDim);
    cuda::rmsnorm(x, nw, eps, n, kDim, h);
    cuda::matmul(L.gate.m, h, n, a.g.as<float>());
    cuda::matmul(L.up.m, h, n, a.u.as<float>());
    cuda::swiglu(a.g.as<float>(), a.u.as<float>(), n * kFfn, a.g.as<float>());
    cuda::matmul(L.down.m, a.g.as<float>(), n, a.o.as<float>());
    cuda::add(x, a.o.as<float>(), n * kDim);
  }
  cuda::rmsnorm(x, nw, eps, n, kDim, h);
  cuda::matmul(output.m, h, n, a.logits.as<float>());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Builds the model of one type, times it, frees it. legacy: the original matmul kernel
// (cuda::set_matmul_legacy) - the "kernel" field of the lines says which ran.
void run_type(GgmlType type, bool graph, int n_layers, bool legacy, double bw) {
  cuda::set_matmul_legacy(legacy);
  const char* kernel = legacy ? "legacy" : "new";
  {
    // Weights.
    const std::vector<uint8_t> host_pattern = random_pattern(type, size_t{64} << 20);
    cuda::DeviceBuffer pattern(host_pattern.size());
    cuda::upload(pattern.data(), host_pattern.data(), host_pattern.size());
    int64_t weight_bytes = 0;
    std::vector<Layer> layers;
    layers.reserve(static_cast<size_t>(n_layers));
    for (int l = 0; l < n_layers; ++l) {
      Layer L;
      const size_t pb = host_pattern.size();
      L.q = make_matrix(type, kDim, kDim, pattern, pb, &weight_bytes);
      L.k = make_matrix(type, kKvDim, kDim, pattern, pb, &weight_bytes);
      L.v = make_matrix(type, kKvDim, kDim, pattern, pb, &weight_bytes);
      L.o = make_matrix(type, kDim, kDim, pattern, pb, &weight_bytes);
      L.gate = make_matrix(type, kFfn, kDim, pattern, pb, &weight_bytes);
      L.up = make_matrix(type, kFfn, kDim, pattern, pb, &weight_bytes);
      L.down = make_matrix(type, kDim, kFfn, pattern, pb, &weight_bytes);
      layers.push_back(std::move(L));
    }
    const Matrix output =
        make_matrix(type, kVocab, kDim, pattern, host_pattern.size(), &weight_bytes);

    // Activations.
    Acts a;
    auto floats = [](int64_t n) { return cuda::DeviceBuffer(static_cast<size_t>(n) * 4); };
    a.x = floats(kMaxN * kDim);
    a.h = floats(kMaxN * kDim);
    a.q = floats(kMaxN * kDim);
    a.k = floats(kMaxN * kKvDim);
    a.v = floats(kMaxN * kKvDim);
    a.o = floats(kMaxN * kDim);
    a.g = floats(kMaxN * kFfn);
    a.u = floats(kMaxN * kFfn);
    a.logits = floats(kMaxN * kVocab);
    a.norm = floats(kDim);
    {
      std::mt19937 rng(7);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(kMaxN * kDim));
      for (float& v : x) v = nd(rng);
      cuda::upload(a.x.data(), x.data(), x.size() * 4);
      std::vector<float> w(static_cast<size_t>(kDim), 1.0f);
      cuda::upload(a.norm.data(), w.data(), w.size() * 4);
    }
    cuda::synchronize();

    cudaStream_t s = cuda::detail::stream();
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    auto time_ms = [&](auto&& body) {
      CUDA_CHECK(cudaEventRecord(start, s));
      body();
      CUDA_CHECK(cudaEventRecord(stop, s));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return static_cast<double>(ms);
    };
    const int64_t ns[] = {1, 2, 4, 8, 16};
    auto report = [&](const char* mode, int64_t n, double ms, double ms1) {
      const double gbs = static_cast<double>(weight_bytes) / (ms * 1e-3) / 1e9;
      std::printf("{\"type\": \"%s\", \"n\": %lld, \"mode\": \"%s\", \"ms\": %.4f, "
                  "\"weight_bytes\": %lld, \"achieved_gbs\": %.1f, "
                  "\"fraction_of_measured_bw\": %.3f, \"cost_vs_n1\": %.3f, \"layers\": %d, "
                  "\"attention\": \"omitted\", \"kernel\": \"%s\"}\n",
                  ggml_type_traits(type).name, static_cast<long long>(n), mode, ms,
                  static_cast<long long>(weight_bytes), gbs, gbs / bw, ms / ms1, n_layers, kernel);
      std::fflush(stdout);
    };

    double ms1 = 0.0;
    for (int64_t n : ns) {
      for (int w = 0; w < 2; ++w) pass(layers, output, a, n);
      std::vector<double> t;
      for (int r = 0; r < 10; ++r) t.push_back(time_ms([&] { pass(layers, output, a, n); }));
      const double ms = median(t);
      if (n == 1) ms1 = ms;
      report("stream", n, ms, ms1);
    }
    if (graph) {
      double g1 = 0.0;
      for (int64_t n : ns) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        pass(layers, output, a, n);
        CUDA_CHECK(cudaStreamEndCapture(s, &g));
        CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
        for (int w = 0; w < 2; ++w) CUDA_CHECK(cudaGraphLaunch(exec, s));
        std::vector<double> t;
        for (int r = 0; r < 10; ++r) {
          t.push_back(time_ms([&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); }));
        }
        const double ms = median(t);
        if (n == 1) g1 = ms;
        report("graph", n, ms, g1);
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(g));
      }
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    cuda::synchronize();
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    const size_t b = std::min(s.find(',', a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> type_names = {"Q8_0"};
  bool graph = false;
  bool ab = false;
  bool legacy_only = false;
  int n_layers = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--type" || a == "--types") && i + 1 < argc) {
      type_names = split(argv[++i]);
    } else if (a == "--all") {
      type_names = {"Q8_0", "Q4_1", "F16"};
      graph = true;
    } else if (a == "--graph") {
      graph = true;
    } else if (a == "--ab") {
      ab = true;
    } else if (a == "--legacy") {
      legacy_only = true;
    } else if (a == "--layers" && i + 1 < argc) {
      n_layers = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: bench_cuda_shapes [--type Q8_0|F16|Q4_1|...] [--types Q8_0,Q4_1,F16] "
                   "[--all (= --types Q8_0,Q4_1,F16 --graph)] [--graph] [--ab (also the legacy "
                   "kernel)] [--legacy (only the legacy kernel)] [--layers 32]\n");
      return 2;
    }
  }
  if (!cuda::available()) {
    std::fprintf(stderr, "bench_cuda_shapes: no CUDA device\n");
    return 1;
  }
  std::vector<GgmlType> types;
  for (const std::string& t : type_names) types.push_back(parse_type(t));
  try {
    const cuda::DeviceInfo info = cuda::device_info();
    const double bw = cuda::measure_bandwidth_gbs();
    std::printf("{\"gpu\": \"%s\", \"cc\": \"%d.%d\", \"sms\": %d, \"total_gib\": %.1f, "
                "\"measured_bw_gbs\": %.1f}\n",
                info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count,
                static_cast<double>(info.total_bytes) / (1 << 30), bw);
    std::fflush(stdout);
    for (GgmlType type : types) {
      if (!legacy_only) run_type(type, graph, n_layers, false, bw);
      if (ab || legacy_only) run_type(type, graph, n_layers, true, bw);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cuda_shapes: %s\n", e.what());
    return 1;
  }
  return 0;
}
