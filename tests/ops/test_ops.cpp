// Conformance of the element-wise and attention ops: every variant the machine supports against
// the scalar reference (rmsnorm, swiglu, softmax) or against a direct formula in double (rope,
// attention), on random data with odd sizes, empty inputs, tree masks and GQA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_blocks.h"  // fp16_to_fp32, fp32_to_fp16: the scalar conversions
#include "backend/cpu/thread_pool.h"
#include "backend/k_tiles.h"
#include "common/attention_cases.h"

namespace specdec {
namespace {

// Unit roundoff of float: every correctly rounded float operation errs by at most u relative.
constexpr double kU = FLT_EPSILON / 2;

using test::attention_naive;
using test::attention_variants;
using test::first_bitwise_difference;
using test::make_shape;
using test::random_mask;
using test::random_vector;
using test::tree_mask;
using test::visible;

const int64_t kSizes[] = {1, 7, 8, 15, 16, 17, 64, 172, 192, 576, 1536};

// SIMD variants only (the reference is compared with itself nowhere).
std::vector<Isa> simd_variants() {
  std::vector<Isa> out;
  for (Isa isa : attention_variants()) {
    if (isa != Isa::kScalar) out.push_back(isa);
  }
  return out;
}

// The variants under test are those the CPU has: the run-time detection agrees with the kernel's
// own report of the CPU's features (/proc/cpuinfo's flags), and the active variant is one of them
// (SPECDEC_ISA, when set, picks it).
TEST(Ops, ReportsVariantsTheCpuHas) {
  std::string names;
  for (Isa isa : attention_variants()) names += std::string(isa_name(isa)) + " ";
  RecordProperty("variants", names);
  std::printf("variants under test: %s(active: %s)\n", names.c_str(), isa_name(active_isa()));
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  EXPECT_TRUE(isa_supported(active_isa()));
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags to compare with";
  auto has = [&](const char* f) { return flags.find(" " + std::string(f) + " ") != std::string::npos; };
  const bool avx2 = has("avx2") && has("fma") && has("f16c");
  const bool avx512 = has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") &&
                      has("avx512_vnni");
  const bool avxvnni = avx2 && has("avx_vnni");
  EXPECT_EQ(isa_supported(Isa::kAvx2), avx2) << flags;
  EXPECT_EQ(isa_supported(Isa::kAvxVnni), avxvnni) << flags;
  EXPECT_EQ(isa_supported(Isa::kAvx512), avx512) << flags;
  const char* forced = std::getenv("SPECDEC_ISA");
  bool forced_supported = false;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512}) {
    forced_supported |=
        isa_supported(isa) && forced != nullptr && std::string(forced) == isa_name(isa);
  }
  if (forced_supported) {
    EXPECT_STREQ(isa_name(active_isa()), forced);
  } else {
    EXPECT_EQ(active_isa(), avx512    ? Isa::kAvx512
                            : avxvnni ? Isa::kAvxVnni
                            : avx2    ? Isa::kAvx2
                                      : Isa::kScalar);
  }
}

// --- rmsnorm -----------------------------------------------------------------------------------

// The SIMD variants sum squares in float over >= 8 lanes: the sum errs by at most
// (dim/8 + 4)·u relative (≤ 196·u for dim 1536), 1/sqrt halves that, and the two products add
// 2·u, so every output is within 1e-5 relative of the double-accumulating reference.
TEST(Ops, RmsnormMatchesReference) {
  std::mt19937 gen(1);
  for (Isa isa : simd_variants()) {
    for (int64_t dim : kSizes) {
      for (int64_t n_rows : {0, 1, 3}) {
        const std::vector<float> x =
            random_vector(gen, n_rows * dim, -2.0f, 2.0f);                  // [n_rows, dim]
        const std::vector<float> w = random_vector(gen, dim, -1.5f, 1.5f);  // [dim]
        std::vector<float> want(x.size() + 1, 7.0f);  // [n_rows, dim] + a guard element
        std::vector<float> got(x.size() + 1, 7.0f);
        rmsnorm_isa(Isa::kScalar, x.data(), w.data(), 1e-5f, n_rows, dim, want.data());
        rmsnorm_isa(isa, x.data(), w.data(), 1e-5f, n_rows, dim, got.data());
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-30)
              << isa_name(isa) << " dim " << dim << " rows " << n_rows << " at " << i;
        }
        EXPECT_EQ(got.back(), 7.0f) << "wrote past the end";
        // In place (y aliases x) gives the same values.
        std::vector<float> inplace = x;
        rmsnorm_isa(isa, inplace.data(), w.data(), 1e-5f, n_rows, dim, inplace.data());
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(inplace[i], got[i]);
      }
    }
  }
}

TEST(Ops, RmsnormReferenceFormula) {
  // x = [3, 4]: mean square 12.5, eps 0.5 → 1/sqrt(13) scale.
  const float x[2] = {3.0f, 4.0f};
  const float w[2] = {1.0f, -2.0f};
  float y[2];
  rmsnorm_isa(Isa::kScalar, x, w, 0.5f, 1, 2, y);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(13.0), 1e-7);
  EXPECT_NEAR(y[1], -8.0 / std::sqrt(13.0), 1e-7);
}

// --- swiglu ------------------------------------------------------------------------------------

// Inputs mostly in [-8, 8] plus some near the exp overflow / underflow limits.
std::vector<float> swiglu_gate(std::mt19937& gen, int64_t n) {
  std::vector<float> g = random_vector(gen, n, -8.0f, 8.0f);
  std::uniform_real_distribution<float> extreme(80.0f, 100.0f);
  for (size_t i = 3; i < g.size(); i += 11) g[i] = (i % 2 ? -1.0f : 1.0f) * extreme(gen);
  return g;
}

// Against silu(g)·up in double. exp (glibc's or the vector one) is within 1 ulp; 1 + e, the
// product and the quotient round once each: ≤ 4·u relative (measured ≤ 2.9·u on a dense grid
// over [-87, 88] for every variant). Absolute 1e-36: below g = -88.7 exp(-g) overflows to inf
// (in every variant, as in libm) and the result is 0 instead of |g·e^g·up| < 1e-36.
TEST(Ops, SwigluMatchesFormula) {
  std::mt19937 gen(2);
  for (Isa isa : attention_variants()) {
    for (int64_t n : kSizes) {
      const std::vector<float> gate = swiglu_gate(gen, n);               // [n]
      const std::vector<float> up = random_vector(gen, n, -3.0f, 3.0f);  // [n]
      std::vector<float> got(static_cast<size_t>(n) + 1, 7.0f);          // [n] + guard
      swiglu_isa(isa, gate.data(), up.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i];
        const double want = g / (1.0 + std::exp(-g)) * up[i];
        ASSERT_NEAR(got[i], want, 4 * kU * std::fabs(want) + 1e-36)
            << isa_name(isa) << " n " << n << " gate " << gate[i];
      }
      EXPECT_EQ(got.back(), 7.0f) << "wrote past the end";
      std::vector<float> inplace = gate;
      swiglu_isa(isa, inplace.data(), up.data(), n, inplace.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(inplace[i], got[i]);
    }
    swiglu_isa(isa, nullptr, nullptr, 0, nullptr);  // empty: touches nothing
  }
}

// softmax({0, x}) = e^x / (1 + e^x) exercises exp over its whole useful range: exp ≤ 1 ulp, the
// sum and the quotient ≤ 1 rounding each, so ≤ 4·u relative (measured ≤ 3.1·u).
TEST(Ops, SoftmaxExpAccuracy) {
  for (Isa isa : attention_variants()) {
    for (int i = 0; i <= 20000; ++i) {
      const float x = -87.0f + 87.0f * static_cast<float>(i) / 20000.0f;
      float v[2] = {0.0f, x};
      softmax_isa(isa, v, 2);
      const double ex = std::exp(static_cast<double>(x));
      ASSERT_NEAR(v[1], ex / (1.0 + ex), 4 * kU * ex / (1.0 + ex)) << isa_name(isa) << " x " << x;
      ASSERT_NEAR(v[0], 1.0 / (1.0 + ex), 4 * kU) << isa_name(isa) << " x " << x;
    }
  }
}

TEST(Ops, SwigluReferenceFormula) {
  const float gate[3] = {0.0f, 1.0f, -2.0f};
  const float up[3] = {5.0f, 2.0f, 3.0f};
  float out[3];
  swiglu_isa(Isa::kScalar, gate, up, 3, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(out[2], 3.0 * -2.0 / (1.0 + std::exp(2.0)), 1e-6);
}

// --- softmax -----------------------------------------------------------------------------------

// Each exp errs by ≤ 3 ulp; the SIMD sum over ≥ 32 float lanes by ≤ (n/32 + 5)·u ≤ 53·u for
// n = 1536; the scaling adds 2·u: ≤ 60·u ≈ 3.6e-6 relative, checked at 1e-5. Values whose
// shifted logit is below ln(FLT_MIN) are 0 or denormal (≤ 1.2e-38): absolute 1e-37.
TEST(Ops, SoftmaxMatchesReference) {
  std::mt19937 gen(3);
  for (Isa isa : simd_variants()) {
    for (int64_t n : kSizes) {
      for (float spread : {1.0f, 20.0f, 90.0f}) {
        const std::vector<float> x = random_vector(gen, n, -spread, spread);  // [n]
        std::vector<float> want = x;
        std::vector<float> got = x;
        softmax_isa(Isa::kScalar, want.data(), n);
        softmax_isa(isa, got.data(), n);
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5 * want[i] + 1e-37)
              << isa_name(isa) << " n " << n << " spread " << spread;
          sum += got[i];
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
      }
    }
  }
}

// log_sum_exp_inplace (the beam search's normalizer) on the active ISA's softmax kernels: within
// the kernels' relative error of a double reference, and the row left as exp(x - max).
TEST(Ops, LogSumExpMatchesADoubleReference) {
  std::mt19937 gen(7);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{4096}}) {
    for (float spread : {1.0f, 30.0f}) {
      std::vector<float> x = random_vector(gen, n, -spread, spread);  // [n]
      const float m = *std::max_element(x.begin(), x.end());
      double sum = 0.0;
      for (float v : x) sum += std::exp(static_cast<double>(v) - m);
      const double want = m + std::log(sum);
      std::vector<float> row = x;
      const float got = log_sum_exp_inplace(row.data(), n);
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want))) << "n " << n;
      for (int64_t i = 0; i < n; ++i) {
        const double e = std::exp(static_cast<double>(x[i]) - m);
        ASSERT_NEAR(row[i], e, 1e-5 * e + 1e-37) << "n " << n << " i " << i;
      }
    }
  }
}

TEST(Ops, SoftmaxMaskedEntriesAreZero) {
  for (Isa isa : attention_variants()) {
    std::vector<float> x = {1.0f,      -INFINITY, 2.0f,      -INFINITY, -INFINITY, 0.5f,
                            -INFINITY, -INFINITY, -INFINITY, 3.0f,      -INFINITY, -INFINITY,
                            -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 1.0f};  // [18]
    softmax_isa(isa, x.data(), static_cast<int64_t>(x.size()));
    const double z = std::exp(1.0) * 2 + std::exp(2.0) + std::exp(0.5) + std::exp(3.0);
    EXPECT_NEAR(x[0], std::exp(1.0) / z, 1e-6) << isa_name(isa);
    EXPECT_NEAR(x[9], std::exp(3.0) / z, 1e-6) << isa_name(isa);
    for (int i : {1, 3, 4, 6, 7, 8, 10, 16}) EXPECT_EQ(x[i], 0.0f) << isa_name(isa) << " " << i;
  }
}

TEST(Ops, DispatchUsesActiveVariant) {
  std::mt19937 gen(4);
  const int64_t n = 333;
  const std::vector<float> x = random_vector(gen, n, -4.0f, 4.0f);
  const std::vector<float> w = random_vector(gen, n, -1.0f, 1.0f);
  std::vector<float> a(n), b(n);
  rmsnorm(x.data(), w.data(), 1e-6f, 1, n, a.data());
  rmsnorm_isa(active_isa(), x.data(), w.data(), 1e-6f, 1, n, b.data());
  EXPECT_EQ(a, b);
  swiglu(x.data(), w.data(), n, a.data());
  swiglu_isa(active_isa(), x.data(), w.data(), n, b.data());
  EXPECT_EQ(a, b);
  a = x;
  b = x;
  softmax(a.data(), n);
  softmax_isa(active_isa(), b.data(), n);
  EXPECT_EQ(a, b);
}

// --- rope --------------------------------------------------------------------------------------

// rope in double for one head vector, rotating the pairs of `style`.
std::vector<double> rope_direct(const float* x, int head_dim, int rope_dim, int pos,
                                double freq_base, double freq_scale, RopeStyle style) {
  std::vector<double> y(x, x + head_dim);
  for (int i = 0; i < rope_dim / 2; ++i) {
    const double theta = pos * freq_scale * std::pow(freq_base, -2.0 * i / rope_dim);
    const int a = style == RopeStyle::kNorm ? 2 * i : i;
    const int b = style == RopeStyle::kNorm ? 2 * i + 1 : i + rope_dim / 2;
    y[a] = x[a] * std::cos(theta) - x[b] * std::sin(theta);
    y[b] = x[a] * std::sin(theta) + x[b] * std::cos(theta);
  }
  return y;
}

// rope computes theta in float: freq_base^(-2i/d) (≤ 1 ulp) times pos and freq_scale (2
// roundings) errs by ≤ 3·u·θ, which moves the rotated pair by ≤ (|x_a| + |x_b|)·3·u·θ; cos, sin
// and the products and sum add ≤ 4·u·(|x_a| + |x_b|). At θ ≈ 8191 this is ≈ 1.5e-3·|x|: float
// angles are what llama.cpp computes, and the bound grows with the position accordingly.
TEST(Ops, RopeMatchesDirectFormula) {
  std::mt19937 gen(5);
  const int32_t positions[] = {0, 1, 5, 100, 4095, 8191, 5, 1};  // repeats, as in tree decoding
  const int64_t n_tokens = 8;
  const int n_heads = 3;
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    for (int head_dim : {64, 16}) {
      for (int rope_dim : {head_dim, head_dim / 2, 2}) {
        for (float freq_scale : {1.0f, 0.25f}) {
          const float freq_base = 10000.0f;
          // [n_tokens, n_heads, head_dim]
          const std::vector<float> x = random_vector(gen, n_tokens * n_heads * head_dim, -1, 1);
          std::vector<float> y = x;
          rope(y.data(), positions, n_tokens, n_heads, head_dim, rope_dim, freq_base, freq_scale,
               style);
          for (int64_t t = 0; t < n_tokens; ++t) {
            const double theta_max = positions[t] * static_cast<double>(freq_scale);
            for (int h = 0; h < n_heads; ++h) {
              const int64_t off = (t * n_heads + h) * head_dim;
              const std::vector<double> want = rope_direct(
                  x.data() + off, head_dim, rope_dim, positions[t], freq_base, freq_scale, style);
              for (int d = 0; d < head_dim; ++d) {
                if (d >= rope_dim) {
                  ASSERT_EQ(y[off + d], x[off + d]) << "dims past rope_dim pass through";
                  continue;
                }
                ASSERT_NEAR(y[off + d], want[d], 2.0 * (3 * kU * theta_max + 4 * kU))
                    << "style " << static_cast<int>(style) << " pos " << positions[t] << " d " << d
                    << " rope_dim " << rope_dim;
              }
            }
          }
          // Position 0 is the identity.
          for (int64_t d = 0; d < n_heads * head_dim; ++d) ASSERT_EQ(y[d], x[d]);
        }
      }
    }
  }
}

// kNorm on x equals kNeox on x with the pairs (2i, 2i+1) moved to (i, i + d/2).
TEST(Ops, RopeStylesAgreeUnderPermutation) {
  std::mt19937 gen(6);
  const int head_dim = 32, rope_dim = 32, n_heads = 2;
  const int32_t positions[] = {3, 77, 1000};
  const std::vector<float> x = random_vector(gen, 3 * n_heads * head_dim, -1, 1);
  std::vector<float> norm = x;
  std::vector<float> neox(x.size());
  for (int64_t row = 0; row < 3 * n_heads; ++row) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      neox[row * head_dim + i] = x[row * head_dim + 2 * i];
      neox[row * head_dim + i + rope_dim / 2] = x[row * head_dim + 2 * i + 1];
    }
  }
  rope(norm.data(), positions, 3, n_heads, head_dim, rope_dim, 500000.0f, 1.0f, RopeStyle::kNorm);
  rope(neox.data(), positions, 3, n_heads, head_dim, rope_dim, 500000.0f, 1.0f, RopeStyle::kNeox);
  for (int64_t row = 0; row < 3 * n_heads; ++row) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      EXPECT_EQ(norm[row * head_dim + 2 * i], neox[row * head_dim + i]);
      EXPECT_EQ(norm[row * head_dim + 2 * i + 1], neox[row * head_dim + i + rope_dim / 2]);
    }
  }
  const std::vector<float> before = norm;
  rope(norm.data(), positions, 0, n_heads, head_dim, rope_dim, 1e4f, 1.0f, RopeStyle::kNorm);
  EXPECT_EQ(norm, before) << "n_tokens = 0 changes nothing";
}

// --- argmax ------------------------------------------------------------------------------------

TEST(Ops, ArgmaxFirstOnTies) {
  const float a[] = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f};
  EXPECT_EQ(argmax(a, 5), 1);
  const float b[] = {-5.0f};
  EXPECT_EQ(argmax(b, 1), 0);
  const float c[] = {-INFINITY, -INFINITY, -1.0f};
  EXPECT_EQ(argmax(c, 3), 2);
  std::mt19937 gen(7);
  std::vector<float> big = random_vector(gen, 49152, -10.0f, 10.0f);
  big[31337] = 11.0f;
  big[40000] = 11.0f;
  EXPECT_EQ(argmax(big.data(), static_cast<int64_t>(big.size())), 31337);
}

// --- attention ---------------------------------------------------------------------------------

struct AttentionCase {
  AttentionShape shape;
  std::vector<uint8_t> mask;  // empty: causal (nullptr)
};

// Checks every variant, with no pool and with pools of 2 and 3 threads, against the naive
// double result; results must be bitwise equal across pool sizes (each head's arithmetic is the
// same whichever thread or task runs it).
//
// Tolerance: q, k, v in [-1, 1]. A float dot product of length hd errs by ≤ hd·u·Σ|q_d·k_d| ≤
// hd²·u, times scale: δ; it moves each probability by ≤ 2δ relative. exp adds ≤ 3 ulp; Σp (float)
// and the float accumulation of Σ p_j·v_j over n visible rows add ≤ (n + 2)·u each, relative to
// max|v| ≤ 1. So |out - exact| ≤ 2δ + (2n + 8)·u.
void check_attention(const AttentionCase& c, ThreadPool* pool2, ThreadPool* pool3,
                     std::mt19937& gen) {
  const AttentionShape& s = c.shape;
  const int64_t n_kv = s.n_past + s.n_new;
  const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -1, 1);
  const std::vector<float> k = random_vector(gen, n_kv * s.n_kv_heads * s.head_dim, -1, 1);
  const std::vector<float> v = random_vector(gen, n_kv * s.n_kv_heads * s.head_dim, -1, 1);
  const uint8_t* mask = c.mask.empty() ? nullptr : c.mask.data();
  const std::vector<double> want = attention_naive(s, q, k, v, mask);
  const double delta = static_cast<double>(s.head_dim) * s.head_dim * kU * s.scale;
  const double tol = 2 * delta + (2.0 * n_kv + 8) * kU;
  for (Isa isa : attention_variants()) {
    const size_t n_out = static_cast<size_t>(s.n_new * s.n_heads * s.head_dim);
    std::vector<float> out(n_out + 1, 7.0f);  // [n_new, n_heads, head_dim] + guard
    attention_isa(isa, s, q.data(), k.data(), v.data(), mask, out.data(), nullptr);
    for (size_t e = 0; e < n_out; ++e) {
      ASSERT_NEAR(out[e], want[e], tol)
          << isa_name(isa) << " n_past " << s.n_past << " n_new " << s.n_new << " heads "
          << s.n_heads << "/" << s.n_kv_heads << " hd " << s.head_dim << " mask "
          << (mask ? "explicit" : "causal") << " at " << e;
    }
    EXPECT_EQ(out.back(), 7.0f) << "wrote past the end";
    for (ThreadPool* pool : {pool2, pool3}) {
      std::vector<float> threaded(n_out + 1, 7.0f);
      attention_isa(isa, s, q.data(), k.data(), v.data(), mask, threaded.data(), pool);
      ASSERT_EQ(threaded, out) << isa_name(isa) << " with " << pool->size() << " threads";
    }
  }
}

TEST(Ops, AttentionMatchesNaive) {
  std::mt19937 gen(8);
  ThreadPool pool2(2), pool3(3);
  for (int ratio : {1, 2, 3}) {
    for (int head_dim : {64, 20, 8}) {
      for (int64_t n_past : {0, 1, 17, 130}) {
        for (int64_t n_new : {1, 2, 7, 16}) {
          const AttentionShape s = make_shape(n_past, n_new, 2 * ratio, 2, head_dim);
          check_attention({s, {}}, &pool2, &pool3, gen);
          check_attention({s, tree_mask(gen, n_new)}, &pool2, &pool3, gen);
          check_attention({s, random_mask(gen, n_new)}, &pool2, &pool3, gen);
        }
      }
    }
  }
}

TEST(Ops, AttentionModelShapes) {
  std::mt19937 gen(9);
  ThreadPool pool2(2), pool3(3);
  // SmolLM2-135M (9/3 heads of 64), a Llama-style 32/8 of 128, multi-query 16/1, and a group of
  // 70 heads sharing one KV head (blocks of 3 tokens).
  check_attention({make_shape(37, 5, 9, 3, 64), {}}, &pool2, &pool3, gen);
  check_attention({make_shape(37, 5, 9, 3, 64), tree_mask(gen, 5)}, &pool2, &pool3, gen);
  check_attention({make_shape(11, 3, 32, 8, 128), {}}, &pool2, &pool3, gen);
  check_attention({make_shape(64, 4, 16, 1, 64), tree_mask(gen, 4)}, &pool2, &pool3, gen);
  check_attention({make_shape(5, 2, 70, 1, 16), {}}, &pool2, &pool3, gen);
  check_attention({make_shape(0, 1, 4, 4, 7), {}}, &pool2, &pool3, gen);
}

TEST(Ops, AttentionLongContext) {
  std::mt19937 gen(10);
  ThreadPool pool2(2), pool3(3);
  check_attention({make_shape(8191, 1, 6, 2, 64), {}}, &pool2, &pool3, gen);
  check_attention({make_shape(4000, 9, 9, 3, 64), tree_mask(gen, 9)}, &pool2, &pool3, gen);
  check_attention({make_shape(0, 300, 4, 2, 32), {}}, &pool2, &pool3, gen);
}

// An explicit lower-triangular mask is the causal case.
TEST(Ops, AttentionExplicitCausalMaskEqualsNull) {
  std::mt19937 gen(11);
  const AttentionShape s = make_shape(10, 6, 6, 2, 32);
  const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -1, 1);
  const std::vector<float> k = random_vector(gen, 16 * s.n_kv_heads * s.head_dim, -1, 1);
  const std::vector<float> v = random_vector(gen, 16 * s.n_kv_heads * s.head_dim, -1, 1);
  std::vector<uint8_t> causal(36, 0);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j <= i; ++j) causal[i * 6 + j] = 1;
  }
  for (Isa isa : attention_variants()) {
    std::vector<float> a(q.size()), b(q.size());
    attention_isa(isa, s, q.data(), k.data(), v.data(), nullptr, a.data(), nullptr);
    attention_isa(isa, s, q.data(), k.data(), v.data(), causal.data(), b.data(), nullptr);
    EXPECT_EQ(a, b) << isa_name(isa);
  }
}

TEST(Ops, AttentionEmptyAndUnseen) {
  ThreadPool pool2(2);
  for (Isa isa : attention_variants()) {
    // n_new = 0: nothing is read or written.
    float guard = 7.0f;
    AttentionShape empty = make_shape(5, 0, 4, 2, 8);
    attention_isa(isa, empty, nullptr, nullptr, nullptr, nullptr, &guard, &pool2);
    EXPECT_EQ(guard, 7.0f);
    // A query that sees no slot at all (n_past = 0, empty mask row) gets zeros.
    const AttentionShape s = make_shape(0, 2, 2, 1, 8);
    const std::vector<float> q(2 * 2 * 8, 0.5f), k(2 * 8, 0.25f), v(2 * 8, 3.0f);
    const uint8_t mask[4] = {0, 0, 1, 1};
    std::vector<float> out(2 * 2 * 8, 7.0f);
    attention_isa(isa, s, q.data(), k.data(), v.data(), mask, out.data(), &pool2);
    for (int e = 0; e < 16; ++e) EXPECT_EQ(out[e], 0.0f);
    for (int e = 16; e < 32; ++e) EXPECT_NEAR(out[e], 3.0f, 1e-6);
  }
}

// --- attention: bit-exact invariance ------------------------------------------------------------

// What speculative decoding relies on: every query token of a multi-token call gets bitwise the
// output of a one-token call (n_new = 1, causal) over a cache that holds exactly the slots it
// sees, in slot order, so n_past = visible - 1. Checked for every variant, with no pool and with
// pools of 2 and 3 threads on both sides.
void check_attention_invariance(const AttentionShape& s, const std::vector<uint8_t>& mask_bytes,
                                ThreadPool* pool2, ThreadPool* pool3, std::mt19937& gen) {
  const uint8_t* mask = mask_bytes.empty() ? nullptr : mask_bytes.data();
  const int64_t n_kv = s.n_past + s.n_new;
  const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  const int64_t q_row = static_cast<int64_t>(s.n_heads) * s.head_dim;
  const std::vector<float> q = random_vector(gen, s.n_new * q_row, -2, 2);  // [n_new, q_row]
  const std::vector<float> k = random_vector(gen, n_kv * kv_row, -2, 2);    // [n_kv, kv_row]
  const std::vector<float> v = random_vector(gen, n_kv * kv_row, -1, 1);    // [n_kv, kv_row]
  ThreadPool* const pools[3] = {nullptr, pool2, pool3};
  auto threads = [](const ThreadPool* pool) { return pool == nullptr ? 1 : pool->size(); };
  for (Isa isa : attention_variants()) {
    std::vector<float> multi[3];  // per pool: [n_new, q_row]
    for (int p = 0; p < 3; ++p) {
      multi[p].resize(static_cast<size_t>(s.n_new * q_row));
      attention_isa(isa, s, q.data(), k.data(), v.data(), mask, multi[p].data(), pools[p]);
    }
    for (int64_t i = 0; i < s.n_new; ++i) {
      std::vector<float> k1, v1;  // [n_visible, kv_row]: the slots token i sees, in order
      for (int64_t slot = 0; slot < n_kv; ++slot) {
        if (!visible(s, mask, i, slot)) continue;
        k1.insert(k1.end(), k.begin() + slot * kv_row, k.begin() + (slot + 1) * kv_row);
        v1.insert(v1.end(), v.begin() + slot * kv_row, v.begin() + (slot + 1) * kv_row);
      }
      const int64_t n_visible = static_cast<int64_t>(k1.size()) / kv_row;
      if (n_visible == 0) continue;  // zeros; AttentionEmptyAndUnseen covers it
      AttentionShape one = s;
      one.n_past = n_visible - 1;
      one.n_new = 1;
      for (ThreadPool* pool : pools) {
        std::vector<float> alone(static_cast<size_t>(q_row));  // [q_row]
        attention_isa(isa, one, q.data() + i * q_row, k1.data(), v1.data(), nullptr, alone.data(),
                      pool);
        for (int p = 0; p < 3; ++p) {
          const float* batched = multi[p].data() + i * q_row;  // [q_row]
          const int64_t e = first_bitwise_difference(alone.data(), batched, q_row);
          ASSERT_EQ(e, -1) << isa_name(isa) << " n_past " << s.n_past << " n_new " << s.n_new
                           << " heads " << s.n_heads << "/" << s.n_kv_heads << " hd " << s.head_dim
                           << " mask " << (mask ? "explicit" : "causal") << ": token " << i << " ("
                           << n_visible << " visible), element " << e << ": alone with "
                           << threads(pool) << " threads " << alone[e] << ", batched with "
                           << threads(pools[p]) << " threads " << batched[e];
        }
      }
    }
  }
}

TEST(Ops, AttentionTokenOutputIndependentOfBatch) {
  std::mt19937 gen(12);
  ThreadPool pool2(2), pool3(3);
  // SmolLM2-135M heads: chains, trees and arbitrary masks over verification-sized batches, with
  // prefixes that span several K/V tiles.
  for (int64_t n_past : {0, 1, 37, 60, 300}) {
    for (int64_t n_new : {1, 2, 5, 8, 16}) {
      const AttentionShape s = make_shape(n_past, n_new, 9, 3, 64);
      check_attention_invariance(s, {}, &pool2, &pool3, gen);
      check_attention_invariance(s, tree_mask(gen, n_new), &pool2, &pool3, gen);
      check_attention_invariance(s, random_mask(gen, n_new), &pool2, &pool3, gen);
    }
  }
  // Several blocks of tokens (threads sharing each block, or one block per task: 70 heads make
  // blocks of 3 tokens), head_dim with SIMD tails, and one KV head per query head.
  check_attention_invariance(make_shape(0, 64, 9, 3, 64), {}, &pool2, &pool3, gen);
  check_attention_invariance(make_shape(20, 50, 9, 3, 64), tree_mask(gen, 50), &pool2, &pool3, gen);
  check_attention_invariance(make_shape(100, 30, 70, 1, 16), {}, &pool2, &pool3, gen);
  check_attention_invariance(make_shape(10, 40, 70, 2, 16), random_mask(gen, 40), &pool2, &pool3,
                             gen);
  check_attention_invariance(make_shape(13, 7, 6, 2, 20), {}, &pool2, &pool3, gen);
  check_attention_invariance(make_shape(13, 7, 6, 2, 20), random_mask(gen, 7), &pool2, &pool3, gen);
  check_attention_invariance(make_shape(9, 5, 4, 2, 7), tree_mask(gen, 5), &pool2, &pool3, gen);
  check_attention_invariance(make_shape(40, 6, 4, 4, 8), random_mask(gen, 6), &pool2, &pool3, gen);
}

// Prefill-sized batches: enough blocks that each is one thread's task (merges fused with the
// Σ p·v), against tokens decoded alone (threads sharing one block, merges from stored chunks);
// chunk boundaries inside blocks, and a tree whose runs cross chunk boundaries.
TEST(Ops, AttentionTokenOutputIndependentOfBatchPrefill) {
  std::mt19937 gen(13);
  ThreadPool pool2(2), pool3(3);
  check_attention_invariance(make_shape(0, 200, 9, 3, 64), {}, &pool2, &pool3, gen);
  check_attention_invariance(make_shape(70, 150, 9, 3, 64), tree_mask(gen, 150), &pool2, &pool3,
                             gen);
}

// Scores far apart (|q| up to 150: score spreads of hundreds of nats, so many exp(s - max) and
// merge weights fall below the smallest normal float) still match the naive result, with no NaN.
TEST(Ops, AttentionExtremeScoreSpreads) {
  std::mt19937 gen(14);
  ThreadPool pool2(2);
  for (const AttentionShape& s : {make_shape(300, 3, 9, 3, 64), make_shape(0, 140, 4, 2, 16)}) {
    const int64_t n_kv = s.n_past + s.n_new;
    const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -150, 150);
    const std::vector<float> k = random_vector(gen, n_kv * s.n_kv_heads * s.head_dim, -1, 1);
    const std::vector<float> v = random_vector(gen, n_kv * s.n_kv_heads * s.head_dim, -1, 1);
    const std::vector<double> want = attention_naive(s, q, k, v, nullptr);
    for (Isa isa : attention_variants()) {
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        std::vector<float> out(q.size());
        attention_isa(isa, s, q.data(), k.data(), v.data(), nullptr, out.data(), pool);
        for (size_t e = 0; e < out.size(); ++e) {
          ASSERT_NEAR(out[e], want[e], 1e-4)
              << isa_name(isa) << " n_past " << s.n_past << " at " << e;
        }
      }
    }
  }
}

// The fused Σ p·v + merge kernel gives bitwise what the two separate steps give (a prefetch hint
// or none).
TEST(Ops, AttentionFusedMergeEqualsSeparate) {
  std::mt19937 gen(15);
  for (Isa isa : attention_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    for (int head_dim : {64, 20, 7, 128}) {
      for (int n_q : {1, 3, 6, 13}) {
        for (int64_t n_rows : {1, 17, 64}) {
          const std::vector<float> p = random_vector(gen, n_q * kAttnChunk, 0, 1);  // [n_q, 64]
          const std::vector<float> v = random_vector(gen, n_rows * 2 * head_dim, -1, 1);
          const std::vector<float> wo = random_vector(gen, n_q, 0, 1);
          const std::vector<float> wn = random_vector(gen, n_q, 0, 1);
          const std::vector<float> state = random_vector(gen, n_q * head_dim, -3, 3);
          std::vector<float> a(static_cast<size_t>(n_q * head_dim), 0.0f);  // [n_q, head_dim]
          kern.attn_accumulate(p.data(), kAttnChunk, n_q, v.data(), 2 * head_dim, n_rows, head_dim,
                               a.data(), {});
          std::vector<float> separate = state, fused = state;
          kern.attn_merge_rows(a.data(), n_q, head_dim, wo.data(), wn.data(), separate.data());
          // All of V as a prefetch hint: it must change nothing.
          const AttnPrefetch next{v.data(), static_cast<int64_t>(v.size() * sizeof(float))};
          kern.attn_accumulate_merge(p.data(), kAttnChunk, n_q, v.data(), 2 * head_dim, n_rows,
                                     head_dim, wo.data(), wn.data(), fused.data(), next);
          ASSERT_EQ(first_bitwise_difference(separate.data(), fused.data(), n_q * head_dim), -1)
              << isa_name(isa) << " head_dim " << head_dim << " n_q " << n_q << " rows " << n_rows;
        }
      }
    }
  }
}

// The f16-V kernels (where a variant has them) give bitwise what the float kernels give on the
// converted rows, accumulating and fused with the merge, head_dim tails included.
TEST(Ops, AttentionF16VEqualsFloatRows) {
  std::mt19937 gen(17);
  for (Isa isa : attention_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    if (kern.attn_accumulate_f16 == nullptr) continue;
    ASSERT_NE(kern.attn_accumulate_merge_f16, nullptr) << isa_name(isa);
    for (int head_dim : {64, 20, 7, 128}) {
      for (int n_q : {1, 2, 3, 6, 13}) {
        for (int64_t n_rows : {1, 17, 64}) {
          const int64_t stride = 3 * head_dim;  // rows of 3 KV heads; head 1 is used
          const std::vector<float> p = random_vector(gen, n_q * kAttnChunk, 0, 1);  // [n_q, 64]
          const std::vector<float> x = random_vector(gen, n_rows * stride, -1, 1);
          std::vector<uint16_t> v16(x.size());
          std::vector<float> v(x.size());
          for (size_t e = 0; e < x.size(); ++e) {
            v16[e] = fp32_to_fp16(x[e]);
            v[e] = fp16_to_fp32(v16[e]);
          }
          const std::vector<float> wo = random_vector(gen, n_q, 0, 1);
          const std::vector<float> wn = random_vector(gen, n_q, 0, 1);
          const std::vector<float> state = random_vector(gen, n_q * head_dim, -3, 3);
          std::vector<float> want = state, got = state;  // [n_q, head_dim]
          kern.attn_accumulate(p.data(), kAttnChunk, n_q, v.data() + head_dim, stride, n_rows,
                               head_dim, want.data(), {});
          kern.attn_accumulate_f16(p.data(), kAttnChunk, n_q, v16.data() + head_dim, stride, n_rows,
                                   head_dim, got.data(), {});
          ASSERT_EQ(first_bitwise_difference(want.data(), got.data(), n_q * head_dim), -1)
              << isa_name(isa) << " head_dim " << head_dim << " n_q " << n_q << " rows " << n_rows;
          want = state;
          got = state;
          kern.attn_accumulate_merge(p.data(), kAttnChunk, n_q, v.data() + head_dim, stride, n_rows,
                                     head_dim, wo.data(), wn.data(), want.data(), {});
          kern.attn_accumulate_merge_f16(p.data(), kAttnChunk, n_q, v16.data() + head_dim, stride,
                                         n_rows, head_dim, wo.data(), wn.data(), got.data(), {});
          ASSERT_EQ(first_bitwise_difference(want.data(), got.data(), n_q * head_dim), -1)
              << "merge " << isa_name(isa) << " head_dim " << head_dim << " n_q " << n_q;
        }
      }
    }
  }
}

// Query rows packed from runs of rows (the query heads of one KV head, token by token) give the
// packing of the same rows copied together, and scores with a prefetch hint equal those without.
TEST(Ops, AttentionPackRunsAndPrefetchHints) {
  std::mt19937 gen(16);
  for (Isa isa : attention_variants()) {
    const OpsKernels& kern = ops_kernels_for(isa, true);
    for (int head_dim : {64, 20, 7}) {
      for (int run_rows : {1, 3, 4}) {
        const int n_runs = 5;
        const int n_q = run_rows * n_runs;
        const int64_t run_stride = static_cast<int64_t>(run_rows + 2) * head_dim;
        const std::vector<float> q = random_vector(gen, n_runs * run_stride, -1, 1);
        std::vector<float> rows(static_cast<size_t>(n_q * head_dim));  // [n_q, head_dim]
        for (int r = 0; r < n_q; ++r) {
          std::copy_n(q.data() + r / run_rows * run_stride + r % run_rows * head_dim, head_dim,
                      rows.data() + r * head_dim);
        }
        const int64_t packed_n = attn_packed_floats(n_q, head_dim);
        std::vector<float> from_runs(static_cast<size_t>(packed_n), 0.0f);
        std::vector<float> from_rows(static_cast<size_t>(packed_n), 0.0f);
        kern.attn_pack_q(q.data(), n_q, run_rows, run_stride, head_dim, 0.3f, from_runs.data());
        kern.attn_pack_q(rows.data(), n_q, n_q, 0, head_dim, 0.3f, from_rows.data());
        ASSERT_EQ(first_bitwise_difference(from_runs.data(), from_rows.data(), packed_n), -1)
            << isa_name(isa) << " head_dim " << head_dim << " run_rows " << run_rows;

        const int64_t n_k = 37;
        const std::vector<float> k = random_vector(gen, n_k * 2 * head_dim, -1, 1);
        std::vector<float> plain(static_cast<size_t>(n_q * kAttnChunk), 0.0f);
        std::vector<float> hinted = plain;
        kern.attn_scores(from_runs.data(), n_q, k.data(), 2 * head_dim, n_k, head_dim, plain.data(),
                         kAttnChunk, {});
        const AttnPrefetch next{k.data(), static_cast<int64_t>(k.size() * sizeof(float))};
        kern.attn_scores(from_runs.data(), n_q, k.data(), 2 * head_dim, n_k, head_dim,
                         hinted.data(), kAttnChunk, next);
        ASSERT_EQ(first_bitwise_difference(plain.data(), hinted.data(), n_q * kAttnChunk), -1)
            << isa_name(isa) << " head_dim " << head_dim << " n_q " << n_q;
      }
    }
  }
}

// --- f16 KV cache --------------------------------------------------------------------------------

// Every half converts exactly (bitwise as the scalar fp16_to_fp32; NaNs stay NaNs) in every
// variant, at every position of a vector and its tail.
TEST(Ops, F16ToF32AllHalvesEveryVariant) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : attention_variants()) {
    std::vector<float> out(all.size() + 1, 7.0f);
    f16_to_f32_isa(isa, all.data(), static_cast<int64_t>(all.size()) - 3, out.data());
    for (int i = 0; i < 65536 - 3; ++i) {
      const float want = fp16_to_fp32(all[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i])) << isa_name(isa) << " half " << i;
      } else {
        ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << isa_name(isa) << " half " << i;
      }
    }
    EXPECT_EQ(out[65536 - 3], 7.0f) << isa_name(isa) << " wrote past n";
  }
}

// Rounding to half: the SIMD variants equal the scalar round-to-nearest-even bit for bit, on
// normal values, ties, subnormal results, overflow to inf and zeros, for every length.
TEST(Ops, F32ToF16EqualsReference) {
  std::mt19937 gen(15);
  std::vector<float> x;
  for (float v :
       {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 65519.99f, 1e6f, -1e6f, INFINITY, -INFINITY,
        6.1e-5f, 5.96e-8f, 2.98e-8f, 1e-10f, 1.00048828125f, 1.00146484375f, 3.0517578125e-05f}) {
    x.push_back(v);
  }
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-30, 17);
  for (int i = 0; i < 5000; ++i) {
    float v = std::ldexp(mant(gen), expo(gen)) * (i % 2 ? -1.0f : 1.0f);
    if (i % 7 == 0) {  // an exact tie between two halves: 11 significant bits and a half
      v = std::ldexp(std::floor(std::ldexp(mant(gen), 10)) + 0.5f, expo(gen) - 10);
    }
    x.push_back(v);
  }
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = fp32_to_fp16(x[i]);
  for (Isa isa : simd_variants()) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{15}, int64_t{16}, int64_t{17},
                      static_cast<int64_t>(x.size())}) {
      std::vector<uint16_t> got(static_cast<size_t>(n) + 1, 0x1234);
      f32_to_f16_isa(isa, x.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " x = " << x[i] << " (n " << n << ")";
      }
      EXPECT_EQ(got[n], 0x1234) << isa_name(isa) << " wrote past n = " << n;
    }
  }
}

// Attention over an f16 cache (K in tiles) is attention over the float cache holding the same
// (rounded) values, bit for bit: every variant, no pool and 2 / 3 threads, causal, tree and
// arbitrary masks, runs across chunk boundaries, head_dim with SIMD tails, slot counts that end
// inside a tile (whose unused lanes hold NaN), 1 to 48 query rows per KV head.
TEST(Ops, AttentionF16CacheEqualsFloatCacheOfSameValues) {
  std::mt19937 gen(16);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* const pools[3] = {nullptr, &pool2, &pool3};
  struct Case {
    AttentionShape s;
    int mask_kind;  // 0 causal, 1 tree, 2 arbitrary
  };
  const Case cases[] = {{make_shape(0, 1, 9, 3, 64), 0},
                        {make_shape(300, 1, 9, 3, 64), 0},
                        {make_shape(130, 8, 9, 3, 64), 1},
                        {make_shape(60, 16, 9, 3, 64), 2},
                        {make_shape(0, 200, 9, 3, 64), 0},
                        {make_shape(20, 70, 4, 2, 20), 1},
                        {make_shape(17, 5, 6, 2, 7), 2},
                        {make_shape(1000, 3, 32, 8, 128), 0},
                        // 1-3 query rows per KV head (the K-tile kernel), head_dim tails:
                        {make_shape(40, 1, 6, 2, 7), 0},
                        {make_shape(33, 1, 4, 2, 20), 0},
                        {make_shape(70, 1, 2, 2, 13), 0},
                        {make_shape(95, 1, 9, 3, 64), 0},
                        // 4 or more rows (the phased kernel): 4-6 rows over whole chunks of 4
                        // tiles, several passes of up to 12 rows, head_dim tails:
                        {make_shape(33, 1, 8, 2, 16), 0},
                        {make_shape(70, 2, 6, 2, 7), 0},
                        {make_shape(140, 2, 9, 3, 64), 1},
                        {make_shape(45, 5, 8, 2, 13), 2},
                        {make_shape(90, 9, 9, 3, 22), 0}};
  for (const Case& c : cases) {
    const AttentionShape& s = c.s;
    const int64_t n_kv = s.n_past + s.n_new;
    const int64_t kv_elems = n_kv * s.n_kv_heads * s.head_dim;
    const std::vector<float> q = random_vector(gen, s.n_new * s.n_heads * s.head_dim, -2, 2);
    std::vector<float> k = random_vector(gen, kv_elems, -2, 2);
    std::vector<float> v = random_vector(gen, kv_elems, -1, 1);
    std::vector<uint16_t> k_rows(static_cast<size_t>(kv_elems)), v16(static_cast<size_t>(kv_elems));
    for (int64_t e = 0; e < kv_elems; ++e) {
      k_rows[e] = fp32_to_fp16(k[e]);
      v16[e] = fp32_to_fp16(v[e]);
      k[e] = fp16_to_fp32(k_rows[e]);
      v[e] = fp16_to_fp32(v16[e]);
    }
    // K of an f16 cache is tiles; the tail of the last tile holds garbage the kernels may read.
    std::vector<uint16_t> k16(static_cast<size_t>(k_tile_slots(n_kv) * s.n_kv_heads * s.head_dim),
                              0x7e00);  // NaN
    k_rows_to_tiles(k_rows.data(), 0, n_kv, s.n_kv_heads, s.head_dim, k16.data());
    const std::vector<uint8_t> mask_bytes = c.mask_kind == 1   ? tree_mask(gen, s.n_new)
                                            : c.mask_kind == 2 ? random_mask(gen, s.n_new)
                                                               : std::vector<uint8_t>{};
    const uint8_t* mask = mask_bytes.empty() ? nullptr : mask_bytes.data();
    const size_t n_out = static_cast<size_t>(s.n_new * s.n_heads * s.head_dim);
    for (Isa isa : attention_variants()) {
      std::vector<float> want(n_out);
      attention_isa(isa, s, q.data(), k.data(), v.data(), mask, want.data(), nullptr);
      for (ThreadPool* pool : pools) {
        std::vector<float> got(n_out + 1, 7.0f);
        attention_isa(isa, s, q.data(), k16.data(), v16.data(), KvType::kF16, mask, got.data(),
                      pool);
        const int64_t e =
            first_bitwise_difference(want.data(), got.data(), static_cast<int64_t>(n_out));
        ASSERT_EQ(e, -1) << isa_name(isa) << " n_past " << s.n_past << " n_new " << s.n_new
                         << " hd " << s.head_dim << " mask kind " << c.mask_kind << " threads "
                         << (pool == nullptr ? 1 : pool->size()) << ": element " << e;
        EXPECT_EQ(got.back(), 7.0f);
      }
    }
  }
}

// Every variant of rope_apply rotates bit for bit as the reference: both styles, rope_dim below
// head_dim, pair counts that are not multiples of the vector width, dims past rope_dim untouched.
TEST(Ops, RopeApplyVariantsEqualReference) {
  std::mt19937 gen(7);
  const int32_t positions[] = {0, 9, 511, 4000, 3};
  const int64_t n_tokens = 5;
  const int n_heads = 3;
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    for (int head_dim : {64, 128, 20, 7}) {
      for (int rope_dim : {head_dim - head_dim % 2, 2 * (head_dim / 4), 2, 34}) {
        if (rope_dim < 2 || rope_dim > head_dim) continue;
        std::vector<float> cos_sin(static_cast<size_t>(n_tokens * rope_dim));
        rope_angles(positions, n_tokens, rope_dim, 10000.0f, 1.0f, cos_sin.data());
        const std::vector<float> x = random_vector(gen, n_tokens * n_heads * head_dim, -3, 3);
        std::vector<float> want = x;
        rope_apply_isa(Isa::kScalar, want.data(), cos_sin.data(), n_tokens, n_heads, head_dim,
                       rope_dim, style);
        for (Isa isa : attention_variants()) {
          std::vector<float> got = x;
          rope_apply_isa(isa, got.data(), cos_sin.data(), n_tokens, n_heads, head_dim, rope_dim,
                         style);
          ASSERT_EQ(
              first_bitwise_difference(want.data(), got.data(), static_cast<int64_t>(want.size())),
              -1)
              << isa_name(isa) << " style " << static_cast<int>(style) << " head_dim " << head_dim
              << " rope_dim " << rope_dim;
        }
      }
    }
  }
}

}  // namespace
}  // namespace specdec
