// The engine's cost model of a target pass: what a pass over n new tokens costs, in passes of
// one token (never a clock: the constants come from `specdec bench --calibrate`).
//
// Measured on the 2-vCPU Zen 4 at context 512 (SmolLM2-135M, AVX-512): n = 4, 8, 9, 16, 24 cost
// 1.43, 2.35, 2.96, 4.3, 6.2 one-token passes. The curve is not a line: up to ~4 rows a row
// rides along with the weights' memory stream (0.14 of a pass), then the kernels turn
// compute-bound and a row costs 0.2-0.25, and the 9th row starts a second 8-row tile (+0.6).
// A line through the 8-token point (the old single constant) overstates a small tree's cost
// and understates a batch's, which let speculation run at a loss under load.
//
// With a calibrated curve (points (n, ratio), n ascending, the first n = 1 at ratio 1) the cost
// is interpolated linearly between points and extended with the last segment's slope; without
// one it is the line 1 + c·(n - 1).
#pragma once

#include <utility>
#include <vector>

namespace specdec {

// The least a token adds to a pass on a calibrated curve (in one-token passes), wherever the
// curve is flatter: a token is never free, whatever a noisy calibration measured.
inline constexpr double kMinPassTokenCost = 0.01;

// Whether `curve` is a usable calibrated curve: at least two points, the first (1, 1), n rising,
// costs finite and never falling. (An empty curve means "none": the line.)
bool pass_cost_curve_valid(const std::vector<std::pair<int, double>>& curve);

class PassCost {
 public:
  // c: verify_token_cost (the line); curve: calibrated points, may be empty.
  PassCost(double c, std::vector<std::pair<int, double>> curve);

  // A pass over n >= 1 new tokens, in one-token passes.
  double cost(double n) const;
  // What each of m more tokens adds to a pass of n tokens, on average: (cost(n + m) - cost(n)) / m,
  // at least kMinPassTokenCost on a curve (the line's c as it is).
  double marginal(double n, double m) const;

 private:
  double c_;
  std::vector<std::pair<int, double>> curve_;
};

}  // namespace specdec
