// DraftLengthController: fixed mode returns the fixed length whatever happens; adaptive mode
// measures a plain pass first, then a short draft, switches speculation off when drafts are
// rejected and verification is expensive, probes again after probe_interval plain steps, and
// stays at the maximum when drafts are accepted and verification is cheap.
#include <gtest/gtest.h>

#include <algorithm>

#include <vector>

#include "speculative/draft_length.h"

namespace specdec {
namespace {

// A simulated sequence: a 1-token pass costs t1 seconds, each extra verified token `per_token`,
// each draft token `draft`; `accept(k)` says how many of k drafts are accepted.
struct Sim {
  double t1 = 0.010;
  double per_token = 0.001;
  double draft = 0.0;

  template <class Accept>
  int step(DraftLengthController& c, Accept accept) const {
    const int k = c.next_length();
    if (k == 0) {
      c.record(0, 0, 0.0, t1);
    } else {
      c.record(k, accept(k), k * draft, t1 + k * per_token);
    }
    return k;
  }
};

DraftLengthConfig adaptive_config(int max_draft) {
  DraftLengthConfig c;
  c.max_draft = max_draft;
  c.adaptive = true;
  c.probe_interval = 16;
  c.probe_length = 2;
  return c;
}

TEST(DraftLength, FixedModeReturnsTheFixedLength) {
  for (int len : {0, 1, 3, 8}) {
    DraftLengthConfig config;
    config.adaptive = false;
    config.max_draft = len;
    DraftLengthController c(config);
    for (int i = 0; i < 200; ++i) {
      ASSERT_EQ(c.next_length(), len);
      // Whatever the outcome: all rejected and very expensive, or all accepted.
      if (i % 2) {
        c.record(len, 0, 1.0, 10.0);
      } else {
        c.record(len, len, 0.0, 0.001);
      }
    }
  }
  DraftLengthConfig negative;
  negative.adaptive = false;
  negative.max_draft = -2;
  EXPECT_EQ(DraftLengthController(negative).next_length(), 0);
  DraftLengthConfig zero = adaptive_config(0);
  EXPECT_EQ(DraftLengthController(zero).next_length(), 0);
}

TEST(DraftLength, AdaptiveMeasuresAPlainPassThenAShortDraft) {
  DraftLengthController c(adaptive_config(6));
  EXPECT_EQ(c.next_length(), 0);  // t1 unknown: a plain pass first
  c.record(0, 0, 0.0, 0.010);
  // Verification cost unknown: a draft of 4 measures it (a 9-token pass would cost ~2x a plain
  // one on CPU, a loss where nothing is accepted).
  EXPECT_EQ(c.next_length(), 4);
  EXPECT_EQ(DraftLengthController(adaptive_config(2)).next_length(), 0);
  DraftLengthController small(adaptive_config(2));
  small.record(0, 0, 0.0, 0.010);
  EXPECT_EQ(small.next_length(), 2);  // never above the maximum
}

TEST(DraftLength, AdaptiveTurnsOffWhenNothingIsAcceptedAndVerificationIsCostly) {
  DraftLengthConfig config = adaptive_config(8);
  DraftLengthController c(config);
  // Every extra verified token costs half a plain pass, drafting costs a tenth: no draft is ever
  // accepted, so every draft token is pure loss.
  const Sim sim{.t1 = 0.010, .per_token = 0.005, .draft = 0.001};
  auto none = [](int) { return 0; };
  int first_off = -1;
  std::vector<int> lengths;
  for (int i = 0; i < 40 && first_off < 0; ++i) {
    const int k = sim.step(c, none);
    lengths.push_back(k);
    if (i >= 2 && k == 0) first_off = i;
  }
  ASSERT_GE(first_off, 0) << "speculation never turned off";
  EXPECT_LE(first_off, 12) << "turning off took too long";
  EXPECT_LT(c.acceptance(), 0.6);  // below the optimistic start
  // It stays off for probe_interval steps (the deciding step included), then probes with
  // probe_length drafts.
  for (int i = 1; i < config.probe_interval; ++i) EXPECT_EQ(sim.step(c, none), 0) << "step " << i;
  EXPECT_EQ(sim.step(c, none), config.probe_length);
  // Each failed probe doubles the wait before the next one, up to 256 steps.
  int expected_wait = config.probe_interval;
  for (int round = 0; round < 6; ++round) {
    expected_wait = std::min(2 * expected_wait, 256);
    int zeros = 0;
    int k = 0;
    while ((k = sim.step(c, none)) == 0 && zeros < 1000) ++zeros;
    EXPECT_EQ(zeros, expected_wait) << "round " << round;
    EXPECT_EQ(k, config.probe_length) << "round " << round;
  }
}

TEST(DraftLength, AdaptiveTurnsOffOnceAcceptanceFallsEvenWhenVerificationIsModerate) {
  // An extra verified token costs a tenth of a pass: at the optimistic start (a = 0.6) drafting
  // pays, so the controller speculates; as nothing is accepted its estimate decays, and below
  // a ~ 0.1 a single draft no longer pays for itself.
  DraftLengthConfig config = adaptive_config(8);
  DraftLengthController c(config);
  const Sim sim{.t1 = 0.010, .per_token = 0.001, .draft = 0.0};
  auto none = [](int) { return 0; };
  std::vector<int> lengths;
  double acceptance_when_off = -1;
  for (int i = 0; i < 80; ++i) {
    const int k = sim.step(c, none);
    lengths.push_back(k);
    if (i >= 2 && k == 0) {
      acceptance_when_off = c.acceptance();
      break;
    }
  }
  ASSERT_GE(acceptance_when_off, 0) << "speculation never turned off";
  EXPECT_GT(lengths.size(), 5u) << "turned off before the acceptance estimate fell";
  EXPECT_GT(lengths[2], 0) << "should speculate while acceptance is still believed to be high";
  EXPECT_LT(acceptance_when_off, 0.15);
  // Off for probe_interval steps, then a probe.
  for (int i = 1; i < config.probe_interval; ++i) EXPECT_EQ(sim.step(c, none), 0) << "step " << i;
  EXPECT_EQ(sim.step(c, none), config.probe_length);
}

TEST(DraftLength, AdaptiveComesBackWhenAProbeSucceeds) {
  DraftLengthConfig config = adaptive_config(8);
  DraftLengthController c(config);
  const Sim costly{.t1 = 0.010, .per_token = 0.005, .draft = 0.001};
  auto none = [](int) { return 0; };
  int off = 0;
  for (int i = 0; i < 60; ++i) off += costly.step(c, none) == 0 ? 1 : 0;
  ASSERT_GT(off, 40) << "speculation should be mostly off while it only costs";
  // Now drafts become cheap to verify and always accepted (the text turned repetitive).
  const Sim cheap{.t1 = 0.010, .per_token = 0.0002, .draft = 0.0};
  auto all = [](int n) { return n; };
  int spec_steps = 0, at_max = 0;
  for (int i = 0; i < 200; ++i) {
    const int k = cheap.step(c, all);
    if (i >= 100 && k > 0) ++spec_steps;
    if (i >= 100 && k == config.max_draft) ++at_max;
  }
  EXPECT_GT(spec_steps, 90) << "speculation did not come back after successful probes";
  EXPECT_EQ(at_max, spec_steps) << "back at full length once drafts are accepted and cheap";
  EXPECT_GT(c.acceptance(), 0.9);
}

TEST(DraftLength, AdaptiveGoesToTheMaximumWhenAcceptedAndCheap) {
  DraftLengthConfig config = adaptive_config(7);
  DraftLengthController c(config);
  const Sim sim{.t1 = 0.010, .per_token = 0.0003, .draft = 0.0001};
  auto all = [](int n) { return n; };
  int plain = 0;
  const int steps = 300;
  for (int i = 0; i < steps; ++i) {
    const int k = sim.step(c, all);
    if (k == 0) {
      ++plain;
    } else if (i > 1) {  // step 1 is the first, measuring draft
      EXPECT_EQ(k, config.max_draft) << "step " << i;
    }
  }
  // Only the occasional plain pass that re-measures t1 (every 64 steps or so).
  EXPECT_LE(plain, 1 + steps / 60);
  EXPECT_GT(c.acceptance(), 0.95);
}

TEST(DraftLength, AdaptivePicksAMiddleLengthForPartialAcceptance) {
  // Acceptance 1/2 per token: the expected tokens per pass saturate near 2, so a long draft only
  // adds cost. With a per-token cost of a fifth of a pass the best length is short.
  DraftLengthConfig config = adaptive_config(8);
  DraftLengthController c(config);
  const Sim sim{.t1 = 0.010, .per_token = 0.002, .draft = 0.0};
  int toggle = 0;
  auto half = [&toggle](int n) {
    // Alternating 0 and 1 accepted: about one success per failure, acceptance near 1/2.
    return (toggle++ % 2 == 0) ? 0 : std::min(n, 1);
  };
  std::vector<int> lengths;
  for (int i = 0; i < 200; ++i) lengths.push_back(sim.step(c, half));
  int long_drafts = 0, spec = 0;
  for (int i = 100; i < 200; ++i) {
    if (lengths[i] > 0) ++spec;
    if (lengths[i] > 4) ++long_drafts;
  }
  EXPECT_GT(spec, 50) << "speculation should still pay at acceptance ~1/2";
  EXPECT_EQ(long_drafts, 0);
  EXPECT_GT(c.acceptance(), 0.3);
  EXPECT_LT(c.acceptance(), 0.7);
}

}  // namespace
}  // namespace specdec

namespace specdec {
namespace {

// Verification cost that is flat up to 4 drafts and steep beyond (the CPU kernels' shape: a pass
// over up to 5 tokens costs ~1.02x a 1-token pass, over 9 several times more): with low
// acceptance (20% per draft) short drafts still pay, long ones do not, and speculation stays on
// (a single cost per extra token, averaged over lengths, would turn it off).
TEST(DraftLength, AdaptiveFollowsANonLinearVerificationCost) {
  DraftLengthController c(adaptive_config(8));
  auto pass = [](int m) { return m <= 5 ? 0.010 + 0.00005 * (m - 1) : 0.010 + 0.003 * (m - 1); };
  uint32_t state = 12345;
  auto accepted = [&](int k) {  // each draft accepted with probability 1/5 given its parent
    int a = 0;
    while (a < k) {
      state = state * 1664525u + 1013904223u;
      if ((state >> 24) % 5 != 0) break;
      ++a;
    }
    return a;
  };
  int short_drafts = 0, long_drafts = 0, off = 0;
  for (int i = 0; i < 400; ++i) {
    const int k = c.next_length();
    c.record(k, k == 0 ? 0 : accepted(k), 0.0, pass(k + 1));
    if (i < 100) continue;
    if (k == 0) ++off;
    if (k >= 1 && k <= 4) ++short_drafts;
    if (k >= 6) ++long_drafts;
  }
  EXPECT_GT(short_drafts, 250) << "short drafts are nearly free and should be used";
  EXPECT_LT(long_drafts, 15);
  EXPECT_LT(off, 40);
}

}  // namespace
}  // namespace specdec

namespace specdec {
namespace {

// Open-ended text where nothing is ever accepted and each extra token costs 7% of a pass: the
// optimistic prior gives way after a few observations, so only a handful of steps speculate
// before the first probe interval (with a plain EMA from the prior it took ~15).
TEST(DraftLength, AdaptiveGivesUpQuicklyWhenNothingIsAccepted) {
  DraftLengthController c(adaptive_config(8));
  const Sim sim{.t1 = 0.010, .per_token = 0.0007, .draft = 0.0};
  auto none = [](int) { return 0; };
  int spec_steps = 0;
  for (int i = 0; i < 40; ++i) {
    const int k = sim.step(c, none);
    if (k > 0) ++spec_steps;
    if (i > 2 && k == 0 && spec_steps > 0) break;
  }
  EXPECT_GE(spec_steps, 1);
  EXPECT_LE(spec_steps, 8);
}

}  // namespace
}  // namespace specdec

namespace specdec {
namespace {

// A copied stretch (every draft accepted) and then nothing accepted at all, with the CPU's pass
// costs (a pass over m tokens costs f[m] plain passes). The depths 2..k must not keep the
// copied stretch's estimates once drafts fail at depth 1: over the next 40 steps the failed
// drafts cost at most 9 plain passes in all (7.6 now; with the pooled rate flooring every depth
// and no forgetting of unreached depths it was 10.8, with longer drafts for longer).
TEST(DraftLength, AdaptiveShortensDraftsSoonAfterCopyingStops) {
  const double f[] = {0, 1.0, 1.07, 1.13, 1.2, 1.4, 1.6, 1.75, 1.85, 2.05};
  DraftLengthController c(adaptive_config(8));
  int copied = 0;
  while (copied < 3) {
    const int k = c.next_length();
    c.record(k, k, 0.0, 0.010 * f[k + 1]);
    if (k > 0) ++copied;
  }
  double extra = 0;
  int long_drafts = 0;
  for (int i = 0; i < 40; ++i) {
    const int k = c.next_length();
    c.record(k, 0, 0.0, 0.010 * f[k + 1]);
    extra += f[k + 1] - 1.0;
    if (i >= 12 && k > 4) ++long_drafts;
  }
  EXPECT_LT(extra, 9.0);
  EXPECT_EQ(long_drafts, 0);
}

}  // namespace
}  // namespace specdec

namespace specdec {
namespace {

// proposer_stops (a draft model ending its own chains): costs in 1-token passes, a draft step
// 0.44 and a verified token 0.08, so a first draft costs 0.52 and speculation goes off when the
// depth-1 acceptance falls below 0.7 x 0.52 = 0.364.
struct OnOffSim {
  static constexpr double kDraft = 0.44, kVerify = 0.08;
  // One step; `accepted_first` says whether a draft's first token is accepted. Returns k.
  static int step(DraftLengthController& c, bool accepted_first) {
    const int k = c.next_length();
    if (k == 0) {
      c.record(0, 0, 0.0, 1.0);
    } else {
      const int drafted = 2;  // the proposer stopped its chain after two
      c.record(drafted, accepted_first ? 1 : 0, kDraft * drafted, 1.0 + kVerify * drafted);
    }
    return k;
  }
};

DraftLengthConfig on_off_config() {
  DraftLengthConfig c = adaptive_config(8);
  c.proposer_stops = true;
  return c;
}

TEST(DraftLength, OnOffAsksForTheMaximumFromTheFirstStepAndStaysOnAtSixtyPercent) {
  DraftLengthController c(on_off_config());
  // Accepted 3 steps in 5, with runs of rejections: never off (a slow average).
  const bool pattern[] = {true, false, false, true, true};
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(OnOffSim::step(c, pattern[i % 5]), 8) << "step " << i;
  }
  EXPECT_NEAR(c.acceptance(), 0.6, 0.1);
}

TEST(DraftLength, OnOffTurnsOffWhenFirstDraftsFailAndProbesLessOften) {
  DraftLengthController c(on_off_config());
  std::vector<int> spec_steps;  // the steps that drafted
  for (int i = 0; i < 300; ++i) {
    if (OnOffSim::step(c, false) > 0) spec_steps.push_back(i);
  }
  ASSERT_GE(spec_steps.size(), 3u);
  // Off after the first rejection (the prior 0.6 averaged with it: 0.3), probed 4 steps later.
  EXPECT_EQ(spec_steps[0], 0);
  EXPECT_EQ(spec_steps[1], 4);
  EXPECT_LT(spec_steps.size(), 12u) << "probes must thin out";
  // The waits between probes double: each gap at least the one before.
  for (size_t i = 3; i < spec_steps.size(); ++i) {
    EXPECT_GE(spec_steps[i] - spec_steps[i - 1], spec_steps[i - 1] - spec_steps[i - 2]);
  }
}

TEST(DraftLength, OnOffComesBackWhenProbesAreAccepted) {
  DraftLengthController c(on_off_config());
  for (int i = 0; i < 60; ++i) OnOffSim::step(c, false);
  int last_off = -1;
  for (int i = 0; i < 300; ++i) {
    if (OnOffSim::step(c, true) == 0) last_off = i;
  }
  EXPECT_GE(last_off, 0) << "it was off";
  EXPECT_LT(last_off, 150) << "accepted probes must turn speculation back on";
  for (int i = 0; i < 20; ++i) EXPECT_EQ(OnOffSim::step(c, true), 8);
}

TEST(DraftLength, OnOffStaysOnWhenDraftsAreCheapEnough) {
  // At 40% accepted a 0.52 first draft is below cost but within the margin (0.4 > 0.364):
  // speculation stays on; a fixed configuration is never switched.
  DraftLengthController c(on_off_config());
  int off = 0;
  for (int i = 0; i < 500; ++i) off += OnOffSim::step(c, i % 5 < 2) == 0;
  EXPECT_LT(off, 25);
  DraftLengthConfig fixed = on_off_config();
  fixed.adaptive = false;
  fixed.max_draft = 3;
  DraftLengthController f(fixed);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(OnOffSim::step(f, false), 3);
}

}  // namespace
}  // namespace specdec
