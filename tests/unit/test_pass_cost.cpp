// The engine's pass-cost model (engine/pass_cost.h): the line without a curve, linear
// interpolation between calibrated points, the last slope past the last point.
#include "engine/pass_cost.h"

#include <gtest/gtest.h>

namespace specdec {
namespace {

TEST(PassCost, WithoutACurveItIsTheLine) {
  const PassCost line(0.25, {});
  EXPECT_DOUBLE_EQ(line.cost(1), 1.0);
  EXPECT_DOUBLE_EQ(line.cost(9), 3.0);
  EXPECT_DOUBLE_EQ(line.marginal(4, 1), 0.25);
  EXPECT_DOUBLE_EQ(line.marginal(4, 8), 0.25);
}

TEST(PassCost, TheCurveIsInterpolatedAndExtendedByItsLastSlope) {
  // A knee at 8 tokens, as the AVX-512 kernels measure.
  const PassCost curve(0.14, {{1, 1.0}, {4, 1.4}, {8, 2.3}, {16, 4.3}});
  EXPECT_DOUBLE_EQ(curve.cost(1), 1.0);
  EXPECT_DOUBLE_EQ(curve.cost(4), 1.4);
  EXPECT_NEAR(curve.cost(2.5), 1.2, 1e-12);
  EXPECT_NEAR(curve.cost(6), 1.85, 1e-12);
  EXPECT_NEAR(curve.cost(12), 3.3, 1e-12);
  EXPECT_NEAR(curve.cost(24), 6.3, 1e-12);  // past the last point: 0.25 a token
  // A token in a batch of 8 costs what the curve's next tokens cost, not the line through 8.
  EXPECT_NEAR(curve.marginal(8, 8), 0.25, 1e-12);
  EXPECT_NEAR(curve.marginal(1, 3), 0.4 / 3, 1e-12);
  EXPECT_NEAR(curve.marginal(8, 0), 0.25, 1e-12);  // at least one token
}

TEST(PassCost, AFlatStretchDoesNotMakeTokensFree) {
  // A calibration on a noisy host may measure 12 tokens no dearer than 8.
  const PassCost flat(0.14, {{1, 1.0}, {8, 2.0}, {12, 2.0}, {16, 3.0}});
  EXPECT_DOUBLE_EQ(flat.marginal(8, 4), kMinPassTokenCost);
  EXPECT_NEAR(flat.marginal(8, 8), 1.0 / 8, 1e-12);
  EXPECT_DOUBLE_EQ(PassCost(0.0, {}).marginal(3, 2), 0.0);  // the line is taken as given
}

}  // namespace
}  // namespace specdec
