#include "engine/pass_cost.h"

#include <algorithm>
#include <cmath>

namespace specdec {

PassCost::PassCost(double c, std::vector<std::pair<int, double>> curve)
    : c_(c), curve_(std::move(curve)) {}

bool pass_cost_curve_valid(const std::vector<std::pair<int, double>>& curve) {
  if (curve.size() < 2 || curve[0] != std::pair<int, double>{1, 1.0}) return false;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (curve[i].first <= curve[i - 1].first || !std::isfinite(curve[i].second) ||
        curve[i].second < curve[i - 1].second) {
      return false;
    }
  }
  return true;
}

double PassCost::cost(double n) const {
  if (curve_.size() < 2) return 1.0 + c_ * (n - 1.0);
  // The segment that holds n (the first below its start, the last past its end).
  size_t i = 1;
  while (i + 1 < curve_.size() && n > curve_[i].first) ++i;
  const auto [n0, r0] = curve_[i - 1];
  const auto [n1, r1] = curve_[i];
  return r0 + (r1 - r0) * (n - n0) / static_cast<double>(n1 - n0);
}

double PassCost::marginal(double n, double m) const {
  if (curve_.size() < 2) return c_;
  m = std::max(m, 1.0);
  return std::max(kMinPassTokenCost, (cost(n + m) - cost(n)) / m);
}

}  // namespace specdec
