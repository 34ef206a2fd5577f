#include "speculative/draft_length.h"

#include <algorithm>
#include <cmath>

namespace specdec {

DraftLengthController::DraftLengthController(const DraftLengthConfig& config)
    : config_(config),
      interval_(config.proposer_stops ? kOnOffProbeInterval : config.probe_interval) {
  depth_accept_.fill(kInitialAcceptance);
}

int DraftLengthController::next_on_off() {
  if (off_steps_ > 0) {
    if (--off_steps_ > 0) return 0;
    probing_ = true;
  }
  return config_.max_draft;
}

void DraftLengthController::record_on_off(int drafted, int accepted, double draft_seconds,
                                          double pass_seconds) {
  if (drafted == 0) return;
  const bool probe = probing_;
  probing_ = false;
  // The first observations are averaged (the prior counting as one), then a slow average.
  const double w = std::max(kOnOffEma, 1.0 / static_cast<double>(first_obs_ + 2));
  ++first_obs_;
  first_accept_ = (1 - w) * first_accept_ + w * (accepted > 0 ? 1.0 : 0.0);
  accept_ = first_accept_;
  // A first draft's cost in 1-token passes: its draft step and its verified token (the costs
  // given are the cost model's: a plain pass is 1 unless one was recorded).
  const double t1 = t1_ > 0 ? t1_ : 1.0;
  const double cost = (draft_seconds + std::max(0.0, pass_seconds - t1)) / drafted / t1;
  if (first_accept_ < kOffMargin * cost) {
    // A probe whose first draft was rejected doubles the wait; an accepted one shortens it
    // again, so that a run of accepted probes soon turns speculation back on.
    if (probe) {
      interval_ = accepted == 0 ? std::min(2 * interval_, kMaxProbeInterval) : kOnOffProbeInterval;
    }
    off_steps_ = interval_;
  } else {
    interval_ = kOnOffProbeInterval;
  }
}

int DraftLengthController::next_length() {
  if (!config_.adaptive || config_.max_draft <= 0) return std::max(config_.max_draft, 0);
  if (config_.proposer_stops) return next_on_off();
  if (off_steps_ > 0) {
    if (--off_steps_ == 0) {
      probing_ = true;
      return std::min(config_.probe_length, config_.max_draft);
    }
    return 0;
  }
  // A plain step now and then measures the cost of a 1-token pass (it grows with the context).
  if (t1_ <= 0 || ++steps_since_plain_ > kRemeasureInterval) return 0;
  if (!have_verify_cost_) return std::min(config_.max_draft, kFirstDraft);
  double best_rate = 1.0 / t1_;  // k = 0: one token per plain pass
  int best_k = 0;
  double expected = 1.0, reach = 1.0;  // reach: probability that the k-th draft is accepted
  double a_k = accept_;
  for (int k = 1; k <= config_.max_draft; ++k) {
    // A depth not tried recently is believed as likely as the one before it (acceptance is
    // bursty: deeper drafts, given their prefix, are accepted at least as often); depth 1 starts
    // from the pooled rate. The pooled rate no longer floors every depth: it mixes the depths,
    // and after a copied passage it kept failing drafts going (simulated, for zero acceptance
    // after a copied start: 0.987x -> 0.994x of plain speed).
    const int d = std::min(k, kMaxTrackedDepth);
    if (depth_obs_[d] > 0 && step_ - depth_step_[d] <= kDepthLifetime) {
      a_k = depth_accept_[d];
    }
    reach *= std::clamp(a_k, 0.0, 0.999);
    expected += reach;
    const double cost = pass_estimate(k + 1) + k * draft_per_token_;
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

double DraftLengthController::pass_estimate(int m) const {
  auto fresh = [&](int len) {
    return pass_time_[len] > 0 && step_ - pass_step_[len] <= kPassTimeLifetime;
  };
  m = std::clamp(m, 1, kMaxPassTokens);
  if (m == 1) return t1_;
  if (fresh(m)) return pass_time_[m];
  int below = m - 1;
  while (below > 1 && !fresh(below)) --below;
  const double base = below <= 1 ? t1_ : pass_time_[below];
  int above = m + 1;
  while (above <= kMaxPassTokens && !fresh(above)) ++above;
  if (above > kMaxPassTokens) return base + (m - below) * per_token_;
  const double f = static_cast<double>(m - below) / (above - below);
  return base + f * std::max(0.0, pass_time_[above] - base);
}

void DraftLengthController::record(int drafted, int accepted, double draft_seconds,
                                   double pass_seconds, int draft_depth) {
  const double w = config_.ema;
  auto blend = [w](double old, double now) { return old <= 0 ? now : (1 - w) * old + w * now; };
  if (config_.proposer_stops && config_.adaptive) {
    if (drafted == 0) t1_ = blend(t1_, pass_seconds);
    record_on_off(drafted, accepted, draft_seconds, pass_seconds);
    return;
  }
  ++step_;
  if (drafted == 0) {
    t1_ = blend(t1_, pass_seconds);
    steps_since_plain_ = 0;
    return;
  }
  probe_done_ = probing_;
  probing_ = false;
  // Per depth: the draft at depth i was tried when all before it were accepted. Acceptance is
  // bursty (a copied passage is accepted as a whole, a digression not at all), so later depths,
  // given their prefix, are accepted more often than the first: a single geometric rate would
  // understate long drafts.
  const int depth = draft_depth > 0 ? draft_depth : drafted;
  const int tried = std::min(accepted + 1, depth);
  // The first observations of a depth are averaged with the optimistic prior (counted as one
  // observation) rather than blended at the EMA weight, so that a sequence where nothing is
  // accepted stops speculating after a few steps, not after ~15.
  for (int i = 1; i <= tried; ++i) {
    const int d = std::min(i, kMaxTrackedDepth);
    const double wi = std::max(w, 1.0 / (depth_obs_[d] + 2));
    ++depth_obs_[d];
    depth_step_[d] = step_;
    depth_accept_[d] = (1 - wi) * depth_accept_[d] + wi * (i <= accepted ? 1.0 : 0.0);
  }
  // Everything drafted was accepted: depths not tried yet are believed at least as likely.
  if (accepted == depth) {
    for (int i = depth + 1; i <= kMaxTrackedDepth; ++i) {
      depth_accept_[i] = std::max(depth_accept_[i], depth_accept_[std::min(depth, kMaxTrackedDepth)]);
    }
  }
  // The overall rate (reported by acceptance()): `accepted` successes then one failure.
  const int trials = accepted + (accepted < depth ? 1 : 0);
  const double observed = trials > 0 ? static_cast<double>(accepted) / trials : accept_;
  const double w_all = std::max(w, 1.0 / (accept_obs_ + 2));
  accept_obs_ += std::max(trials, 1);
  const double wk = 1.0 - std::pow(1.0 - w_all, std::max(trials, 1));
  accept_ = (1 - wk) * accept_ + wk * observed;
  const int m = std::min(drafted + 1, kMaxPassTokens);
  const bool stale = step_ - pass_step_[m] > kPassTimeLifetime;
  pass_time_[m] = stale ? pass_seconds : blend(pass_time_[m], pass_seconds);
  pass_step_[m] = step_;
  if (t1_ > 0) {
    per_token_ = have_verify_cost_ ? blend(per_token_, std::max(0.0, (pass_seconds - t1_) / drafted))
                                   : std::max(0.0, (pass_seconds - t1_) / drafted);
    have_verify_cost_ = true;
  }
  draft_per_token_ = blend(draft_per_token_, draft_seconds / drafted);
}

}  // namespace specdec
