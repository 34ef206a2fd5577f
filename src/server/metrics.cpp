#include "server/metrics.h"

#include <algorithm>

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
constexpr SpecMethod kMethods[] = {SpecMethod::kNone, SpecMethod::kNgram, SpecMethod::kDraft};

}  // namespace

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kNgram:
      return "ngram";
    case SpecMethod::kDraft:
      return "draft";
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
  if (configured != SpecMethod::kNone) {
    c_.spec[static_cast<size_t>(configured)].max_position = std::clamp(num_draft, 0, kMaxPositions);
  }
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

void ServerMetrics::on_spec_step(const SpecStep& step) {
  if (step.passes <= 0 && step.drafted <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  SpecCounters& c = c_.spec[static_cast<size_t>(step.method)];
  c.drafted += step.drafted;
  c.accepted += step.accepted;
  c.passes += step.passes;
  // Per position only when the delta is one pass (always, as the engine delivers every step).
  if (step.passes == 1 && step.drafted > 0) {
    ++c.drafts;
    const int64_t depth = std::min<int64_t>(step.accepted, kMaxPositions);
    for (int64_t k = 0; k < depth; ++k) ++c.accepted_at[static_cast<size_t>(k)];
    c.max_position =
        std::max(c.max_position, static_cast<int>(std::min<int64_t>(step.drafted, kMaxPositions)));
  }
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

  // Speculation, one row per method that is configured or was used.
  std::vector<SpecMethod> methods;
  for (SpecMethod m : kMethods) {
    const SpecCounters& sc = c.spec[static_cast<size_t>(m)];
    if (m == configured_ || sc.passes > 0 || sc.drafted > 0) methods.push_back(m);
  }
  struct Series {
    const char* name;
    const char* help;
    int64_t SpecCounters::*field;
  };
  const Series series[] = {
      {"spec_decode_num_draft_tokens_total", "Draft tokens verified by the target",
       &SpecCounters::drafted},
      {"spec_decode_num_accepted_tokens_total", "Draft tokens accepted", &SpecCounters::accepted},
      {"spec_decode_num_drafts_total", "Target passes that verified at least one draft token",
       &SpecCounters::drafts},
      {"spec_decode_target_passes_total", "Target passes of decode steps (with or without drafts)",
       &SpecCounters::passes},
  };
  for (const Series& s : series) {
    header(p + s.name, "counter", s.help, &out);
    for (SpecMethod m : methods) {
      fmt::format_to(std::back_inserter(out), "{}{}{{method=\"{}\"}} {}\n", p, s.name,
                     spec_method_name(m), c.spec[static_cast<size_t>(m)].*s.field);
    }
  }
  header(p + "spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Drafts whose token at this position (0: the first draft token) was accepted", &out);
  for (SpecMethod m : methods) {
    const SpecCounters& sc = c.spec[static_cast<size_t>(m)];
    for (int k = 0; k < sc.max_position; ++k) {
      fmt::format_to(std::back_inserter(out),
                     "{}spec_decode_num_accepted_tokens_per_pos_total{{method=\"{}\",position=\"{}"
                     "\"}} {}\n",
                     p, spec_method_name(m), k, sc.accepted_at[static_cast<size_t>(k)]);
    }
  }
  return out;
}

}  // namespace specdec::server
