// specdec bench --concurrency N / --num-requests N: the engine under load.
//
// The requests: synthetic (trtllm-bench's token-norm-dist: prompt and output lengths drawn from
// normal distributions, --input-mean/--input-stdev/--output-mean/--output-stdev, clamped to
// >= 1 and to the context; prompts are random token ids from --seed; ignore_eos, so a request
// generates exactly its output length), or a JSONL file (--prompts: one request a line, a JSON
// string or an object with a "prompt" or "text" field; up to -n tokens, stopping at the model's
// end-of-generation tokens). --prefix-len N puts the same N synthetic tokens before every prompt.
//
// A run: a fresh engine (empty prefix cache), `concurrency` requests in flight (the next one
// submitted when one finishes), engine.step() on this thread until all have finished; per
// request the submit time, the time of each streamed chunk, first token and end. With --spec
// the runs alternate plain, spec, plain, spec, ... (--repeats pairs).
//
// Figures of a mode (distributions pooled over its runs):
//   throughput_tok_s   output tokens / wall time of the run (mean over runs; the runs' values
//                      in throughput_tok_s_runs); requests_per_s likewise
//   ttft_ms            first token - submit;   e2e_ms: end - submit
//   tpot_ms            (e2e - ttft) / (output tokens - 1), requests with >= 2 tokens
//   itl_ms             gaps between a request's consecutive streamed chunks
//   (each of the four: {"mean", "p50", "p90", "p99"}, percentiles interpolated linearly)
//   errors             submit errors + requests finished with reason error
//   kv_blocks_total, kv_blocks_peak (max over runs), kv_pool_bytes, preemptions
//   prefix_cache_hit_rate  prefix blocks hit / queried (0 when none queried)
//   tokens_per_pass    tokens emitted by decode passes / decode passes (1 without speculation)
//   acceptance_rate, drafted, accepted; spec_methods: {"ngram": {drafted, accepted,
//                      acceptance_rate, tokens_per_pass}} (empty without speculation)
//
// JSON (--output-format json), one object:
//   {"bench": "load", "model", "cpu", "isa", "threads", "kv_type", "ctx_size",
//    "dataset": {"kind": "synthetic" | "prompts", ...lengths or file, "prefix_len", "seed"},
//    "engine": {"kv_cache_mib", "block_size", "prefix_cache", "max_batch_tokens", "max_seqs"},
//    "num_requests", "concurrency", "repeats", "speculation": "none" | description,
//    "mode": "spec" | "plain",  <- whose figures follow at the top level
//    ...the figures of that mode...,
//    "plain": {figures}, "spec": {figures} (with --spec), "speedup" (with --spec: the mean over
//    the pairs of spec throughput / plain throughput)}
// --dump-outputs FILE: one JSON line per request and mode (the first run of each mode):
//   {"index", "mode": "plain" | "spec", "tokens": [generated ids], "text", "finish_reason"}
#include "bench_load.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/thread_pool.h"
#include "cli_common.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct LoadRequest {
  int64_t index = 0;  // position in the synthetic set, or 0-based line of the prompts file
  std::vector<int32_t> prompt;
  int max_tokens = 1;
};

struct Dataset {
  std::vector<LoadRequest> requests;
  bool synthetic = true;
  nlohmann::ordered_json description;
};

// What one request of one run went through (times in seconds since the run started).
struct RequestRecord {
  double submit_s = 0;
  double first_s = -1;
  double end_s = -1;
  std::vector<double> chunk_s;  // each streamed chunk with tokens
  std::vector<int32_t> tokens;
  std::string text;
  StopReason reason = StopReason::kNone;
  bool submit_error = false;
  std::string error;
  RequestStats stats;
};

struct RunResult {
  double wall_s = 0;
  std::vector<RequestRecord> records;
  EngineStats engine;
};

// The first CPU's model name from /proc/cpuinfo ("unknown" elsewhere).
std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

void check_options(const LoadOptions& o, const LoadBenchInput& in) {
  if (o.concurrency != -1 && o.concurrency < 1) {
    throw Error(fmt::format("--concurrency must be at least 1, got {}", o.concurrency));
  }
  if (o.num_requests != -1 && o.num_requests < 1) {
    throw Error(fmt::format("--num-requests must be at least 1, got {}", o.num_requests));
  }
  if (o.input_stdev < 0) {
    throw Error(fmt::format("--input-stdev must not be negative, got {}", o.input_stdev));
  }
  if (o.output_stdev < 0) {
    throw Error(fmt::format("--output-stdev must not be negative, got {}", o.output_stdev));
  }
  if (o.prefix_len < 0) {
    throw Error(fmt::format("--prefix-len must not be negative, got {}", o.prefix_len));
  }
  if (in.interleave) throw Error("--interleave does not apply to the load mode (--concurrency)");
  if (!in.prompts_file.empty()) {
    if (o.input_mean != -1 || o.output_mean != -1 || o.input_stdev != 0 || o.output_stdev != 0) {
      throw Error(
          "--input-mean/--input-stdev/--output-mean/--output-stdev describe synthetic requests; "
          "with --prompts the output length is -n");
    }
    if (in.n_gen < 1) throw Error(fmt::format("-n must be at least 1, got {}", in.n_gen));
  } else {
    const double input_mean = o.input_mean != -1 ? o.input_mean : in.n_prompt;
    const double output_mean = o.output_mean != -1 ? o.output_mean : in.n_gen;
    if (input_mean < 1) {
      throw Error(fmt::format("--input-mean must be at least 1, got {}", input_mean));
    }
    if (output_mean < 1) {
      throw Error(fmt::format("--output-mean must be at least 1, got {}", output_mean));
    }
    if (in.chat) throw Error("--chat needs --prompts (synthetic prompts are token ids)");
  }
}

// A length from N(mean, stdev), rounded and clamped to [lo, hi].
int draw_length(std::mt19937_64& rng, double mean, double stdev, int lo, int hi) {
  double x = mean;
  if (stdev > 0) x = std::normal_distribution<double>(mean, stdev)(rng);
  const double clamped =
      std::clamp(std::round(x), static_cast<double>(lo), static_cast<double>(hi));
  return static_cast<int>(clamped);
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int n, int n_vocab) {
  std::uniform_int_distribution<int32_t> dist(std::min(3, n_vocab - 1), n_vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

// One request a non-blank line: a JSON string, or an object with a "prompt" or "text" string.
// Returns (0-based line, text) pairs.
std::vector<std::pair<int64_t, std::string>> read_prompt_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot open prompts file", path));
  std::vector<std::pair<int64_t, std::string>> prompts;
  std::string line;
  for (int64_t line_no = 0; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::ordered_json::exception& e) {
      throw Error(fmt::format("{}:{}: not JSON: {}", path, line_no + 1, e.what()));
    }
    if (j.is_string()) {
      prompts.emplace_back(line_no, j.get<std::string>());
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      prompts.emplace_back(line_no, j["prompt"].get<std::string>());
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      prompts.emplace_back(line_no, j["text"].get<std::string>());
    } else {
      throw Error(fmt::format(
          "{}:{}: expected a JSON string or an object with a \"prompt\" or \"text\" string", path,
          line_no + 1));
    }
  }
  if (prompts.empty()) throw Error(fmt::format("{}: no prompts", path));
  return prompts;
}

Dataset make_dataset(const LoadOptions& o, const LoadBenchInput& in, const Tokenizer& tok,
                     int n_vocab, int64_t ctx, int* num_requests) {
  Dataset ds;
  std::mt19937_64 rng(in.sampling.seed);
  if (o.prefix_len > ctx - 2) {
    throw Error(
        fmt::format("--prefix-len {} leaves no room for a prompt and an output in the "
                    "context of {} tokens",
                    o.prefix_len, ctx));
  }
  const std::vector<int32_t> prefix = random_tokens(rng, o.prefix_len, n_vocab);
  const int room = static_cast<int>(ctx) - o.prefix_len;  // prompt + output tokens
  if (in.prompts_file.empty()) {
    ds.synthetic = true;
    const double input_mean = o.input_mean != -1 ? o.input_mean : in.n_prompt;
    const double output_mean = o.output_mean != -1 ? o.output_mean : in.n_gen;
    ds.description = {{"kind", "synthetic"},
                      {"input_mean", input_mean},
                      {"input_stdev", o.input_stdev},
                      {"output_mean", output_mean},
                      {"output_stdev", o.output_stdev},
                      {"prefix_len", o.prefix_len},
                      {"seed", in.sampling.seed}};
    for (int i = 0; i < *num_requests; ++i) {
      LoadRequest r;
      r.index = i;
      const int n_in = draw_length(rng, input_mean, o.input_stdev, 1, room - 1);
      r.max_tokens = draw_length(rng, output_mean, o.output_stdev, 1, room - n_in);
      r.prompt = prefix;
      const std::vector<int32_t> own = random_tokens(rng, n_in, n_vocab);
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
      ds.requests.push_back(std::move(r));
    }
    return ds;
  }
  ds.synthetic = false;
  const auto lines = read_prompt_lines(in.prompts_file);
  if (*num_requests == -1) *num_requests = static_cast<int>(lines.size());
  if (*num_requests > static_cast<int>(lines.size())) {
    throw Error(fmt::format("--num-requests {} exceeds the {} prompts of {} (each is sent once)",
                            *num_requests, lines.size(), in.prompts_file));
  }
  ds.description = {{"kind", "prompts"}, {"file", in.prompts_file},    {"chat", in.chat},
                    {"n_gen", in.n_gen}, {"prefix_len", o.prefix_len}, {"seed", in.sampling.seed}};
  for (int i = 0; i < *num_requests; ++i) {
    const auto& [line_no, text] = lines[static_cast<size_t>(i)];
    LoadRequest r;
    r.index = line_no;
    r.prompt = prefix;
    const std::vector<int32_t> own =
        in.chat ? tok.encode(tok.apply_chat_template({{"user", text}}, true), false, true)
                : tok.encode(text, true, true);
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    if (n + 1 > ctx) {
      throw Error(fmt::format("{}:{}: a prompt of {} tokens does not fit the context of {}",
                              in.prompts_file, line_no + 1, n, ctx));
    }
    r.max_tokens = static_cast<int>(std::min<int64_t>(in.n_gen, ctx - n));
    ds.requests.push_back(std::move(r));
  }
  return ds;
}

Request make_request(const LoadRequest& lr, const Dataset& ds, const SamplingParams& sampling,
                     const SpecParams& spec) {
  Request r;
  r.prompt = lr.prompt;
  r.sampling = sampling;
  r.max_tokens = lr.max_tokens;
  r.ignore_eos = ds.synthetic;
  r.spec = spec;
  return r;
}

// Warms the thread pool, caches and the kernels' scratch up with one short request on a small
// engine of the same configuration.
void warm_up(Model& model, const Tokenizer* tok, ThreadPool* pool, EngineConfig config,
             const Dataset& ds, const SamplingParams& sampling, const SpecParams& spec) {
  const LoadRequest& first = ds.requests.front();
  const int64_t slots = static_cast<int64_t>(first.prompt.size()) + 16 + 64;
  config.kv_blocks = static_cast<int32_t>(slots / config.block_size + 2);
  Engine engine(model, tok, pool, config);
  Request r = make_request(first, ds, sampling, spec);
  r.max_tokens = std::min(r.max_tokens, 8);
  if (!engine.submit(std::move(r)).ok()) return;
  while (engine.has_work()) engine.step();
}

RunResult run_once(Model& model, const Tokenizer* tok, ThreadPool* pool, const EngineConfig& config,
                   const Dataset& ds, const SamplingParams& sampling, const SpecParams& spec,
                   int concurrency, const std::string& label) {
  const int n = static_cast<int>(ds.requests.size());
  RunResult result;
  result.records.resize(static_cast<size_t>(n));
  Engine engine(model, tok, pool, config);
  int next = 0, in_flight = 0, done = 0;
  const int progress_every = std::max(1, n / 10);
  int progress_shown = 0;
  const Clock::time_point t0 = Clock::now();
  auto submit_next = [&] {
    RequestRecord& rec = result.records[static_cast<size_t>(next)];
    Request r = make_request(ds.requests[static_cast<size_t>(next)], ds, sampling, spec);
    r.on_output = [&rec, &in_flight, &done, t0](const RequestOutput& out) {
      const double t = seconds_since(t0);
      if (!out.tokens.empty()) {
        rec.chunk_s.push_back(t);
        if (rec.first_s < 0) rec.first_s = t;
        rec.tokens.insert(rec.tokens.end(), out.tokens.begin(), out.tokens.end());
      }
      rec.text += out.text;
      if (out.finished) {
        rec.end_s = t;
        rec.reason = out.reason;
        rec.error = out.error;
        rec.stats = out.stats;
        --in_flight;
        ++done;
      }
      return true;
    };
    ++next;
    rec.submit_s = seconds_since(t0);
    const SubmitResult s = engine.submit(std::move(r));
    if (s.ok()) {
      ++in_flight;
    } else {
      rec.submit_error = true;
      rec.error = s.error;
      rec.end_s = rec.submit_s;
      ++done;
    }
  };
  int idle_steps = 0;
  while (done < n) {
    while (in_flight < concurrency && next < n) submit_next();
    if (in_flight == 0) continue;  // the rest were refused at submit
    if (engine.step()) {
      idle_steps = 0;
    } else if (++idle_steps > 1000) {
      throw Error(fmt::format("{}: the engine stopped making progress with {} requests in flight",
                              label, in_flight));
    }
    if (done / progress_every > progress_shown) {
      progress_shown = done / progress_every;
      const double elapsed = seconds_since(t0);
      if (elapsed > 1.0) {
        fmt::print(stderr, "{}: {}/{} requests done ({:.1f} s)\n", label, done, n, elapsed);
      }
    }
  }
  result.wall_s = seconds_since(t0);
  result.engine = engine.stats();
  return result;
}

struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

Distribution distribution(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  d.p50 = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p99 = percentile(v, 99);
  return d;
}

nlohmann::ordered_json distribution_json(const Distribution& d) {
  return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}};
}

// The figures of one mode over its runs.
struct ModeFigures {
  std::vector<double> ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::vector<double> throughput_runs, requests_per_s_runs;
  int64_t errors = 0, output_tokens = 0, input_tokens = 0, completed = 0;
  double wall_s = 0;
  int64_t kv_blocks_total = 0, kv_blocks_peak = 0, kv_pool_bytes = 0, preemptions = 0;
  int64_t prefix_queried = 0, prefix_hit = 0;
  int64_t drafted = 0, accepted = 0, decode_passes = 0, decode_tokens = 0;

  void add(const RunResult& run, const Dataset& ds) {
    int64_t run_tokens = 0, run_completed = 0;
    for (size_t i = 0; i < run.records.size(); ++i) {
      const RequestRecord& r = run.records[i];
      input_tokens += static_cast<int64_t>(ds.requests[i].prompt.size());
      if (r.submit_error) {
        ++errors;
        continue;
      }
      if (r.reason == StopReason::kError) ++errors;
      ++run_completed;
      const auto n_out = static_cast<int64_t>(r.tokens.size());
      run_tokens += n_out;
      const double e2e = (r.end_s - r.submit_s) * 1e3;
      e2e_ms.push_back(e2e);
      if (r.first_s >= 0) {
        const double ttft = (r.first_s - r.submit_s) * 1e3;
        ttft_ms.push_back(ttft);
        if (n_out >= 2) tpot_ms.push_back((e2e - ttft) / static_cast<double>(n_out - 1));
      }
      for (size_t c = 1; c < r.chunk_s.size(); ++c) {
        itl_ms.push_back((r.chunk_s[c] - r.chunk_s[c - 1]) * 1e3);
      }
      drafted += r.stats.n_drafted;
      accepted += r.stats.n_accepted;
      decode_passes += r.stats.n_passes;
      decode_tokens += std::max<int64_t>(0, r.stats.n_generated - 1);
    }
    output_tokens += run_tokens;
    completed += run_completed;
    wall_s += run.wall_s;
    throughput_runs.push_back(run.wall_s > 0 ? static_cast<double>(run_tokens) / run.wall_s : 0);
    requests_per_s_runs.push_back(run.wall_s > 0 ? static_cast<double>(run_completed) / run.wall_s
                                                 : 0);
    kv_blocks_total = run.engine.kv_blocks_total;
    kv_blocks_peak = std::max(kv_blocks_peak, run.engine.kv_blocks_peak);
    kv_pool_bytes = run.engine.kv_pool_bytes;
    preemptions += run.engine.preemptions;
    prefix_queried += run.engine.prefix_blocks_queried;
    prefix_hit += run.engine.prefix_blocks_hit;
  }

  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  double throughput() const { return mean(throughput_runs); }
  double acceptance_rate() const {
    return drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
  }
  double tokens_per_pass() const {
    return decode_passes ? static_cast<double>(decode_tokens) / static_cast<double>(decode_passes)
                         : 0.0;
  }
  double prefix_hit_rate() const {
    return prefix_queried ? static_cast<double>(prefix_hit) / static_cast<double>(prefix_queried)
                          : 0.0;
  }

  nlohmann::ordered_json to_json(int num_requests, int concurrency,
                                 const std::string& method) const {
    nlohmann::ordered_json j;
    j["throughput_tok_s"] = throughput();
    j["throughput_tok_s_runs"] = throughput_runs;
    j["requests_per_s"] = mean(requests_per_s_runs);
    j["ttft_ms"] = distribution_json(distribution(ttft_ms));
    j["tpot_ms"] = distribution_json(distribution(tpot_ms));
    j["itl_ms"] = distribution_json(distribution(itl_ms));
    j["e2e_ms"] = distribution_json(distribution(e2e_ms));
    j["errors"] = errors;
    j["num_requests"] = num_requests;
    j["concurrency"] = concurrency;
    j["runs"] = throughput_runs.size();
    j["input_tokens"] = input_tokens;
    j["output_tokens"] = output_tokens;
    j["wall_s"] = wall_s;
    j["kv_blocks_total"] = kv_blocks_total;
    j["kv_blocks_peak"] = kv_blocks_peak;
    j["kv_pool_bytes"] = kv_pool_bytes;
    j["preemptions"] = preemptions;
    j["prefix_cache_hit_rate"] = prefix_hit_rate();
    j["tokens_per_pass"] = tokens_per_pass();
    j["acceptance_rate"] = acceptance_rate();
    j["drafted"] = drafted;
    j["accepted"] = accepted;
    j["spec_methods"] = nlohmann::ordered_json::object();
    if (method != "none") {
      j["spec_methods"][method] = {{"drafted", drafted},
                                   {"accepted", accepted},
                                   {"acceptance_rate", acceptance_rate()},
                                   {"tokens_per_pass", tokens_per_pass()}};
    }
    return j;
  }
};

void dump_run(std::ofstream& out, const RunResult& run, const Dataset& ds, const char* mode) {
  for (size_t i = 0; i < run.records.size(); ++i) {
    const RequestRecord& r = run.records[i];
    nlohmann::ordered_json j;
    j["index"] = ds.requests[i].index;
    j["mode"] = mode;
    j["tokens"] = r.tokens;
    j["text"] = r.text;
    j["finish_reason"] = r.submit_error ? "error" : stop_reason_name(r.reason);
    if (!r.error.empty()) j["error"] = r.error;
    out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  }
}

void print_mode(const char* name, const ModeFigures& f) {
  const Distribution ttft = distribution(f.ttft_ms), tpot = distribution(f.tpot_ms),
                     itl = distribution(f.itl_ms), e2e = distribution(f.e2e_ms);
  fmt::print("{:<5}  {:9.1f} tok/s  {:7.2f} req/s  errors {}\n", name, f.throughput(),
             ModeFigures::mean(f.requests_per_s_runs), f.errors);
  auto row = [](const char* what, const Distribution& d) {
    fmt::print("       {:<5} ms  mean {:9.2f}  p50 {:9.2f}  p90 {:9.2f}  p99 {:9.2f}\n", what,
               d.mean, d.p50, d.p90, d.p99);
  };
  row("TTFT", ttft);
  row("TPOT", tpot);
  row("ITL", itl);
  row("E2E", e2e);
  fmt::print(
      "       KV blocks peak {}/{} ({:.1f} MiB pool), prefix cache hit rate {:.1f}%, "
      "preemptions {}\n",
      f.kv_blocks_peak, f.kv_blocks_total, f.kv_pool_bytes / 1048576.0, 100 * f.prefix_hit_rate(),
      f.preemptions);
  if (f.drafted > 0 || f.accepted > 0) {
    fmt::print("       drafted {}, accepted {} ({:.1f}%), {:.2f} tokens per decode pass\n",
               f.drafted, f.accepted, 100 * f.acceptance_rate(), f.tokens_per_pass());
  }
}

}  // namespace

void add_load_options(CLI::App* cmd, LoadOptions* o) {
  cmd->add_option("--concurrency", o->concurrency,
                  "Load mode: requests in flight at once (default 1 with --num-requests)");
  cmd->add_option("--num-requests", o->num_requests,
                  "Load mode: requests per run (default: concurrency x 4, or the lines of "
                  "--prompts)");
  cmd->add_option("--input-mean", o->input_mean,
                  "Load mode, synthetic requests: mean prompt tokens (default: -p)");
  cmd->add_option("--input-stdev", o->input_stdev, "Load mode: stdev of the prompt tokens")
      ->capture_default_str();
  cmd->add_option("--output-mean", o->output_mean,
                  "Load mode, synthetic requests: mean output tokens (default: -n)");
  cmd->add_option("--output-stdev", o->output_stdev, "Load mode: stdev of the output tokens")
      ->capture_default_str();
  cmd->add_option("--prefix-len", o->prefix_len,
                  "Load mode: synthetic tokens every request starts with (a shared prefix)")
      ->capture_default_str();
  cmd->add_option("--dump-outputs", o->dump_outputs,
                  "Load mode: write each request's output (one JSON line per request and mode)");
  add_engine_options(cmd, &o->engine);
}

bool load_mode_requested(const LoadOptions& o) {
  return o.concurrency != -1 || o.num_requests != -1;
}

void run_load_bench(const LoadOptions& o, const LoadBenchInput& in) {
  check_options(o, in);
  in.sampling.validate();
  std::string spec_description;
  const SpecParams spec = make_spec_params(in.spec, &spec_description);
  const bool with_spec = spec.method != SpecMethod::kNone;
  const int concurrency = o.concurrency != -1 ? o.concurrency : 1;
  int num_requests = o.num_requests;
  if (num_requests == -1 && in.prompts_file.empty()) num_requests = concurrency * 4;

  const std::string path = resolve_model_path(in.model);
  std::unique_ptr<Model> model = load_model_with_progress(path, in.json);
  std::unique_ptr<Model> draft = load_draft_model(in.spec, in.json);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  const ModelConfig& c = model->config();
  const int threads = in.threads > 0 ? in.threads : default_threads();
  ThreadPool pool(threads);
  const int64_t ctx = std::min<int64_t>(in.ctx_size, c.n_ctx_train > 0 ? c.n_ctx_train : 4096);
  const EngineConfig config = make_engine_config(o.engine, in.kv_type, ctx, draft.get(), in.json);
  const Dataset ds = make_dataset(o, in, *tok, c.n_vocab, ctx, &num_requests);

  std::ofstream dump;
  if (!o.dump_outputs.empty()) {
    dump.open(o.dump_outputs);
    if (!dump)
      throw Error(fmt::format("--dump-outputs {}: cannot create the file", o.dump_outputs));
  }

  SpecParams plain;  // SpecMethod::kNone
  warm_up(*model, tok.get(), &pool, config, ds, in.sampling, plain);
  if (with_spec) warm_up(*model, tok.get(), &pool, config, ds, in.sampling, spec);

  const int repeats = with_spec ? std::max(1, in.repeats) : 1;
  ModeFigures plain_figures, spec_figures;
  std::vector<double> pair_speedups;
  for (int r = 0; r < repeats; ++r) {
    const std::string suffix = repeats > 1 ? fmt::format(" run {}/{}", r + 1, repeats) : "";
    const RunResult p = run_once(*model, tok.get(), &pool, config, ds, in.sampling, plain,
                                 concurrency, "plain" + suffix);
    plain_figures.add(p, ds);
    if (r == 0 && dump.is_open()) dump_run(dump, p, ds, "plain");
    if (!with_spec) break;
    const RunResult s = run_once(*model, tok.get(), &pool, config, ds, in.sampling, spec,
                                 concurrency, "spec" + suffix);
    spec_figures.add(s, ds);
    if (r == 0 && dump.is_open()) dump_run(dump, s, ds, "spec");
    const double plain_tps = plain_figures.throughput_runs.back();
    pair_speedups.push_back(plain_tps > 0 ? spec_figures.throughput_runs.back() / plain_tps : 0);
  }
  const double speedup = ModeFigures::mean(pair_speedups);

  nlohmann::ordered_json j;
  j["bench"] = "load";
  j["model"] = path;
  j["cpu"] = cpu_name();
  j["isa"] = isa_name(active_isa());
  j["threads"] = threads;
  j["kv_type"] = in.kv_type;
  j["ctx_size"] = ctx;
  j["dataset"] = ds.description;
  j["engine"] = {{"kv_cache_mib", o.engine.kv_cache_mib},
                 {"block_size", o.engine.block_size},
                 {"prefix_cache", !o.engine.no_prefix_cache},
                 {"max_batch_tokens", o.engine.max_batch_tokens},
                 {"max_seqs", o.engine.max_seqs}};
  j["num_requests"] = num_requests;
  j["concurrency"] = concurrency;
  j["repeats"] = repeats;
  j["speculation"] = spec_description;
  j["mode"] = with_spec ? "spec" : "plain";
  const nlohmann::ordered_json plain_json =
      plain_figures.to_json(num_requests, concurrency, "none");
  const nlohmann::ordered_json spec_json =
      with_spec ? spec_figures.to_json(num_requests, concurrency, in.spec.spec)
                : nlohmann::ordered_json();
  j.update(with_spec ? spec_json : plain_json);
  j["plain"] = plain_json;
  if (with_spec) {
    j["spec"] = spec_json;
    j["speedup"] = speedup;
  }

  if (in.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  fmt::print("model: {}\n", c.summary());
  fmt::print("cpu: {}, kernels: {}, threads: {}, KV cache: {}\n", j["cpu"].get<std::string>(),
             j["isa"].get<std::string>(), threads, in.kv_type);
  if (ds.synthetic) {
    fmt::print(
        "load: {} requests, concurrency {}, synthetic prompts {}±{} tokens, outputs {}±{} "
        "tokens, shared prefix {} (seed {})\n",
        num_requests, concurrency, ds.description["input_mean"].get<double>(), o.input_stdev,
        ds.description["output_mean"].get<double>(), o.output_stdev, o.prefix_len,
        in.sampling.seed);
  } else {
    fmt::print("load: {} requests, concurrency {}, prompts from {} (-n {}), shared prefix {}\n",
               num_requests, concurrency, in.prompts_file, in.n_gen, o.prefix_len);
  }
  fmt::print(
      "engine: KV pool {} MiB, blocks of {}, prefix cache {}, max batch tokens {}, max "
      "seqs {}\n",
      o.engine.kv_cache_mib, o.engine.block_size, o.engine.no_prefix_cache ? "off" : "on",
      o.engine.max_batch_tokens, o.engine.max_seqs);
  print_mode("plain", plain_figures);
  if (with_spec) {
    fmt::print("speculation: {}\n", spec_description);
    print_mode("spec", spec_figures);
    fmt::print("speedup {:.2f}x (spec / plain throughput, mean over {} pair{})\n", speedup, repeats,
               repeats > 1 ? "s" : "");
  }
}

}  // namespace specdec::cli
