// specdec bench --concurrency N / --num-requests N: the engine under load.
//
// The requests: synthetic (trtllm-bench's token-norm-dist: prompt and output lengths drawn from
// normal distributions, --input-mean/--input-stdev/--output-mean/--output-stdev, clamped to
// >= 1 and to the context; prompts are random token ids from --seed; ignore_eos, so a request
// generates exactly its output length), or a JSONL file (--prompts: one request a line, a JSON
// string or an object with a "prompt" or "text" field; up to -n tokens, stopping at the model's
// end-of-generation tokens). --prefix-len N puts the same N synthetic tokens before every prompt.
// (The requests and the latency figures are load_figures.h's, shared with the URL mode.)
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
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/thread_pool.h"
#include "cli_common.h"
#include "load_figures.h"
#include "model/model.h"
#include "specdec/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

using Clock = std::chrono::steady_clock;

// What one request of one run went through (times in seconds since the run started).
struct RequestRecord {
  RequestTiming timing;  // output_tokens and error are set when the figures are made
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
  check_dataset_options(o, in);
  if (in.interleave) throw Error("--interleave does not apply to the load mode (--concurrency)");
}

Request make_request(const LoadRequest& lr, const LoadDataset& ds, const SamplingParams& sampling,
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
             const LoadDataset& ds, const SamplingParams& sampling, const SpecParams& spec) {
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
                   const LoadDataset& ds, const SamplingParams& sampling, const SpecParams& spec,
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
        rec.timing.chunk_s.push_back(t);
        if (rec.timing.first_s < 0) rec.timing.first_s = t;
        rec.tokens.insert(rec.tokens.end(), out.tokens.begin(), out.tokens.end());
      }
      rec.text += out.text;
      if (out.finished) {
        rec.timing.end_s = t;
        rec.reason = out.reason;
        rec.error = out.error;
        rec.stats = out.stats;
        --in_flight;
        ++done;
      }
      return true;
    };
    ++next;
    rec.timing.submit_s = seconds_since(t0);
    const SubmitResult s = engine.submit(std::move(r));
    if (s.ok()) {
      ++in_flight;
    } else {
      rec.submit_error = true;
      rec.error = s.error;
      rec.timing.end_s = rec.timing.submit_s;
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

// The figures of one mode over its runs.
struct ModeFigures {
  LatencyFigures latency;
  int64_t input_tokens = 0;
  int64_t kv_blocks_total = 0, kv_blocks_peak = 0, kv_pool_bytes = 0, preemptions = 0;
  int64_t prefix_queried = 0, prefix_hit = 0;
  int64_t drafted = 0, accepted = 0, decode_passes = 0, decode_tokens = 0;

  void add(const RunResult& run, const LoadDataset& ds) {
    for (size_t i = 0; i < run.records.size(); ++i) {
      const RequestRecord& r = run.records[i];
      input_tokens += static_cast<int64_t>(ds.requests[i].prompt.size());
      RequestTiming t = r.timing;
      t.output_tokens = static_cast<int64_t>(r.tokens.size());
      t.error = r.submit_error || r.reason == StopReason::kError;
      t.counted = !r.submit_error;
      latency.add_request(t);
      if (r.submit_error) continue;
      drafted += r.stats.n_drafted;
      accepted += r.stats.n_accepted;
      decode_passes += r.stats.n_passes;
      decode_tokens += std::max<int64_t>(0, r.stats.n_generated - 1);
    }
    latency.end_run(run.wall_s);
    kv_blocks_total = run.engine.kv_blocks_total;
    kv_blocks_peak = std::max(kv_blocks_peak, run.engine.kv_blocks_peak);
    kv_pool_bytes = run.engine.kv_pool_bytes;
    preemptions += run.engine.preemptions;
    prefix_queried += run.engine.prefix_blocks_queried;
    prefix_hit += run.engine.prefix_blocks_hit;
  }

  double throughput() const { return latency.throughput(); }
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
    latency.to_json(&j);
    j["num_requests"] = num_requests;
    j["concurrency"] = concurrency;
    j["runs"] = latency.throughput_runs.size();
    j["input_tokens"] = input_tokens;
    j["output_tokens"] = latency.output_tokens;
    j["wall_s"] = latency.wall_s;
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

void dump_run(std::ofstream& out, const RunResult& run, const LoadDataset& ds, const char* mode) {
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
  f.latency.print(name);
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
  const Device device = device_from_option(in.device);
  std::unique_ptr<Model> model = load_model_with_progress(path, in.json, device);
  std::unique_ptr<Model> draft = load_draft_model(in.spec, in.json, device);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  const ModelConfig& c = model->config();
  const int threads = compute_threads(in.threads);
  ThreadPool pool(threads);
  const int64_t ctx = std::min<int64_t>(in.ctx_size, c.n_ctx_train > 0 ? c.n_ctx_train : 4096);
  const std::unique_ptr<ReDrafterHead> head = load_drafter_head(in.spec, *model, in.json);
  const std::unique_ptr<MedusaHeads> medusa = load_medusa_heads(in.spec, *model, in.json);
  EngineConfig config = make_engine_config(o.engine, in.kv_type, ctx, *model, draft.get(), in.json, device);
  config.drafter_head = head.get();
  config.medusa_heads = medusa.get();
  TokenSpace space;
  space.n_vocab = c.n_vocab;
  const LoadDataset ds = make_load_dataset(o, in, space, ctx, tok.get(), &num_requests);

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
    const double plain_tps = plain_figures.latency.throughput_runs.back();
    const double spec_tps = spec_figures.latency.throughput_runs.back();
    pair_speedups.push_back(plain_tps > 0 ? spec_tps / plain_tps : 0);
  }
  const double speedup = LatencyFigures::mean(pair_speedups);

  nlohmann::ordered_json j;
  j["bench"] = "load";
  j["model"] = path;
  j["cpu"] = cpu_name();
  j["isa"] = isa_name(active_isa());
  j["threads"] = threads;
  j["kv_type"] = in.kv_type;
  j["device"] = device_name(device);
  if (device == Device::kCuda) {
    j["gpu"] = gpu_name();
    j["gpu_bandwidth_gbs"] = gpu_bandwidth_gbs();
  }
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
  if (device == Device::kCuda) {
    fmt::print("gpu: {}, measured bandwidth {:.0f} GB/s\n", j["gpu"].get<std::string>(),
               j["gpu_bandwidth_gbs"].get<double>());
  }
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
