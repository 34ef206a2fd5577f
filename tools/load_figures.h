// What the two load modes of `specdec bench` share: the requests (synthetic token-norm-dist
// prompts, or a JSONL prompts file) and the latency figures (TTFT, TPOT, ITL, end to end,
// throughput). The engine load mode (bench_load.cpp) drives the engine in process; the URL mode
// (bench_url.cpp) sends the same requests to a server over HTTP.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_load.h"

namespace specdec {
class Tokenizer;
}

namespace specdec::cli {

// The token ids synthetic prompts are drawn from, uniformly: [min(3, n_vocab - 1), n_vocab) of
// the model, or (when pool is not empty) the ids of pool.
struct TokenSpace {
  int32_t n_vocab = 0;
  std::vector<int32_t> pool;
};

struct LoadRequest {
  int64_t index = 0;  // position in the synthetic set, or 0-based line of the prompts file
  std::vector<int32_t> prompt;  // token ids (a prompts-file request without tokenizer: the prefix)
  std::string text;             // a prompts-file request: the line's prompt
  int max_tokens = 1;
};

struct LoadDataset {
  std::vector<LoadRequest> requests;
  bool synthetic = true;
  nlohmann::ordered_json description;  // {"kind": "synthetic" | "prompts", ...}
};

// Throws specdec::Error naming the option when a dataset option is out of range.
void check_dataset_options(const LoadOptions& o, const LoadBenchInput& in);

// The requests of a run (the same for the same options and seed). Synthetic: --input-mean etc.,
// *num_requests of them; a prompts file: its first *num_requests lines (-1: all of them, and
// *num_requests is set). With tok, a prompts-file line is tokenized after the prefix and checked
// against ctx; without, only its text is kept (the server tokenizes it).
LoadDataset make_load_dataset(const LoadOptions& o, const LoadBenchInput& in,
                              const TokenSpace& space, int64_t ctx, const Tokenizer* tok,
                              int* num_requests);

struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

// Mean and percentiles (interpolated linearly); all 0 for no values.
Distribution distribution(std::vector<double> v);
nlohmann::ordered_json distribution_json(const Distribution& d);

// What one request went through, in seconds since its run started.
struct RequestTiming {
  double submit_s = 0;
  double first_s = -1;  // first chunk with tokens (-1: none)
  double end_s = -1;
  std::vector<double> chunk_s;  // each streamed chunk with tokens
  int64_t output_tokens = 0;
  bool error = false;   // refused, failed or ended with an error
  bool counted = true;  // false: an error before any response (only the error is counted)
};

// The latency figures of a mode, pooled over its runs.
struct LatencyFigures {
  std::vector<double> ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::vector<double> throughput_runs, requests_per_s_runs;
  int64_t errors = 0, output_tokens = 0, completed = 0;
  double wall_s = 0;

  // One request of the run in progress.
  void add_request(const RequestTiming& t);
  // Ends a run of wall_s seconds whose requests were added.
  void end_run(double run_wall_s);

  static double mean(const std::vector<double>& v);
  double throughput() const { return mean(throughput_runs); }

  // throughput_tok_s, throughput_tok_s_runs, requests_per_s, ttft_ms, tpot_ms, itl_ms, e2e_ms,
  // errors.
  void to_json(nlohmann::ordered_json* j) const;
  // The throughput line (prefixed by name) and the four latency rows.
  void print(const char* name) const;

 private:
  int64_t run_tokens_ = 0, run_completed_ = 0;
};

}  // namespace specdec::cli
