// specdec bench: prefill and decode speed of one model, with two ratios measured in the same run:
//   bandwidth_utilization = weight bytes streamed per token × decode tok/s / measured read BW
//   flop_utilization      = prefill FLOPs / prefill time / measured FLOP peak
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/roofline.h"
#include "backend/cpu/thread_pool.h"
#include "cli_common.h"
#include "commands.h"
#include "model/gguf.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

struct BenchOptions {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int threads = 0;
  int repetitions = 3;
  std::string output_format = "text";
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// FLOPs of one prefill pass over n tokens from an empty cache: every weight matmul for every
// token, attention (QKᵀ and PV over the causal triangle), and the output matmul for the last row.
double prefill_flops(const ModelConfig& c, int64_t n) {
  const double layer_matmul = 2.0 * c.dim * (c.q_dim() + 2.0 * c.kv_dim()) +
                              2.0 * c.q_dim() * c.dim + 3.0 * 2.0 * c.dim * c.ffn_dim;
  const double attn_pairs = static_cast<double>(n) * (n + 1) / 2.0;  // (query, key) pairs
  const double attn = 4.0 * c.n_heads * c.head_dim * attn_pairs;
  return c.n_layers * (layer_matmul * n + attn) + 2.0 * c.dim * c.n_vocab;
}

std::vector<int32_t> synthetic_tokens(int n, int n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(std::min(3, n_vocab - 1), n_vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(rng);
  return t;
}

void run_bench(const BenchOptions& o) {
  const bool json = o.output_format == "json";
  const std::string path = resolve_model_path(o.model);
  std::unique_ptr<Model> model = load_model_with_progress(path, /*quiet=*/json);
  const ModelConfig& c = model->config();
  const int threads = o.threads > 0 ? o.threads : default_threads();
  ThreadPool pool(threads);
  if (o.n_prompt + o.n_gen + 1 > c.n_ctx_train) {
    throw Error(fmt::format("-p {} plus -n {} exceed the model's context of {} tokens", o.n_prompt,
                            o.n_gen, c.n_ctx_train));
  }
  KvCache kv = model->make_kv_cache(o.n_prompt + o.n_gen + 1);
  auto log = [&](const std::string& s) {
    if (!json) fmt::print(stderr, "{}\n", s);
  };

  // Machine roofline, measured now on the same threads.
  log("measuring memory bandwidth and FLOP peak ...");
  const double bw_gbs = measure_read_bandwidth_gbs(&pool);
  const double peak_gflops = measure_peak_gflops(active_isa(), &pool);

  // Prefill: one pass over n_prompt tokens from an empty cache, best of the repetitions.
  const std::vector<int32_t> prompt = synthetic_tokens(o.n_prompt, c.n_vocab, 1);
  std::vector<int32_t> positions(o.n_prompt);
  for (int i = 0; i < o.n_prompt; ++i) positions[i] = i;
  const int32_t last_row = o.n_prompt - 1;
  double prefill_best = 1e30;
  for (int rep = 0; rep < o.repetitions + 1 && o.n_prompt > 0; ++rep) {
    kv.clear();
    ForwardBatch b;
    b.tokens = prompt;
    b.positions = positions;
    b.output_rows = {&last_row, 1};
    const auto t0 = std::chrono::steady_clock::now();
    model->forward(kv, b, &pool);
    const double s = seconds_since(t0);
    if (rep > 0) prefill_best = std::min(prefill_best, s);  // rep 0 warms up
  }
  const double prefill_tok_s = o.n_prompt > 0 ? o.n_prompt / prefill_best : 0;
  const double prefill_gflops = o.n_prompt > 0 ? prefill_flops(c, o.n_prompt) / prefill_best / 1e9 : 0;

  // Decode at batch 1: n_gen single-token passes after a short context, best of repetitions.
  const std::vector<int32_t> gen_tokens = synthetic_tokens(o.n_gen + 16, c.n_vocab, 2);
  double decode_best = 1e30;
  for (int rep = 0; rep < o.repetitions && o.n_gen > 0; ++rep) {
    kv.clear();
    double total = 0;
    const int32_t zero = 0;
    for (int i = 0; i < o.n_gen + 4; ++i) {
      const int32_t pos = static_cast<int32_t>(kv.size());
      ForwardBatch b;
      b.tokens = {&gen_tokens[i], 1};
      b.positions = {&pos, 1};
      b.output_rows = {&zero, 1};
      const auto t0 = std::chrono::steady_clock::now();
      model->forward(kv, b, &pool);
      if (i >= 4) total += seconds_since(t0);  // the first passes warm caches up
    }
    decode_best = std::min(decode_best, total);
  }
  const double decode_tok_s = o.n_gen > 0 ? o.n_gen / decode_best : 0;
  const double bytes_per_token = static_cast<double>(model->weight_bytes());
  const double achieved_gbs = bytes_per_token * decode_tok_s / 1e9;
  const double bw_util = achieved_gbs / bw_gbs;
  const double flop_util = prefill_gflops / peak_gflops;

  if (json) {
    nlohmann::json j;
    j["model"] = path;
    j["threads"] = threads;
    j["isa"] = isa_name(active_isa());
    j["n_prompt"] = o.n_prompt;
    j["n_gen"] = o.n_gen;
    j["prefill_tok_s"] = prefill_tok_s;
    j["prefill_gflops"] = prefill_gflops;
    j["decode_tok_s"] = decode_tok_s;
    j["weight_bytes_per_token"] = bytes_per_token;
    j["decode_gbs"] = achieved_gbs;
    j["measured_bandwidth_gbs"] = bw_gbs;
    j["measured_peak_gflops"] = peak_gflops;
    j["bandwidth_utilization"] = bw_util;
    j["flop_utilization"] = flop_util;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    fmt::print("model: {}\nthreads: {}, kernels: {}\n", c.summary(), threads, isa_name(active_isa()));
    fmt::print("measured read bandwidth: {:.1f} GB/s, measured fp32 FMA peak: {:.1f} GFLOP/s\n",
               bw_gbs, peak_gflops);
    fmt::print("prefill ({} tokens): {:.1f} tok/s, {:.1f} GFLOP/s = {:.1f}% of peak\n", o.n_prompt,
               prefill_tok_s, prefill_gflops, 100 * flop_util);
    fmt::print("decode (batch 1, {} tokens): {:.1f} tok/s, {:.1f} MB/token, {:.1f} GB/s = {:.1f}% of "
               "measured bandwidth\n",
               o.n_gen, decode_tok_s, bytes_per_token / 1e6, achieved_gbs, 100 * bw_util);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill/decode speed against the machine's roofline");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens for the prefill measurement")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Tokens for the decode measurement")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  cmd->add_option("-r,--repetitions", o->repetitions, "Repetitions (best is reported)")
      ->check(CLI::Range(1, 100))->capture_default_str();
  cmd->add_option("--output-format", o->output_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace specdec::cli
