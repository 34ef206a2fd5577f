// The sampler: Rng reference values and determinism, option validation, greedy, each filter on
// a hand-computed example, the repetition penalty, agreement with a brute-force chain on a large
// vocabulary, and a chi-square test that draws follow `distribution` (and that the test rejects
// a wrong distribution).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "sample/rng.h"
#include "sample/sampler.h"
#include "util/check.h"

namespace specdec {
namespace {

// --- Rng ---------------------------------------------------------------------------------------

TEST(Rng, ReferenceValues) {
  // splitmix64 from 0 (Vigna's reference implementation).
  uint64_t x = 0;
  EXPECT_EQ(Rng::splitmix64(&x), 0xe220a8397b1dcdafull);
  EXPECT_EQ(Rng::splitmix64(&x), 0x6e789e6aa1b965f4ull);
  // xoshiro256** from the state {1, 2, 3, 4}: the first output is rotl(2·5, 7)·9 = 11520 and the
  // second rotl(0, 7)·9 = 0 (s[1] becomes 0 after one step), by hand from the algorithm.
  Rng rng = Rng::from_state({1, 2, 3, 4});
  EXPECT_EQ(rng.next(), 11520u);
  EXPECT_EQ(rng.next(), 0u);
  EXPECT_EQ(rng.next(), 1509978240u);
  EXPECT_EQ(rng.next(), 1215971899390074240u);
}

TEST(Rng, DeterministicAndCopyable) {
  Rng a(42), b(42), c(43);
  std::vector<uint64_t> va, vb, vc;
  for (int i = 0; i < 100; ++i) {
    va.push_back(a.next());
    vb.push_back(b.next());
    vc.push_back(c.next());
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  Rng saved = a;  // the state can be saved and replayed
  const uint64_t next = a.next();
  EXPECT_EQ(saved.next(), next);
  EXPECT_TRUE(saved == a);
  a.reseed(42);
  EXPECT_EQ(a.next(), va[0]);
}

TEST(Rng, UniformIsInUnitIntervalWithMeanHalf) {
  Rng rng(7);
  double sum = 0.0, sum_sq = 0.0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
  }
  // Mean 1/2 and variance 1/12; the mean's standard error is sqrt(1/12/n) ≈ 6.5e-4: 5 sigma.
  EXPECT_NEAR(sum / n, 0.5, 5 * 6.5e-4);
  EXPECT_NEAR(sum_sq / n - (sum / n) * (sum / n), 1.0 / 12, 2e-3);
}

// --- params ------------------------------------------------------------------------------------

TEST(SamplingParams, ValidateRejectsOutOfRange) {
  SamplingParams ok;
  EXPECT_NO_THROW(ok.validate());
  ok.temperature = 0.8f;
  ok.top_k = 40;
  ok.top_p = 0.95f;
  ok.min_p = 0.05f;
  ok.repetition_penalty = 1.1f;
  ok.repeat_last_n = -1;
  EXPECT_NO_THROW(ok.validate());

  auto expect_bad = [](void (*mutate)(SamplingParams&)) {
    SamplingParams p;
    mutate(p);
    EXPECT_THROW(p.validate(), Error);
    EXPECT_THROW(Sampler{p}, Error);
  };
  expect_bad([](SamplingParams& p) { p.temperature = -0.5f; });
  expect_bad([](SamplingParams& p) { p.temperature = NAN; });
  expect_bad([](SamplingParams& p) { p.temperature = INFINITY; });
  expect_bad([](SamplingParams& p) { p.top_k = -1; });
  expect_bad([](SamplingParams& p) { p.top_p = 0.0f; });
  expect_bad([](SamplingParams& p) { p.top_p = 1.5f; });
  expect_bad([](SamplingParams& p) { p.top_p = NAN; });
  expect_bad([](SamplingParams& p) { p.min_p = -0.1f; });
  expect_bad([](SamplingParams& p) { p.min_p = 1.01f; });
  expect_bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; });
  expect_bad([](SamplingParams& p) { p.repetition_penalty = -1.0f; });
  expect_bad([](SamplingParams& p) { p.repeat_last_n = -2; });
}

// --- greedy and determinism --------------------------------------------------------------------

std::vector<float> random_logits(std::mt19937& gen, int n, float spread) {
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(Sampler, GreedyIsArgmaxFirstOnTies) {
  SamplingParams params;  // temperature 0
  Sampler sampler(params);
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  const Rng before = sampler.rng();
  EXPECT_EQ(sampler.sample(logits, {}), 1);
  EXPECT_TRUE(sampler.rng() == before) << "greedy draws do not advance the Rng";
  std::vector<float> probs;
  sampler.distribution(logits, {}, &probs);
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f, 0.0f}));

  std::mt19937 gen(1);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<float> l = random_logits(gen, 1000, 3.0f);
    EXPECT_EQ(sampler.sample(l, {}), std::max_element(l.begin(), l.end()) - l.begin());
  }
}

// Greedy without a penalty reads the logits in place on 8 lanes: the first of tied maxima
// whatever lanes (or the tail past the last full 8) they fall in, the same token as with a
// penalty that touches nothing, and the same errors.
TEST(Sampler, GreedyFirstMaxAcrossLanesAndTail) {
  SamplingParams params;  // temperature 0
  Sampler plain(params);
  params.repetition_penalty = 1.3f;
  Sampler penalized(params);
  const std::vector<int32_t> far_token = {0};  // penalizes token 0, which never wins below
  for (int n : {1, 7, 8, 9, 17, 49155}) {
    for (int first = 1; first < std::min(n, 40); first += 3) {
      for (int gap : {1, 3, 8, 16}) {
        std::vector<float> l(static_cast<size_t>(n), -5.0f);
        l[static_cast<size_t>(first)] = 7.0f;
        if (first + gap < n) l[static_cast<size_t>(first + gap)] = 7.0f;
        l[static_cast<size_t>(n - 1)] = first == n - 1 ? 7.0f : 7.0f - 1e-6f;
        ASSERT_EQ(plain.sample(l, {}), first) << "n " << n << " gap " << gap;
        ASSERT_EQ(penalized.sample(l, far_token), first) << "n " << n << " gap " << gap;
      }
    }
    if (n > 1) {  // the maximum in the tail only
      std::vector<float> l(static_cast<size_t>(n), 0.0f);
      l[static_cast<size_t>(n - 1)] = 1.0f;
      EXPECT_EQ(plain.sample(l, {}), n - 1);
    }
  }
  std::vector<float> bad(100, 0.0f);
  bad[93] = NAN;
  EXPECT_THROW(plain.sample(bad, {}), Error);
  bad[93] = -INFINITY;
  EXPECT_EQ(plain.sample(bad, {}), 0);
  EXPECT_THROW(plain.sample(std::vector<float>(9, -INFINITY), {}), Error);
  EXPECT_THROW(plain.sample(std::vector<float>{}, {}), Error);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDifferent) {
  std::mt19937 gen(2);
  const std::vector<float> logits = random_logits(gen, 200, 1.0f);
  auto draw = [&](uint64_t seed) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.seed = seed;
    Sampler sampler(params);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sampler.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(draw(5), draw(5));
  EXPECT_NE(draw(5), draw(6));
}

TEST(Sampler, TopKOneEqualsGreedy) {
  std::mt19937 gen(3);
  SamplingParams greedy;
  greedy.repetition_penalty = 1.3f;
  SamplingParams top1 = greedy;
  top1.temperature = 0.7f;
  top1.top_k = 1;
  top1.top_p = 0.9f;
  Sampler a(greedy), b(top1);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> l = random_logits(gen, 500, 2.0f);
    std::vector<int32_t> history;
    for (int i = 0; i < 30; ++i) history.push_back(static_cast<int32_t>(gen() % 500));
    EXPECT_EQ(a.sample(l, history), b.sample(l, history));
  }
}

// --- the filters, by hand ----------------------------------------------------------------------

// Logits whose softmax is {0.1, 0.5, 0.05, 0.2, 0.15} (tokens 0..4).
const std::vector<float> kHandLogits = {std::log(0.1f), std::log(0.5f), std::log(0.05f),
                                        std::log(0.2f), std::log(0.15f)};

std::vector<float> hand_distribution(const SamplingParams& params) {
  Sampler sampler(params);
  std::vector<float> probs;
  sampler.distribution(kHandLogits, {}, &probs);
  return probs;
}

void expect_probs(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

TEST(Sampler, TemperatureOnly) {
  SamplingParams p;
  p.temperature = 1.0f;
  expect_probs(hand_distribution(p), {0.1, 0.5, 0.05, 0.2, 0.15});
  p.temperature = 0.5f;  // p^2 renormalized: Σ = 0.01 + 0.25 + 0.0025 + 0.04 + 0.0225 = 0.325
  expect_probs(hand_distribution(p),
               {0.01 / 0.325, 0.25 / 0.325, 0.0025 / 0.325, 0.04 / 0.325, 0.0225 / 0.325});
}

TEST(Sampler, TopK) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;  // {0.5, 0.2} / 0.7
  expect_probs(hand_distribution(p), {0, 0.5 / 0.7, 0, 0.2 / 0.7, 0});
  p.top_k = 5;  // = n: off
  expect_probs(hand_distribution(p), {0.1, 0.5, 0.05, 0.2, 0.15});
  p.top_k = 100;
  expect_probs(hand_distribution(p), {0.1, 0.5, 0.05, 0.2, 0.15});
  // Ties at the boundary keep the lower token ids; top_k 1 then agrees with greedy.
  const std::vector<float> tied = {1.0f, 2.0f, 0.0f, 2.0f, 2.0f};
  p.top_k = 2;
  Sampler s(p);
  std::vector<float> probs;
  s.distribution(tied, {}, &probs);
  expect_probs(probs, {0, 0.5, 0, 0.5, 0});
  p.top_k = 1;
  Sampler s1(p);
  EXPECT_EQ(s1.sample(tied, {}), 1);
}

TEST(Sampler, TopP) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.8f;  // sorted 0.5, 0.2, 0.15 → cumulative 0.85 >= 0.8 at the third
  expect_probs(hand_distribution(p), {0, 0.5 / 0.85, 0, 0.2 / 0.85, 0.15 / 0.85});
  p.top_p = 0.65f;  // 0.5, 0.7 >= 0.65 at the second
  expect_probs(hand_distribution(p), {0, 0.5 / 0.7, 0, 0.2 / 0.7, 0});
  p.top_p = 0.3f;  // the top token alone
  expect_probs(hand_distribution(p), {0, 1, 0, 0, 0});
}

TEST(Sampler, MinP) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.25f;  // keep p >= 0.125: 0.5, 0.2, 0.15
  expect_probs(hand_distribution(p), {0, 0.5 / 0.85, 0, 0.2 / 0.85, 0.15 / 0.85});
  p.min_p = 0.19f;  // keep p >= 0.095: also 0.1
  expect_probs(hand_distribution(p), {0.1 / 0.95, 0.5 / 0.95, 0, 0.2 / 0.95, 0.15 / 0.95});
  p.min_p = 1.0f;  // only the top token
  expect_probs(hand_distribution(p), {0, 1, 0, 0, 0});
}

TEST(Sampler, ChainOrder) {
  // top_k 4 → {0.5, 0.2, 0.15, 0.1}/0.95; top_p 0.8 → cumulative 0.526, 0.737, 0.895: three
  // kept; min_p 0.25 keeps all three (0.15/0.5 = 0.3); temperature 2 → p ∝ sqrt(p).
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 4;
  p.top_p = 0.8f;
  p.min_p = 0.25f;
  const double a = std::sqrt(0.5), b = std::sqrt(0.2), c = std::sqrt(0.15);
  expect_probs(hand_distribution(p), {0, a / (a + b + c), 0, b / (a + b + c), c / (a + b + c)});
  // Temperature comes last: it does not change which tokens min_p keeps (llama.cpp order).
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.35f;  // keep p >= 0.175: 0.5 and 0.2
  p.temperature = 10.0f;
  const double a10 = std::pow(0.5, 0.1), b10 = std::pow(0.2, 0.1);
  expect_probs(hand_distribution(p), {0, a10 / (a10 + b10), 0, b10 / (a10 + b10), 0});
}

// --- repetition penalty ------------------------------------------------------------------------

TEST(Sampler, RepetitionPenalty) {
  const std::vector<float> logits = {3.0f, 2.5f, -1.0f, 0.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  // Token 0 (3.0 → 1.5) and token 2 (-1 → -2), each once although they repeat.
  const std::vector<int32_t> history = {0, 2, 0, 2, 2};
  Sampler greedy(p);
  EXPECT_EQ(greedy.sample(logits, history), 1);  // 2.5 now beats 1.5
  EXPECT_EQ(greedy.sample(logits, {}), 0);

  p.temperature = 1.0f;
  Sampler s(p);
  std::vector<float> probs;
  s.distribution(logits, history, &probs);
  const double z = std::exp(1.5) + std::exp(2.5) + std::exp(-2.0) + std::exp(0.5);
  expect_probs(probs,
               {std::exp(1.5) / z, std::exp(2.5) / z, std::exp(-2.0) / z, std::exp(0.5) / z});

  // The window: only the last 2 tokens (2, 2) count.
  p.repeat_last_n = 2;
  Sampler windowed(p);
  windowed.distribution(logits, history, &probs);
  const double zw = std::exp(3.0) + std::exp(2.5) + std::exp(-2.0) + std::exp(0.5);
  expect_probs(probs,
               {std::exp(3.0) / zw, std::exp(2.5) / zw, std::exp(-2.0) / zw, std::exp(0.5) / zw});
  // repeat_last_n 0: no penalty; -1: the whole history.
  p.repeat_last_n = 0;
  Sampler off(p);
  off.distribution(logits, history, &probs);
  const double z0 = std::exp(3.0) + std::exp(2.5) + std::exp(-1.0) + std::exp(0.5);
  EXPECT_NEAR(probs[0], std::exp(3.0) / z0, 1e-6);
  p.repeat_last_n = -1;
  Sampler all(p);
  all.distribution(logits, std::vector<int32_t>{0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, &probs);
  const double za = std::exp(1.5) + std::exp(1.25) + std::exp(-1.0) + std::exp(0.5);
  EXPECT_NEAR(probs[0], std::exp(1.5) / za, 1e-6);
}

TEST(Sampler, BadInputThrows) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.repetition_penalty = 1.2f;
  Sampler s(p);
  std::vector<float> probs;
  EXPECT_THROW(s.sample(std::vector<float>{}, {}), Error);
  EXPECT_THROW(s.sample(std::vector<float>{1.0f, NAN}, {}), Error);
  EXPECT_THROW(s.sample(std::vector<float>{-INFINITY, -INFINITY}, {}), Error);
  EXPECT_THROW(s.distribution(std::vector<float>{1.0f, 2.0f}, std::vector<int32_t>{5}, &probs),
               Error);
  EXPECT_THROW(s.distribution(std::vector<float>{1.0f, 2.0f}, std::vector<int32_t>{-1}, &probs),
               Error);
  // -inf logits are masked tokens: never drawn.
  const std::vector<float> masked = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  for (int i = 0; i < 100; ++i) {
    const int32_t t = s.sample(masked, {});
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

// --- against a brute-force chain on a large vocabulary ----------------------------------------

// The documented chain with a full sort, in double.
std::vector<double> brute_force(const SamplingParams& p, std::vector<float> l,
                                const std::vector<int32_t>& history) {
  const int n = static_cast<int>(l.size());
  std::vector<bool> seen(n, false);
  const size_t start = p.repeat_last_n < 0 || static_cast<size_t>(p.repeat_last_n) > history.size()
                           ? 0
                           : history.size() - p.repeat_last_n;
  for (size_t i = start; i < history.size(); ++i) {
    const int32_t t = history[i];
    if (seen[t]) continue;
    seen[t] = true;
    l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  int kept = n;
  if (p.top_k > 0 && p.top_k < n) kept = p.top_k;
  const double max = l[order[0]];
  if (p.top_p < 1.0f) {
    double z = 0;
    for (int c = 0; c < kept; ++c) z += std::exp(l[order[c]] - max);
    double cum = 0;
    for (int c = 0; c < kept; ++c) {
      cum += std::exp(l[order[c]] - max) / z;
      if (cum >= p.top_p) {
        kept = c + 1;
        break;
      }
    }
  }
  while (kept > 1 && p.min_p > 0 && l[order[kept - 1]] < max + std::log(p.min_p)) --kept;
  std::vector<double> probs(n, 0.0);
  double z = 0;
  for (int c = 0; c < kept; ++c) z += std::exp((l[order[c]] - max) / p.temperature);
  for (int c = 0; c < kept; ++c) {
    probs[order[c]] = std::exp((l[order[c]] - max) / p.temperature) / z;
  }
  return probs;
}

TEST(Sampler, MatchesBruteForceOnLargeVocabulary) {
  std::mt19937 gen(4);
  const int n = 50000;
  struct Case {
    int top_k;
    float top_p, min_p, temperature, penalty;
  };
  const Case cases[] = {{0, 0.9f, 0.0f, 0.8f, 1.0f},    {0, 0.999f, 0.0f, 1.0f, 1.1f},
                        {40, 0.95f, 0.05f, 0.7f, 1.2f}, {0, 1.0f, 0.02f, 1.3f, 1.0f},
                        {1000, 1.0f, 0.0f, 1.0f, 1.5f}, {0, 0.5f, 0.1f, 2.0f, 0.9f}};
  // Plain random logits; logits rounded to 0.25 (many ties, also at the top-k and top-p
  // boundaries); and a third of the vocabulary masked to -inf.
  for (int style = 0; style < 3; ++style) {
    for (const Case& c : cases) {
      SamplingParams p;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.temperature = c.temperature;
      p.repetition_penalty = c.penalty;
      p.repeat_last_n = 64;
      std::vector<float> logits = random_logits(gen, n, 2.5f);
      for (float& x : logits) {
        if (style == 1) x = std::round(x * 4.0f) / 4.0f;
        if (style == 2 && gen() % 3 == 0) x = -INFINITY;
      }
      std::vector<int32_t> history;
      for (int i = 0; i < 100; ++i) history.push_back(static_cast<int32_t>(gen() % n));
      const std::vector<double> want = brute_force(p, logits, history);
      Sampler s(p);
      std::vector<float> got;
      s.distribution(logits, history, &got);
      int n_kept = 0;
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(got[i] > 0, want[i] > 0) << "kept sets differ at token " << i;
        ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-5 * want[i]);
        n_kept += got[i] > 0;
      }
      RecordProperty("kept", n_kept);
    }
  }
}

// --- sampling follows the distribution ---------------------------------------------------------

// Chi-square critical value at significance alpha = 0.001 (z = 3.0902), Wilson–Hilferty.
double chi_square_critical(int df) {
  const double z = 3.0902;
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& expected_p, int n) {
  double stat = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected_p[i] <= 0) {
      if (counts[i] > 0) return INFINITY;  // drew a token the distribution excludes
      continue;
    }
    const double e = expected_p[i] * n;
    stat += (counts[i] - e) * (counts[i] - e) / e;
  }
  return stat;
}

TEST(Sampler, FrequenciesMatchDistribution) {
  std::mt19937 gen(5);
  const std::vector<float> logits = random_logits(gen, 16, 1.0f);
  const std::vector<int32_t> history = {3, 3, 7};
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 12;
  p.top_p = 0.97f;
  p.repetition_penalty = 1.3f;
  p.seed = 1234;
  Sampler s(p);
  std::vector<float> probs;
  s.distribution(logits, history, &probs);
  std::vector<double> expected(probs.begin(), probs.end());
  int df = -1;
  for (double q : expected) df += q > 0;
  ASSERT_GE(df, 4);

  const int n_draws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n_draws; ++i) ++counts[s.sample(logits, history)];
  const double critical = chi_square_critical(df);
  EXPECT_LT(chi_square(counts, expected, n_draws), critical) << "df " << df;

  // The same test rejects a distribution that is slightly wrong: 3% of the mass moved from the
  // most likely token to the least likely kept one (what a sampler that mishandled, e.g., the
  // temperature or the penalty would produce).
  std::vector<double> perturbed = expected;
  const size_t top = std::max_element(expected.begin(), expected.end()) - expected.begin();
  size_t low = top;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] > 0 && expected[i] < expected[low]) low = i;
  }
  perturbed[top] -= 0.03;
  perturbed[low] += 0.03;
  EXPECT_GT(chi_square(counts, perturbed, n_draws), critical);
  // And a sampler that ignored the repetition penalty.
  SamplingParams unpenalized = p;
  unpenalized.repetition_penalty = 1.0f;
  std::vector<float> wrong;
  Sampler(unpenalized).distribution(logits, history, &wrong);
  EXPECT_GT(chi_square(counts, std::vector<double>(wrong.begin(), wrong.end()), n_draws), critical);
}

// sample() is one uniform per draw, inverse CDF over `distribution` in token order.
// Each sampler path's draw is the inverse CDF of its distribution: the sorted kept set (top-p)
// and the whole vocabulary walked block by block (no top-k / top-p: 1,000 tokens, blocks of 64
// and a tail of 40; with min-p, blocks of zeros among them).
TEST(Sampler, SampleIsInverseCdfOfDistribution) {
  std::mt19937 gen(6);
  struct Case {
    float top_p, min_p;
    int vocab;
  };
  for (const Case& c : {Case{0.9f, 0.0f, 300}, Case{1.0f, 0.0f, 1000}, Case{1.0f, 0.3f, 1000}}) {
    SamplingParams p;
    p.temperature = 1.1f;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 99;
    Sampler s(p);
    for (int trial = 0; trial < 200; ++trial) {
      const std::vector<float> logits = random_logits(gen, c.vocab, 1.5f);
      std::vector<float> probs;
      s.distribution(logits, {}, &probs);
      Rng copy = s.rng();
      const double u = copy.uniform();
      double total = 0;
      for (float q : probs) total += q;
      double cum = 0;
      int32_t want = -1;
      for (int32_t i = 0; i < c.vocab && want < 0; ++i) {
        if (probs[i] <= 0) continue;
        cum += probs[i];
        if (cum > u * total) want = i;
      }
      ASSERT_EQ(s.sample(logits, {}), want) << "top_p " << c.top_p << " min_p " << c.min_p;
      ASSERT_TRUE(s.rng() == copy) << "exactly one uniform per draw";
    }
  }
}

}  // namespace
}  // namespace specdec
