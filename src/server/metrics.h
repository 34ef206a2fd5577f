// The server's Prometheus metrics (GET /metrics, text format 0.0.4), every name prefixed
// `specdec_`:
//
//   gauges from the engine      requests_running, requests_waiting, kv_blocks_used,
//                               kv_blocks_cached, kv_blocks_total, requests_in_flight (server)
//   counters                    prompt_tokens_total, generation_tokens_total,
//                               prompt_tokens_computed_total, prefix_cache_queries_total,
//                               prefix_cache_hits_total (KV blocks), requests_finished_total
//                               {finish_reason}, engine_steps_total, preemptions_total
//   histograms (seconds)        time_to_first_token, inter_token_latency, e2e_request_latency
//   speculation, {method=...}   spec_decode_num_draft_tokens_total, _num_accepted_tokens_total,
//                               _num_drafts_total (verification passes with drafts),
//                               _num_accepted_tokens_per_pos_total{position=k}: drafts whose
//                               token at depth k + 1 was accepted (the engine's last position
//                               counts the deeper ones too): EngineStats::spec, by method name;
//                               _target_passes_total: decode passes of the method's requests,
//                               with or without drafts (RequestStats::n_passes, from the server)
//
// Updated from the engine's loop thread (request callbacks) and read by HTTP threads: one
// mutex, held for a few additions.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "specdec/engine.h"

namespace specdec::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value, uint64_t times = 1);
  // `# HELP`, `# TYPE` and the _bucket / _sum / _count lines.
  void render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;    // [n] upper bounds, ascending
  std::vector<uint64_t> counts_;  // [n + 1] per bucket (the last: +Inf), not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  // Positions reported per method: the engine's (deeper drafts count in the last).
  static constexpr int kMaxPositions = EngineStats::SpecCounters::kPositions;

  // `configured`: the server's speculative method (its rows are shown even while zero);
  // `num_draft`: its draft length bound (positions shown, at most kMaxPositions).
  ServerMetrics(SpecMethod configured, int num_draft);

  // HTTP threads.
  void on_request_accepted(int64_t prompt_tokens);
  // Engine loop thread (request callbacks).
  void on_first_token(double ttft_s);
  // `n` tokens arrived `gap_s` after the previous ones: n inter-token latencies of gap_s / n.
  void on_tokens(int64_t n, double gap_s);
  // `passes` more decode passes of a request speculating with `method`.
  void on_target_passes(SpecMethod method, int64_t passes);
  void on_finished(StopReason reason, double e2e_s);

  // The exposition text; engine gauges and counters from `engine`.
  std::string render(const EngineStats& engine, int64_t in_flight, bool ready) const;

 private:
  // Everything the callbacks update: copied under the lock, formatted without it (the loop
  // thread never waits for a render).
  struct Counters {
    int64_t prompt_tokens = 0;
    int64_t generation_tokens = 0;
    std::array<int64_t, 5> finished{};       // by StopReason
    std::array<int64_t, 3> target_passes{};  // by SpecMethod
    Histogram ttft;
    Histogram itl;
    Histogram e2e;
  };

  mutable std::mutex mu_;
  SpecMethod configured_;
  int num_positions_ = 0;  // per-position rows of the configured method
  Counters c_;             // guarded by mu_
};

const char* spec_method_name(SpecMethod m);

}  // namespace specdec::server
