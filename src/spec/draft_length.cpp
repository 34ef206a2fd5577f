#include "spec/draft_length.h"

#include <algorithm>
#include <cmath>

namespace specdec {

DraftLengthController::DraftLengthController(const DraftLengthConfig& config)
    : config_(config), interval_(config.probe_interval) {}

int DraftLengthController::next_length() {
  if (!config_.adaptive || config_.max_draft <= 0) return std::max(config_.max_draft, 0);
  if (off_steps_ > 0) {
    if (--off_steps_ == 0) {
      probing_ = true;
      return std::min(config_.probe_length, config_.max_draft);
    }
    return 0;
  }
  // A plain step now and then measures the cost of a 1-token pass (it grows with the context).
  if (t1_ <= 0 || ++steps_since_plain_ > kRemeasureInterval) return 0;
  if (!have_verify_cost_) return config_.max_draft;
  const double a = std::clamp(accept_, 0.0, 0.999);
  double best_rate = 1.0 / t1_;  // k = 0: one token per plain pass
  int best_k = 0;
  double expected = 1.0, ak = 1.0;
  for (int k = 1; k <= config_.max_draft; ++k) {
    ak *= a;
    expected += ak;
    const double cost = t1_ + k * (per_token_ + draft_per_token_);
    const double rate = expected / cost;
    if (rate > best_rate) {
      best_rate = rate;
      best_k = k;
    }
  }
  if (best_k == 0) {
    // A probe that did not pay doubles the wait before the next one (up to kMaxProbeInterval);
    // speculation that pays resets it.
    if (probe_done_) interval_ = std::min(2 * interval_, kMaxProbeInterval);
    off_steps_ = interval_;
  } else {
    interval_ = config_.probe_interval;
  }
  probe_done_ = false;
  return best_k;
}

void DraftLengthController::record(int drafted, int accepted, double draft_seconds,
                                   double pass_seconds) {
  const double w = config_.ema;
  auto blend = [w](double old, double now) { return old <= 0 ? now : (1 - w) * old + w * now; };
  if (drafted == 0) {
    t1_ = blend(t1_, pass_seconds);
    steps_since_plain_ = 0;
    return;
  }
  probe_done_ = probing_;
  probing_ = false;
  // Geometric model: `accepted` successes then one failure unless all drafts were accepted.
  const int trials = accepted + (accepted < drafted ? 1 : 0);
  const double observed = trials > 0 ? static_cast<double>(accepted) / trials : accept_;
  // Weight by the number of trials so long drafts count for more evidence.
  const double wk = 1.0 - std::pow(1.0 - w, std::max(trials, 1));
  accept_ = (1 - wk) * accept_ + wk * observed;
  if (t1_ > 0) {
    per_token_ = have_verify_cost_ ? blend(per_token_, std::max(0.0, (pass_seconds - t1_) / drafted))
                                   : std::max(0.0, (pass_seconds - t1_) / drafted);
    have_verify_cost_ = true;
  }
  draft_per_token_ = blend(draft_per_token_, draft_seconds / drafted);
}

}  // namespace specdec
