// Goodness-of-fit statistics for the sampling tests: the chi-square distribution (survival
// function through the regularized incomplete gamma function, quantiles by Wilson–Hilferty and by
// bisection) and a G-test of observed counts against EXACT cell probabilities, with cells of
// small expected count pooled so that the chi-square approximation holds.
//
// Usage: FitResult r = g_test(counts, probs); EXPECT_GT(r.p_value, 1e-4) << r.summary();
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace specdec::test {

// Standard normal upper tail: P(Z > z).
inline double normal_sf(double z) {
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

// z with P(Z > z) = alpha, by bisection on normal_sf (monotone), alpha in (0, 1).
inline double normal_upper_quantile(double alpha) {
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (normal_sf(mid) > alpha) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

// Regularized upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a): a series for P below a + 1, a
// continued fraction (modified Lentz) for Q above.
inline double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_front = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term, ap = a;
    for (int n = 0; n < 100000; ++n) {
      ap += 1.0;
      term *= x / ap;
      sum += term;
      if (std::abs(term) < std::abs(sum) * 1e-16) break;
    }
    return std::max(0.0, 1.0 - sum * std::exp(log_front));
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_front) * h;
}

// P(X > x) for X ~ chi-square with `dof` degrees of freedom.
inline double chi_square_sf(double x, double dof) {
  return gamma_q(0.5 * dof, 0.5 * x);
}

// Wilson–Hilferty: (X / k)^(1/3) is close to normal with mean 1 - 2/(9k), variance 2/(9k).
// Accurate to a fraction of a percent from a few degrees of freedom up.
inline double chi_square_quantile_wh(double dof, double alpha) {
  const double z = normal_upper_quantile(alpha);
  const double v = 2.0 / (9.0 * dof);
  const double t = 1.0 - v + z * std::sqrt(v);
  return dof * t * t * t;
}

// x with P(X > x) = alpha, by bisection on chi_square_sf starting from Wilson–Hilferty's bracket.
inline double chi_square_quantile(double dof, double alpha) {
  double lo = 0.0, hi = std::max(1.0, 4.0 * chi_square_quantile_wh(dof, alpha) + 100.0);
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (chi_square_sf(mid, dof) > alpha) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

struct FitResult {
  int64_t n = 0;           // observations
  int bins = 0;            // bins after pooling
  int dof = 0;             // bins - 1
  double statistic = 0;    // G = 2 Σ O ln(O / E)
  double p_value = 1;      // P(chi-square(dof) > G); 0 when an impossible cell was observed
  int64_t impossible = 0;  // observations in cells of probability 0
  double worst_ratio = 1;  // O / E of the unpooled cell contributing most to G (diagnostics)
  int64_t worst_cell = -1;

  std::string summary() const {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "n=%lld bins=%d G=%.2f dof=%d p=%.3g impossible=%lld worst cell %lld at "
                  "O/E=%.3f",
                  static_cast<long long>(n), bins, statistic, dof, p_value,
                  static_cast<long long>(impossible), static_cast<long long>(worst_cell),
                  worst_ratio);
    return buf;
  }
};

// G-test of `counts` against the exact cell probabilities `probs` (same length; probabilities are
// normalized by their sum). Cells whose expected count is below `min_expected` are pooled into
// one bin (merged into the smallest other bin if the pool itself stays below it). An observation
// in a cell of probability 0 makes the fit impossible (p_value = 0).
inline FitResult g_test(std::span<const int64_t> counts, std::span<const double> probs,
                        double min_expected = 5.0) {
  FitResult r;
  double total_p = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    r.n += counts[i];
    total_p += probs[i];
  }
  if (r.n == 0 || total_p <= 0) return r;
  std::vector<double> obs, exp;  // [bins]
  double pool_o = 0, pool_e = 0;
  double worst = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = static_cast<double>(r.n) * probs[i] / total_p;
    if (probs[i] <= 0) {
      r.impossible += counts[i];
      continue;
    }
    if (e < min_expected) {
      pool_o += static_cast<double>(counts[i]);
      pool_e += e;
      continue;
    }
    const double o = static_cast<double>(counts[i]);
    const double contribution = o > 0 ? o * std::log(o / e) - (o - e) : e;
    if (contribution > worst) {
      worst = contribution;
      r.worst_cell = static_cast<int64_t>(i);
      r.worst_ratio = o / e;
    }
    obs.push_back(o);
    exp.push_back(e);
  }
  if (pool_e > 0) {
    if (pool_e < min_expected && !exp.empty()) {
      const size_t smallest = std::min_element(exp.begin(), exp.end()) - exp.begin();
      obs[smallest] += pool_o;
      exp[smallest] += pool_e;
    } else {
      obs.push_back(pool_o);
      exp.push_back(pool_e);
    }
  }
  r.bins = static_cast<int>(obs.size());
  r.dof = std::max(r.bins - 1, 0);
  double g = 0;
  for (size_t b = 0; b < obs.size(); ++b) {
    if (obs[b] > 0) g += 2.0 * obs[b] * std::log(obs[b] / exp[b]);
  }
  r.statistic = std::max(g, 0.0);
  if (r.impossible > 0) {
    r.p_value = 0;
  } else if (r.dof > 0) {
    r.p_value = chi_square_sf(r.statistic, r.dof);
  }
  return r;
}

// The entropy in nats of a distribution (probabilities summing to ~1).
inline double entropy_nats(std::span<const double> probs) {
  double h = 0;
  for (double p : probs) {
    if (p > 0) h -= p * std::log(p);
  }
  return h;
}

}  // namespace specdec::test
