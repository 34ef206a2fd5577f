// The element-wise kernels of the head's training pass (drafter/train/train_activations.h):
// every variant against plain double-precision math (SiLU, its derivative, softmax
// cross-entropy with its gradient), odd lengths for the lane tails, ties of the argmax (the
// first index wins), extreme logits, and the forward-only mode leaving the logits as they were.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "drafter/train/train_activations.h"

namespace specdec {
namespace {

std::vector<Isa> isas() {
  std::vector<Isa> out = {Isa::kScalar};
  if (isa_supported(Isa::kAvx512)) out.push_back(Isa::kAvx512);
  return out;
}

double silu(double y) { return y / (1 + std::exp(-y)); }
double silu_grad(double y) {
  const double s = 1 / (1 + std::exp(-y));
  return s * (1 + y * (1 - s));
}

TEST(TrainActivations, SiluAndItsDerivative) {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (Isa isa : isas()) {
    for (int64_t n : {1, 15, 16, 17, 100}) {
      std::vector<float> y(n), base(n), dx(n);
      for (int64_t i = 0; i < n; ++i) {
        y[i] = normal(gen);
        base[i] = normal(gen);
        dx[i] = normal(gen);
      }
      y[0] = n > 1 ? -120.0f : 95.0f;  // far tails: exp under/overflow
      std::vector<float> out(n), plain(n), dy = y;
      silu_residual(isa, y.data(), base.data(), out.data(), n);
      silu_residual(isa, y.data(), nullptr, plain.data(), n);
      silu_backward(isa, dx.data(), dy.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double s = silu(y[i]);
        EXPECT_NEAR(plain[i], s, 2e-6 * (1 + std::fabs(s))) << isa_name(isa) << " " << y[i];
        EXPECT_NEAR(out[i], base[i] + s, 2e-6 * (1 + std::fabs(base[i] + s))) << isa_name(isa);
        const double g = dx[i] * silu_grad(y[i]);
        EXPECT_NEAR(dy[i], g, 2e-6 * (1 + std::fabs(g))) << isa_name(isa) << " " << y[i];
      }
    }
  }
}

TEST(TrainActivations, CrossEntropyRow) {
  std::mt19937 gen(2);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (Isa isa : isas()) {
    for (int64_t n : {1, 2, 16, 31, 4096}) {
      std::vector<float> z(n);
      for (float& x : z) x = normal(gen);
      const int32_t t = static_cast<int32_t>(n / 3);
      double zmax = z[0];
      int64_t am = 0;
      for (int64_t v = 1; v < n; ++v) {
        if (z[v] > zmax) zmax = z[v], am = v;
      }
      double sum = 0;
      for (float x : z) sum += std::exp(x - zmax);
      const double loss = zmax + std::log(sum) - z[t];
      // forward only: the logits stay
      std::vector<float> keep = z;
      const CrossEntropyRow f = cross_entropy_row(isa, keep.data(), n, t, 0.0f);
      EXPECT_EQ(keep, z);
      EXPECT_NEAR(f.loss, loss, 1e-5 * (1 + loss)) << isa_name(isa) << " n " << n;
      EXPECT_EQ(f.argmax, am);
      // backward: scale * (softmax - onehot), which sums to zero
      std::vector<float> g = z;
      const CrossEntropyRow b = cross_entropy_row(isa, g.data(), n, t, 0.25f);
      EXPECT_NEAR(b.loss, loss, 1e-5 * (1 + loss));
      EXPECT_EQ(b.argmax, am);
      double total = 0;
      for (int64_t v = 0; v < n; ++v) {
        const double want = 0.25 * (std::exp(z[v] - zmax) / sum - (v == t ? 1.0 : 0.0));
        EXPECT_NEAR(g[v], want, 1e-6) << isa_name(isa) << " n " << n << " v " << v;
        total += g[v];
      }
      EXPECT_NEAR(total, 0.0, 1e-5);
    }
    // ties: the first index; a huge spread: no overflow
    std::vector<float> z = {1.0f, 5.0f, 3.0f, 5.0f, -1e30f, 5.0f, 0.0f, 2.0f, 5.0f, 1.0f,
                            1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 5.0f};
    const CrossEntropyRow r = cross_entropy_row(isa, z.data(), static_cast<int64_t>(z.size()), 4, 1.0f);
    EXPECT_EQ(r.argmax, 1) << isa_name(isa);
    EXPECT_TRUE(std::isfinite(r.loss));
    EXPECT_GT(r.loss, 1e29);
    EXPECT_NEAR(z[4], -1.0f, 1e-6);
  }
}

}  // namespace
}  // namespace specdec
