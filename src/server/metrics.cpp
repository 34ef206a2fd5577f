#include "server/metrics.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace specdec::server {
namespace {

void header(const std::string& name, const char* type, const std::string& help, std::string* out) {
  fmt::format_to(std::back_inserter(*out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void scalar(const std::string& name, const char* type, const std::string& help, double value,
            std::string* out) {
  header(name, type, help, out);
  fmt::format_to(std::back_inserter(*out), "{} {}\n", name, value);
}

std::string format_bound(double b) {
  return fmt::format("{}", b);
}

constexpr StopReason kReasons[] = {StopReason::kStop, StopReason::kLength, StopReason::kCancelled,
                                   StopReason::kError};
constexpr SpecMethod kMethods[] = {SpecMethod::kNone, SpecMethod::kNgram, SpecMethod::kDraft,
                                   SpecMethod::kReDrafter, SpecMethod::kMedusa};

}  // namespace

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kNgram:
      return "ngram";
    case SpecMethod::kDraft:
      return "draft";
    case SpecMethod::kReDrafter:
      return "redrafter";
    case SpecMethod::kMedusa:
      return "medusa";
  }
  return "?";
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t times) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  counts_[i] += times;
  sum_ += value * static_cast<double>(times);
  count_ += times;
}

void Histogram::render(const std::string& name, const std::string& help, std::string* out) const {
  header(name, "histogram", help, out);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    fmt::format_to(std::back_inserter(*out), "{}_bucket{{le=\"{}\"}} {}\n", name,
                   format_bound(bounds_[i]), cumulative);
  }
  cumulative += counts_.back();
  fmt::format_to(std::back_inserter(*out), "{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n",
                 name, cumulative, name, sum_, name, count_);
}

ServerMetrics::ServerMetrics(SpecMethod configured, int num_draft)
    : configured_(configured),
      c_{.ttft = Histogram({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                            2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
         .itl = Histogram({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                           0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5}),
         .e2e = Histogram({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                           20.0, 30.0, 40.0, 50.0, 60.0, 120.0})} {
  if (configured != SpecMethod::kNone) num_positions_ = std::clamp(num_draft, 1, kMaxPositions);
}

void ServerMetrics::on_request_accepted(int64_t prompt_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  c_.prompt_tokens += prompt_tokens;
}

void ServerMetrics::on_first_token(double ttft_s) {
  std::lock_guard<std::mutex> lock(mu_);
  c_.ttft.observe(ttft_s);
}

void ServerMetrics::on_tokens(int64_t n, double gap_s) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  c_.generation_tokens += n;
  if (gap_s >= 0) c_.itl.observe(gap_s / static_cast<double>(n), static_cast<uint64_t>(n));
}

void ServerMetrics::on_target_passes(SpecMethod method, int64_t passes) {
  if (passes <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  c_.target_passes[static_cast<size_t>(method)] += passes;
}

void ServerMetrics::on_finished(StopReason reason, double e2e_s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++c_.finished[static_cast<size_t>(reason)];
  c_.e2e.observe(e2e_s);
}

std::string ServerMetrics::render(const EngineStats& es, int64_t in_flight, bool ready) const {
  std::string out;
  out.reserve(8192);
  const std::string p = "specdec_";
  scalar(p + "up", "gauge", "1 when the model is loaded and requests are served", ready ? 1 : 0,
         &out);
  scalar(p + "requests_running", "gauge", "Requests running in the engine (holding KV blocks)",
         static_cast<double>(es.requests_running), &out);
  scalar(p + "requests_waiting", "gauge", "Requests waiting for admission to the engine",
         static_cast<double>(es.requests_waiting), &out);
  scalar(p + "requests_in_flight", "gauge",
         "Generations submitted by the server and not finished (compared with --max-queue)",
         static_cast<double>(in_flight), &out);
  scalar(p + "kv_blocks_used", "gauge", "KV blocks referenced by live requests",
         static_cast<double>(es.kv_blocks_used), &out);
  scalar(p + "kv_blocks_cached", "gauge", "KV blocks kept only for prefix reuse (free to reclaim)",
         static_cast<double>(es.kv_blocks_cached), &out);
  scalar(p + "kv_blocks_total", "gauge", "KV blocks in the pool",
         static_cast<double>(es.kv_blocks_total), &out);
  scalar(p + "engine_steps_total", "counter", "Engine steps", static_cast<double>(es.steps), &out);
  scalar(p + "preemptions_total", "counter", "Requests preempted (blocks freed, recomputed)",
         static_cast<double>(es.preemptions), &out);
  scalar(p + "prompt_tokens_computed_total", "counter",
         "Prompt tokens computed by the model (prefix-cache hits not counted)",
         static_cast<double>(es.tokens_prompt), &out);
  scalar(p + "prefix_cache_queries_total", "counter",
         "Whole prompt KV blocks looked up in the prefix cache at admission",
         static_cast<double>(es.prefix_blocks_queried), &out);
  scalar(p + "prefix_cache_hits_total", "counter",
         "Whole prompt KV blocks found in the prefix cache at admission",
         static_cast<double>(es.prefix_blocks_hit), &out);

  const Counters c = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return c_;
  }();
  scalar(p + "prompt_tokens_total", "counter", "Prompt tokens of accepted requests",
         static_cast<double>(c.prompt_tokens), &out);
  scalar(p + "generation_tokens_total", "counter", "Generated tokens sent to clients",
         static_cast<double>(c.generation_tokens), &out);
  header(p + "requests_finished_total", "counter", "Generations finished, by reason", &out);
  for (StopReason r : kReasons) {
    const char* name = r == StopReason::kCancelled ? "abort" : stop_reason_name(r);
    fmt::format_to(std::back_inserter(out),
                   "{}requests_finished_total{{finish_reason=\"{}\"}} {}\n", p, name,
                   c.finished[static_cast<size_t>(r)]);
  }
  c.ttft.render(p + "time_to_first_token_seconds",
                "Time from the request's arrival to its first generated token", &out);
  c.itl.render(p + "inter_token_latency_seconds",
               "Time between generated tokens (a step's gap shared by the tokens it produced)",
               &out);
  c.e2e.render(p + "e2e_request_latency_seconds",
               "Time from the request's arrival to its last token", &out);

  // Speculation, one row per method that is configured or was used: by name, as the engine
  // counts them.
  std::map<std::string, EngineStats::SpecCounters> spec = es.spec;
  std::map<std::string, int64_t> passes;
  for (SpecMethod m : kMethods) {
    const int64_t n = c.target_passes[static_cast<size_t>(m)];
    if (m == configured_ || n > 0) {
      passes[spec_method_name(m)] = n;
      spec.try_emplace(spec_method_name(m));
    }
  }
  using SpecCounters = EngineStats::SpecCounters;
  struct Series {
    const char* name;
    const char* help;
    int64_t SpecCounters::*field;  // null: target passes
  };
  const Series series[] = {
      {"spec_decode_num_draft_tokens_total", "Draft tokens verified by the target",
       &SpecCounters::drafted},
      {"spec_decode_num_accepted_tokens_total", "Draft tokens accepted", &SpecCounters::accepted},
      {"spec_decode_num_drafts_total", "Target passes that verified at least one draft token",
       &SpecCounters::passes},
      {"spec_decode_target_passes_total", "Target passes of decode steps (with or without drafts)",
       nullptr},
  };
  for (const Series& s : series) {
    header(p + s.name, "counter", s.help, &out);
    for (const auto& [method, sc] : spec) {
      const int64_t value = s.field != nullptr ? sc.*s.field : passes[method];
      fmt::format_to(std::back_inserter(out), "{}{}{{method=\"{}\"}} {}\n", p, s.name, method,
                     value);
    }
  }
  header(p + "spec_decode_num_accepted_tokens_per_pos_total", "counter",
         fmt::format("Drafts whose token at this position (0: the first draft token) was accepted "
                     "(position {}: that one or a deeper one)",
                     kMaxPositions - 1),
         &out);
  for (const auto& [method, sc] : spec) {
    // The configured draft length's positions, and any other that counted something.
    int shown = method == spec_method_name(configured_) ? num_positions_ : 0;
    for (int k = 0; k < kMaxPositions; ++k) {
      if (sc.accepted_at[static_cast<size_t>(k)] > 0) shown = std::max(shown, k + 1);
    }
    for (int k = 0; k < shown; ++k) {
      fmt::format_to(std::back_inserter(out),
                     "{}spec_decode_num_accepted_tokens_per_pos_total{{method=\"{}\",position=\"{}"
                     "\"}} {}\n",
                     p, method, k, sc.accepted_at[static_cast<size_t>(k)]);
    }
  }
  return out;
}

}  // namespace specdec::server
