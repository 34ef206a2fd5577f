// Conformance of the training GEMM (drafter/train/train_gemm.h):
//  * every SIMD variant equals the scalar reference BIT FOR BIT, for the three layouts of a
//    linear layer and general strides, odd shapes (tails of every tile, k across the KC blocks),
//    accumulate on and off, column slices (leading dimension > width);
//  * the result does not depend on the thread count;
//  * the reference is the exact sum within float rounding (checked against double).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/thread_pool.h"
#include "common/sanitizer.h"
#include "drafter/train/train_gemm.h"

namespace specdec {
namespace {

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// The layouts a linear layer needs, plus a generic strided one (neither stride 1).
enum class Layout { kForward, kBackwardInput, kBackwardWeight, kStrided };

struct Problem {
  int64_t m, n, k;
  std::vector<float> a_buf, b_buf;
  MatView a, b;
  int64_t ldc;
};

Problem make_problem(Layout layout, int64_t m, int64_t n, int64_t k, uint32_t seed) {
  Problem p{m, n, k, {}, {}, {}, {}, n + 3};
  // Every operand sits inside a wider buffer (leading dimension + 5) to test slices.
  const int64_t pad = 5;
  switch (layout) {
    case Layout::kForward:  // A = X [m, k] row-major, B = Wᵀ with W [n, k]
      p.a_buf = random_floats((m * (k + pad)) + 1, seed);
      p.b_buf = random_floats((n * (k + pad)) + 1, seed + 1);
      p.a = {p.a_buf.data(), k + pad, 1};
      p.b = {p.b_buf.data() + 1, 1, k + pad};
      break;
    case Layout::kBackwardInput:  // A = dY [m, k] row-major, B = W [k, n] row-major
      p.a_buf = random_floats((m * (k + pad)) + 1, seed);
      p.b_buf = random_floats((k * (n + pad)) + 1, seed + 1);
      p.a = {p.a_buf.data(), k + pad, 1};
      p.b = {p.b_buf.data() + 1, n + pad, 1};
      break;
    case Layout::kBackwardWeight:  // A = dYᵀ with dY [k, m], B = X [k, n] row-major
      p.a_buf = random_floats((k * (m + pad)) + 1, seed);
      p.b_buf = random_floats((k * (n + pad)) + 1, seed + 1);
      p.a = {p.a_buf.data() + 1, 1, m + pad};
      p.b = {p.b_buf.data(), n + pad, 1};
      break;
    case Layout::kStrided:
      p.a_buf = random_floats((m * 2 + 1) * (k * 3 + 1), seed);
      p.b_buf = random_floats((k * 2 + 1) * (n * 2 + 1), seed + 1);
      p.a = {p.a_buf.data(), 3 * k + 1, 2};
      p.b = {p.b_buf.data(), 2, 2 * k + 1};
      break;
  }
  return p;
}

std::vector<float> run(Isa isa, const Problem& p, bool accumulate, ThreadPool* pool,
                       uint32_t c_seed) {
  std::vector<float> c = random_floats(std::max<int64_t>(p.m * p.ldc, 1), c_seed);
  train_gemm_isa(isa, p.m, p.n, p.k, p.a, p.b, c.data(), p.ldc, accumulate, pool);
  return c;
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

const Layout kLayouts[] = {Layout::kForward, Layout::kBackwardInput, Layout::kBackwardWeight,
                           Layout::kStrided};

TEST(TrainGemm, EveryVariantEqualsTheReferenceBitForBit) {
  const std::vector<Isa> isas = simd_isas();
  if (isas.empty()) GTEST_SKIP() << "no SIMD variant on this CPU";
  ThreadPool pool2(2);
  const int64_t ms[] = {0, 1, 5, 6, 8, 13, 48, 50, 97, 200};
  const int64_t ns[] = {1, 7, 16, 17, 48, 49, 100, 161};
  const int64_t ks[] = {0, 1, 3, 16, 17, 255, 256, 257, 530};
  int checked = 0;
  uint32_t seed = 1;
  for (Layout layout : kLayouts) {
    for (int64_t m : ms) {
      for (int64_t n : ns) {
        for (int64_t k : ks) {
          // Keep the sweep quick: the big sizes only with a few partners (fewer still under a
          // sanitizer, where the scalar reference runs 50x slower; every edge size stays).
          if (m * n * k > (test::kSanitizerBuild ? 300'000 : 3'000'000)) continue;
          const Problem p = make_problem(layout, m, n, k, seed++);
          for (bool accumulate : {false, true}) {
            const std::vector<float> ref = run(Isa::kScalar, p, accumulate, nullptr, seed);
            for (Isa isa : isas) {
              const std::vector<float> got = run(isa, p, accumulate, &pool2, seed);
              ASSERT_TRUE(bitwise_equal(ref, got))
                  << isa_name(isa) << " layout " << static_cast<int>(layout) << " m=" << m
                  << " n=" << n << " k=" << k << " accumulate=" << accumulate;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(TrainGemm, ThreadCountChangesNoBit) {
  // Shapes large enough that the pool splits rows (m large) and columns (n large).
  ThreadPool pool1(1), pool2(2), pool3(3);
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  for (Isa isa : isas) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{301, 70, 300}, {40, 517, 290}}) {
      for (Layout layout : kLayouts) {
        const Problem p = make_problem(layout, m, n, k, 77);
        const std::vector<float> one = run(isa, p, true, &pool1, 5);
        EXPECT_TRUE(bitwise_equal(one, run(isa, p, true, &pool2, 5))) << isa_name(isa);
        EXPECT_TRUE(bitwise_equal(one, run(isa, p, true, &pool3, 5))) << isa_name(isa);
        EXPECT_TRUE(bitwise_equal(one, run(isa, p, true, nullptr, 5))) << isa_name(isa);
      }
    }
  }
}

TEST(TrainGemm, ReferenceIsTheExactProductWithinRounding) {
  for (Layout layout : kLayouts) {
    const int64_t m = 9, n = 11, k = 300;
    const Problem p = make_problem(layout, m, n, k, 5);
    std::vector<float> c0 = random_floats(m * p.ldc, 9);
    std::vector<float> c = c0;
    train_gemm_isa(Isa::kScalar, m, n, k, p.a, p.b, c.data(), p.ldc, /*accumulate=*/true,
                   nullptr);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = c0[i * p.ldc + j], abs_sum = std::fabs(exact);
        for (int64_t q = 0; q < k; ++q) {
          const double t = double(p.a.data[i * p.a.rs + q * p.a.cs]) *
                           double(p.b.data[q * p.b.rs + j * p.b.cs]);
          exact += t;
          abs_sum += std::fabs(t);
        }
        // k roundings of at most 2^-24 of the running magnitude each.
        EXPECT_NEAR(c[i * p.ldc + j], exact, abs_sum * k * 0x1p-24 + 1e-6);
      }
      // The columns past n (the leading dimension's slack) are untouched.
      for (int64_t j = n; j < p.ldc; ++j) EXPECT_EQ(c[i * p.ldc + j], c0[i * p.ldc + j]);
    }
  }
}

TEST(TrainGemm, ZeroReductionClearsOrKeeps) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> c(6, 2.5f);
    train_gemm_isa(isa, 2, 3, 0, {nullptr, 0, 1}, {nullptr, 0, 1}, c.data(), 3, true, nullptr);
    EXPECT_EQ(c, std::vector<float>(6, 2.5f));
    train_gemm_isa(isa, 2, 3, 0, {nullptr, 0, 1}, {nullptr, 0, 1}, c.data(), 3, false, nullptr);
    EXPECT_EQ(c, std::vector<float>(6, 0.0f));
  }
}

// The named products of a linear layer are the right transposes (against plain loops).
TEST(TrainGemm, LinearLayerProducts) {
  const int64_t rows = 13, n_in = 21, n_out = 10;
  const std::vector<float> x = random_floats(rows * n_in, 1), w = random_floats(n_out * n_in, 2),
                           dy = random_floats(rows * n_out, 3);
  std::vector<float> y(rows * n_out), dx(rows * n_in), dw(n_out * n_in, 1.0f);
  ThreadPool pool(2);
  linear_forward(rows, n_in, n_out, x.data(), n_in, w.data(), n_in, y.data(), n_out, false, &pool);
  linear_backward_input(rows, n_in, n_out, dy.data(), n_out, w.data(), n_in, dx.data(), n_in,
                        false, &pool);
  linear_backward_weight(rows, n_in, n_out, dy.data(), n_out, x.data(), n_in, dw.data(), n_in,
                         true, &pool);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < n_in; ++i) s += double(x[r * n_in + i]) * w[o * n_in + i];
      EXPECT_NEAR(y[r * n_out + o], s, 1e-4);
    }
    for (int64_t i = 0; i < n_in; ++i) {
      double s = 0;
      for (int64_t o = 0; o < n_out; ++o) s += double(dy[r * n_out + o]) * w[o * n_in + i];
      EXPECT_NEAR(dx[r * n_in + i], s, 1e-4);
    }
  }
  for (int64_t o = 0; o < n_out; ++o) {
    for (int64_t i = 0; i < n_in; ++i) {
      double s = 1.0;
      for (int64_t r = 0; r < rows; ++r) s += double(dy[r * n_out + o]) * x[r * n_in + i];
      EXPECT_NEAR(dw[o * n_in + i], s, 1e-4);
    }
  }
}

}  // namespace
}  // namespace specdec
