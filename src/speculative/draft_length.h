// Adaptive speculation (issue 3 §5): chooses each step's draft length from what speculation
// has recently earned, so that it never costs more than it saves.
//
// Model: the draft at depth i is accepted with probability a_i given its parent was (running
// averages per depth), so k drafts yield E(k) = 1 + Σ_{i<=k} a_1·…·a_i tokens per target pass.
// A pass over m = 1 + k tokens costs T(m), measured per m (running averages; the cost is far
// from linear: on CPU a pass over 2-4 tokens costs little more than over 1, while 8 cost more),
// interpolated between measured lengths and extrapolated beyond them with the mean extra cost
// per verified token; plus k·d of drafting (d: measured draft cost per token). The controller
// picks the k in [0, max] with the best E(k) / cost(k), all figures being running averages
// from this sequence. A depth not reached recently (or never) takes the estimate of the depth
// before it: after a copied passage, depths 2..k keep high estimates that say nothing once
// drafts fail at depth 1, and would keep long drafts going. When k = 0 wins, speculation is off
// for `probe_interval` steps and then probed again with a short draft; each probe that does not
// pay doubles the wait (up to 256 steps).
//
// A proposer that ends its own drafts where they stop paying (a draft model drafting while the
// chance of its chain, by its own probabilities, is worth another draft step: DraftDecoder's
// cost rules) sets `proposer_stops`: the controller then only turns speculation on and off. It asks
// for max_draft while on, and turns off when the depth-1 acceptance (a slow running average)
// falls below 0.7x what a first draft costs (its draft step and verified token, in 1-token
// passes): below that a first draft no longer earns its cost even counted generously. Off, it
// probes again after probe_interval steps (doubling after a probe that did not pay). Simulated
// on recorded MT-Bench positions of Qwen2.5-Coder 0.5B drafting for 1.5B (session 23), this
// gave 1.20x with 1 of 20 prompts below 1.0x where the per-depth length choice gave 1.02x with
// 12 below (and matched the measured 1.017x): the per-depth estimates stopped chains the draft
// was sure of, and a few rejections in a row turned speculation off for good.
#pragma once

#include <array>
#include <cstdint>

namespace specdec {

struct DraftLengthConfig {
  int max_draft = 8;      // upper bound (and the fixed length when !adaptive)
  bool adaptive = true;
  int probe_interval = 16;  // steps without speculation before probing again
  int probe_length = 2;
  double ema = 0.15;        // weight of the newest observation
  bool proposer_stops = false;  // the proposer ends its drafts itself: on/off only (see above)
};

class DraftLengthController {
 public:
  explicit DraftLengthController(const DraftLengthConfig& config);

  // Draft tokens to ask for this step (0: plain decoding step).
  int next_length();

  // The step's outcome: drafts proposed (may be fewer than asked; tree nodes for a tree), drafts
  // accepted on the path, seconds spent drafting and in the target pass over 1 + drafted tokens,
  // and the depth of the draft (its longest path; default: drafted, a chain).
  void record(int drafted, int accepted, double draft_seconds, double pass_seconds,
              int draft_depth = -1);

  double acceptance() const { return accept_; }

 private:
  int next_on_off();
  void record_on_off(int drafted, int accepted, double draft_seconds, double pass_seconds);
  // proposer_stops: the depth-1 acceptance, a slow average (a few rejections in a row must not
  // turn off a draft that is right 60-70% of the time; measured MT-Bench runs of the Qwen pair
  // alternate such stretches).
  static constexpr double kOnOffEma = 0.05;
  static constexpr double kOffMargin = 0.7;  // off below this fraction of a first draft's cost
  static constexpr int kOnOffProbeInterval = 4;
  double first_accept_ = kInitialAcceptance;
  int64_t first_obs_ = 0;
  DraftLengthConfig config_;
  static constexpr double kInitialAcceptance = 0.6;  // optimistic, so speculation is tried
  static constexpr int kMaxTrackedDepth = 16;  // deeper drafts share the last estimate
  // The first draft, which measures the verification cost: short, as a pass over 9 tokens costs
  // ~2x a plain one on CPU, a loss where nothing will be accepted.
  static constexpr int kFirstDraft = 4;
  double accept_ = kInitialAcceptance;  // overall per-token acceptance (reporting)
  std::array<double, kMaxTrackedDepth + 1> depth_accept_;  // [depth] a_i; index 0 unused
  std::array<int64_t, kMaxTrackedDepth + 1> depth_obs_{};  // [depth] observations so far
  std::array<int64_t, kMaxTrackedDepth + 1> depth_step_{};  // [depth] step of the last one
  // A depth not reached for this many steps is judged like the depth before it again (what
  // it earned while the text was being copied says little once drafts fail at depth 1).
  static constexpr int64_t kDepthLifetime = 16;
  int64_t accept_obs_ = 0;                                 // trials behind accept_
  // Estimated seconds of a target pass over m new tokens, m >= 1.
  double pass_estimate(int m) const;
  static constexpr int kMaxPassTokens = 64;  // longer passes share the last slot
  std::array<double, kMaxPassTokens + 1> pass_time_{};  // [m] seconds, 0 = not measured
  std::array<int64_t, kMaxPassTokens + 1> pass_step_{};  // [m] step of the last measurement
  // Older measurements are ignored (costs drift with the context, and a length that stopped
  // being chosen must not be judged forever by what it cost long ago).
  static constexpr int64_t kPassTimeLifetime = 64;
  int64_t step_ = 0;
  double t1_ = 0;             // seconds of a 1-token pass (0 = not measured yet)
  double per_token_ = 0;      // extra seconds per verified draft token
  double draft_per_token_ = 0;
  bool have_verify_cost_ = false;
  int off_steps_ = 0;         // steps left before probing again
  bool probing_ = false;     // the step being recorded is a probe
  bool probe_done_ = false;  // the last recorded speculative step was a probe
  int interval_;             // current wait between probes
  static constexpr int kMaxProbeInterval = 256;
  int steps_since_plain_ = 0;
  static constexpr int kRemeasureInterval = 64;
};

}  // namespace specdec
