// The decode-pass cost of a Llama-3-8B-shaped model on the GPU as a function of the number of
// tokens per pass (n = 1, 2, 4, 8, 16): what speculative verification of n tokens costs against
// decoding one.
//
// Random weights of one type (--type Q8_0 default, F16, Q4_1 or any matmul type) in the shapes of
// Llama 3 8B: dim 4096, 32 layers of q 4096x4096, k/v 1024x4096, o 4096x4096, gate/up
// 14336x4096, down 4096x14336, and the output matrix 128256x4096. Two layouts of a layer:
//   --layout engine (default): as the engine's CUDA forward runs it (llama_cuda.cpp, fused): q|k|v
//     stacked into one 6144x4096 matrix and gate|up into one 28672x4096; add + rmsnorm in one
//     kernel; swiglu over the stacked gate|up rows; 4 matmuls a layer.
//   --layout separate: rmsnorm, the q/k/v/o matmuls, add, rmsnorm, gate/up, swiglu, down, add
//     (7 matmuls a layer, each with its own activation quantization).
// Then the final rmsnorm and the output matmul. ATTENTION IS OMITTED (its cost depends on the context length; o takes
// q's output as its input). Timed with CUDA events on the backend's stream: 2 passes of warm-up,
// then the median of 10. --graph captures each pass in a CUDA graph and times its replay too.
//
// Output, JSON lines: first {"gpu":..., "measured_bw_gbs":...}, then one line per (type, kernel,
// mode, n):
//   {"type", "n", "mode" ("stream" / "graph"), "layout", "ms", "weight_bytes", "achieved_gbs" (weight
//    bytes / time), "fraction_of_measured_bw", "cost_vs_n1", "kernel" ("new" / "legacy")}
// Each type's weights are freed before the next type's are made.
//
//   bench_cuda_shapes [--type Q8_0 | --types Q8_0,Q4_1,F16 | --all] [--graph] [--ab] [--legacy]
//                     [--layers 32] [--layout engine|separate|both]
//   --all: Q8_0, Q4_1 and F16 with --graph. --ab: each type also with the legacy matmul kernel
//   (cuda::set_matmul_legacy), --legacy: only with it.
//
//   bench_cuda_shapes --sweep [--types Q8_0,Q4_1] [--layers 32]
//   The offline autotune of the int8 matmul (cuda_matmul_q32.cu): every kernel variant (all give
//   the same bits) on the 8B shapes, n = 1, 2, 4, 8, 16, CUDA graph replay, median of 10. One line
//   per (type, kind, variant, pdl_early, n):
//     {"sweep": 1, "type", "kind" ("gemv": every n on the GEMV kernel, SPECDEC_CUDA_GEMV_MAX_N=16;
//      "mma": every n on the mma kernel, SPECDEC_CUDA_GEMV_MAX_N=0; "dispatch": the shipped
//      defaults), "variant", "pdl_early" (0 / 1), "n", "ms", "achieved_gbs",
//      "fraction_of_measured_bw", "vs_default" (ms / the shipped dispatch's ms at that n)}
//   then per (type, n) {"best": 1, ...} (the fastest configuration overall, and the fastest GEMV
//   and mma ones) with the environment that selects it (SPECDEC_CUDA_GEMV_MAX_N,
//   SPECDEC_CUDA_GEMV_VARIANT, SPECDEC_CUDA_MMA_VARIANT, SPECDEC_CUDA_PDL_EARLY).
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

namespace specdec::cuda::detail {
// cuda_matmul_q32.cu: the kernel variants of the int8 matmul (kind 0: GEMV, 1: mma; 0 = the
// default), the GEMV's largest n, the early PDL triggers. Setters return the previous value.
int64_t q32_set_gemv_max_n(int64_t n);
int q32_variant_count(int kind);
const char* q32_variant_name(int kind, int i);
int q32_set_variant(int kind, int i);
bool q32_set_pdl_early(bool on);
}  // namespace specdec::cuda::detail

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

// separate: q, k, v, gate, up set; engine: qkv [q_dim + 2 kv_dim, dim] and gate_up [2 ffn, dim].
struct Layer {
  Matrix q, k, v, o, gate, up, down;
  Matrix qkv, gate_up;
};

// Float activations, [kMaxN, width] each; qkv holds q|k|v rows of the engine layout, g the stacked
// gate|up rows (2 kFfn wide) there.
struct Acts {
  cuda::DeviceBuffer x, h, q, k, v, o, g, u, logits, norm, qkv;
};

enum class Layout { kEngine, kSeparate };

const char* layout_name(Layout l) { return l == Layout::kEngine ? "engine" : "separate"; }

// The engine's fused layer (llama_cuda.cpp with fusion on): the first rmsnorm alone, later ones
// fused with the residual add of the layer before.
void pass_engine(const std::vector<Layer>& layers, const Matrix& output, Acts& a, int64_t n) {
  const float eps = 1e-5f;
  float* x = a.x.as<float>();
  float* h = a.h.as<float>();
  const float* nw = a.norm.as<float>();
  cuda::rmsnorm(x, nw, eps, n, kDim, h);
  for (const Layer& L : layers) {
    cuda::matmul(L.qkv.m, h, n, a.qkv.as<float>());
    // (attention omitted: o reads the q columns' buffer, [n, 6144] read as [n, 4096] rows)
    cuda::matmul(L.o.m, a.qkv.as<float>(), n, a.o.as<float>());
    cuda::add_rmsnorm(x, a.o.as<float>(), nw, eps, n, kDim, h);
    cuda::matmul(L.gate_up.m, h, n, a.g.as<float>());
    cuda::swiglu_rows(a.g.as<float>(), n, kFfn, a.u.as<float>());
    cuda::matmul(L.down.m, a.u.as<float>(), n, a.o.as<float>());
    cuda::add_rmsnorm(x, a.o.as<float>(), nw, eps, n, kDim, h);
  }
  cuda::matmul(output.m, h, n, a.logits.as<float>());
}

void pass(Layout layout, const std::vector<Layer>& layers, const Matrix& output, Acts& a,
          int64_t n) {
  if (layout == Layout::kEngine) {
    pass_engine(layers, output, a, n);
    return;
  }
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

// The model of one type: weights (from a device copy of a random pattern) and activations.
struct Model {
  std::vector<Layer> layers;
  Matrix output;
  Acts a;
  Layout layout = Layout::kEngine;
  int64_t weight_bytes = 0;
};

void build_model(GgmlType type, int n_layers, Layout layout, Model* m) {
  m->layout = layout;
  const std::vector<uint8_t> host_pattern = random_pattern(type, size_t{64} << 20);
  cuda::DeviceBuffer pattern(host_pattern.size());
  cuda::upload(pattern.data(), host_pattern.data(), host_pattern.size());
  m->layers.reserve(static_cast<size_t>(n_layers));
  const size_t pb = host_pattern.size();
  int64_t* wb = &m->weight_bytes;
  for (int l = 0; l < n_layers; ++l) {
    Layer L;
    if (layout == Layout::kEngine) {
      L.qkv = make_matrix(type, kDim + 2 * kKvDim, kDim, pattern, pb, wb);
      L.o = make_matrix(type, kDim, kDim, pattern, pb, wb);
      L.gate_up = make_matrix(type, 2 * kFfn, kDim, pattern, pb, wb);
    } else {
      L.q = make_matrix(type, kDim, kDim, pattern, pb, wb);
      L.k = make_matrix(type, kKvDim, kDim, pattern, pb, wb);
      L.v = make_matrix(type, kKvDim, kDim, pattern, pb, wb);
      L.o = make_matrix(type, kDim, kDim, pattern, pb, wb);
      L.gate = make_matrix(type, kFfn, kDim, pattern, pb, wb);
      L.up = make_matrix(type, kFfn, kDim, pattern, pb, wb);
    }
    L.down = make_matrix(type, kDim, kFfn, pattern, pb, wb);
    m->layers.push_back(std::move(L));
  }
  m->output = make_matrix(type, kVocab, kDim, pattern, pb, wb);

  Acts& a = m->a;
  auto floats = [](int64_t n) { return cuda::DeviceBuffer(static_cast<size_t>(n) * 4); };
  a.x = floats(kMaxN * kDim);
  a.h = floats(kMaxN * kDim);
  a.q = floats(kMaxN * kDim);
  a.k = floats(kMaxN * kKvDim);
  a.v = floats(kMaxN * kKvDim);
  a.o = floats(kMaxN * kDim);
  a.g = floats(kMaxN * 2 * kFfn);
  a.u = floats(kMaxN * kFfn);
  a.qkv = floats(kMaxN * (kDim + 2 * kKvDim));
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
}

struct Timer {
  cudaStream_t s = cuda::detail::stream();
  cudaEvent_t start = nullptr, stop = nullptr;
  Timer() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  template <class F>
  double ms(F&& body) {
    CUDA_CHECK(cudaEventRecord(start, s));
    body();
    CUDA_CHECK(cudaEventRecord(stop, s));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float v = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&v, start, stop));
    return static_cast<double>(v);
  }
};

// The median of 10 graph replays of a pass of n tokens (one plain pass first: scratch, kernel
// attributes and modules are set up outside the capture; 2 replays of warm-up).
double graph_ms(Model& m, Timer& timer, int64_t n) {
  cudaStream_t s = timer.s;
  pass(m.layout, m.layers, m.output, m.a, n);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  pass(m.layout, m.layers, m.output, m.a, n);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (int w = 0; w < 2; ++w) CUDA_CHECK(cudaGraphLaunch(exec, s));
  std::vector<double> t;
  for (int r = 0; r < 10; ++r) t.push_back(timer.ms([&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); }));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(g));
  return median(t);
}

// Builds the model of one type, times it, frees it. legacy: the original matmul kernel
// (cuda::set_matmul_legacy) - the "kernel" field of the lines says which ran.
void run_type(GgmlType type, bool graph, int n_layers, Layout layout, bool legacy, double bw) {
  cuda::set_matmul_legacy(legacy);
  const char* kernel = legacy ? "legacy" : "new";
  {
    Model m;
    build_model(type, n_layers, layout, &m);
    const int64_t weight_bytes = m.weight_bytes;
    Timer timer;
    const int64_t ns[] = {1, 2, 4, 8, 16};
    auto report = [&](const char* mode, int64_t n, double ms, double ms1) {
      const double gbs = static_cast<double>(weight_bytes) / (ms * 1e-3) / 1e9;
      std::printf("{\"type\": \"%s\", \"n\": %lld, \"mode\": \"%s\", \"layout\": \"%s\", "
                  "\"ms\": %.4f, "
                  "\"weight_bytes\": %lld, \"achieved_gbs\": %.1f, "
                  "\"fraction_of_measured_bw\": %.3f, \"cost_vs_n1\": %.3f, \"layers\": %d, "
                  "\"attention\": \"omitted\", \"kernel\": \"%s\"}\n",
                  ggml_type_traits(type).name, static_cast<long long>(n), mode,
                  layout_name(layout), ms,
                  static_cast<long long>(weight_bytes), gbs, gbs / bw, ms / ms1, n_layers, kernel);
      std::fflush(stdout);
    };

    double ms1 = 0.0;
    for (int64_t n : ns) {
      for (int w = 0; w < 2; ++w) pass(layout, m.layers, m.output, m.a, n);
      std::vector<double> t;
      for (int r = 0; r < 10; ++r) {
        t.push_back(timer.ms([&] { pass(layout, m.layers, m.output, m.a, n); }));
      }
      const double ms = median(t);
      if (n == 1) ms1 = ms;
      report("stream", n, ms, ms1);
    }
    if (graph) {
      double g1 = 0.0;
      for (int64_t n : ns) {
        const double ms = graph_ms(m, timer, n);
        if (n == 1) g1 = ms;
        report("graph", n, ms, g1);
      }
    }
    cuda::synchronize();
  }
}

// ---- --sweep: every variant of the int8 matmul ---------------------------------------------------

struct SweepConfig {
  const char* kind;  // "dispatch", "gemv", "mma"
  int variant;
  bool early;
};

struct SweepResult {
  SweepConfig c;
  int64_t n;
  double ms;
};

void run_sweep(GgmlType type, int n_layers, Layout layout, double bw) {
  namespace d = cuda::detail;
  cuda::set_matmul_legacy(false);
  const int64_t default_max_n = d::q32_set_gemv_max_n(2);
  d::q32_set_gemv_max_n(default_max_n);
  // The configurations: the shipped dispatch (also with the early PDL triggers), every GEMV and
  // mma variant, and the early triggers with a few of them.
  std::vector<SweepConfig> configs;
  configs.push_back({"dispatch", 0, false});
  configs.push_back({"dispatch", 0, true});
  for (int v = 0; v < d::q32_variant_count(0); ++v) configs.push_back({"gemv", v, false});
  for (int v = 0; v < d::q32_variant_count(1); ++v) configs.push_back({"mma", v, false});
  auto find = [&](int kind, const char* name) {
    for (int v = 0; v < d::q32_variant_count(kind); ++v) {
      if (std::strcmp(d::q32_variant_name(kind, v), name) == 0) return v;
    }
    return -1;
  };
  for (const char* name : {"default", "r1s4", "r1s8", "r2s3", "r1s6w8"}) {
    const int v = find(0, name);
    if (v >= 0) configs.push_back({"gemv", v, true});
  }
  for (const char* name : {"fast", "fast_pdl", "g2s4f_pdl", "g2s3f_t8_pdl"}) {
    const int v = find(1, name);
    if (v >= 0) configs.push_back({"mma", v, true});
  }

  Model m;
  build_model(type, n_layers, layout, &m);
  Timer timer;
  const char* tname = ggml_type_traits(type).name;
  const int64_t ns[] = {1, 2, 4, 8, 16};
  std::vector<SweepResult> results;
  double default_ms[17] = {};
  for (const SweepConfig& c : configs) {
    const bool gemv = std::strcmp(c.kind, "gemv") == 0;
    const bool mma = std::strcmp(c.kind, "mma") == 0;
    d::q32_set_gemv_max_n(gemv ? 16 : (mma ? 0 : default_max_n));
    d::q32_set_variant(0, gemv ? c.variant : 0);
    d::q32_set_variant(1, mma ? c.variant : 0);
    d::q32_set_pdl_early(c.early);
    const char* vname = d::q32_variant_name(gemv ? 0 : 1, c.variant);
    for (int64_t n : ns) {
      double ms = 0.0;
      try {
        ms = graph_ms(m, timer, n);
      } catch (const Error& e) {
        std::printf("{\"sweep\": 1, \"type\": \"%s\", \"kind\": \"%s\", \"variant\": \"%s\", "
                    "\"pdl_early\": %d, \"n\": %lld, \"error\": \"%s\"}\n",
                    tname, c.kind, vname, c.early ? 1 : 0, static_cast<long long>(n), e.what());
        std::fflush(stdout);
        (void)cudaGetLastError();
        continue;
      }
      if (std::strcmp(c.kind, "dispatch") == 0 && !c.early) default_ms[n] = ms;
      results.push_back({c, n, ms});
      const double gbs = static_cast<double>(m.weight_bytes) / (ms * 1e-3) / 1e9;
      std::printf("{\"sweep\": 1, \"type\": \"%s\", \"kind\": \"%s\", \"variant\": \"%s\", "
                  "\"pdl_early\": %d, \"n\": %lld, \"ms\": %.4f, \"achieved_gbs\": %.1f, "
                  "\"fraction_of_measured_bw\": %.3f, \"vs_default\": %.3f}\n",
                  tname, c.kind, vname, c.early ? 1 : 0, static_cast<long long>(n), ms, gbs,
                  gbs / bw, default_ms[n] > 0.0 ? ms / default_ms[n] : 0.0);
      std::fflush(stdout);
    }
  }
  d::q32_set_gemv_max_n(default_max_n);
  d::q32_set_variant(0, 0);
  d::q32_set_variant(1, 0);
  d::q32_set_pdl_early(false);

  // The best configuration per n: overall, GEMV only, mma only.
  for (int64_t n : ns) {
    for (const char* which : {"any", "gemv", "mma"}) {
      const SweepResult* best = nullptr;
      for (const SweepResult& r : results) {
        if (r.n != n) continue;
        if (std::strcmp(which, "any") != 0 && std::strcmp(r.c.kind, which) != 0) continue;
        if (best == nullptr || r.ms < best->ms) best = &r;
      }
      if (best == nullptr) continue;
      const bool gemv = std::strcmp(best->c.kind, "gemv") == 0;
      const bool mma = std::strcmp(best->c.kind, "mma") == 0;
      const char* vname = d::q32_variant_name(gemv ? 0 : 1, best->c.variant);
      const double gbs = static_cast<double>(m.weight_bytes) / (best->ms * 1e-3) / 1e9;
      char env[256];
      std::snprintf(env, sizeof env,
                    "SPECDEC_CUDA_GEMV_MAX_N=%d SPECDEC_CUDA_GEMV_VARIANT=%s "
                    "SPECDEC_CUDA_MMA_VARIANT=%s SPECDEC_CUDA_PDL_EARLY=%d",
                    gemv ? 16 : (mma ? 0 : static_cast<int>(default_max_n)),
                    gemv ? vname : "default", mma ? vname : "default", best->c.early ? 1 : 0);
      std::printf("{\"best\": 1, \"type\": \"%s\", \"n\": %lld, \"among\": \"%s\", \"kind\": "
                  "\"%s\", \"variant\": \"%s\", \"pdl_early\": %d, \"ms\": %.4f, "
                  "\"fraction_of_measured_bw\": %.3f, \"default_ms\": %.4f, \"vs_default\": %.3f, "
                  "\"env\": \"%s\"}\n",
                  tname, static_cast<long long>(n), which, best->c.kind, vname,
                  best->c.early ? 1 : 0, best->ms, gbs / bw, default_ms[n],
                  default_ms[n] > 0.0 ? best->ms / default_ms[n] : 0.0, env);
    }
  }
  std::fflush(stdout);
  cuda::synchronize();
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
  bool sweep = false;
  bool types_given = false;
  int n_layers = 32;
  std::vector<Layout> layouts = {Layout::kEngine};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--type" || a == "--types") && i + 1 < argc) {
      type_names = split(argv[++i]);
      types_given = true;
    } else if (a == "--sweep") {
      sweep = true;
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
    } else if (a == "--layout" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v == "engine") {
        layouts = {Layout::kEngine};
      } else if (v == "separate") {
        layouts = {Layout::kSeparate};
      } else if (v == "both") {
        layouts = {Layout::kEngine, Layout::kSeparate};
      } else {
        std::fprintf(stderr, "bench_cuda_shapes: --layout takes engine, separate or both\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_cuda_shapes [--type Q8_0|F16|Q4_1|...] [--types Q8_0,Q4_1,F16] "
                   "[--all (= --types Q8_0,Q4_1,F16 --graph)] [--graph] [--ab (also the legacy "
                   "kernel)] [--legacy (only the legacy kernel)] [--layers 32] "
                   "[--layout engine|separate|both]\n"
                   "       bench_cuda_shapes --sweep [--types Q8_0,Q4_1] [--layers 32] "
                   "[--layout engine|separate]\n");
      return 2;
    }
  }
  if (!cuda::available()) {
    std::fprintf(stderr, "bench_cuda_shapes: no CUDA device\n");
    return 1;
  }
  if (sweep && !types_given) type_names = {"Q8_0", "Q4_1"};
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
      for (Layout layout : layouts) {
        if (sweep) {
          run_sweep(type, n_layers, layout, bw);
          continue;
        }
        if (!legacy_only) run_type(type, graph, n_layers, layout, false, bw);
        if (ab || legacy_only) run_type(type, graph, n_layers, layout, true, bw);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cuda_shapes: %s\n", e.what());
    return 1;
  }
  return 0;
}
