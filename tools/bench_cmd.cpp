// specdec bench: speed of one model, as ratios measured in the same run.
//   Without --spec: prefill and batch-1 decode against the machine's roofline
//     bandwidth_utilization = weight bytes streamed per token × decode tok/s / measured read BW
//     flop_utilization      = prefill ops / prefill time / measured peak of the arithmetic used
//                             (int8 dot products for quantized weights, fp32 FMA for float ones)
//     flop_utilization_fp32_peak = the same against the fp32 FMA peak (the textbook FLOP peak)
//   With --spec: the same prompts decoded plainly and speculatively (speedup, acceptance, ...).
//   With --concurrency / --num-requests: the engine under load (bench_load.cpp).
//   With --url http://HOST:PORT: the same requests sent to a server over HTTP (bench_url.cpp).
//   Both: verify_cost_ratio = time(pass over 8 new tokens) / time(pass over 1), the median of
//     adjacent pairs; verify_cost_ratio_best = fastest 8-token pass / fastest 1-token pass.
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
#include "bench_load.h"
#include "bench_spec.h"
#include "bench_url.h"
#include "calibration.h"
#include "cli_common.h"
#include "commands.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

struct BenchOptions {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int threads = 0;
  int repetitions = 3;
  int verify_pairs = 40;
  int prompt_repeats = 1;
  bool interleave = false;
  bool calibrate = false;
  std::string output_format = "text";
  SpecOptions spec;
  std::string prompts_file;
  std::string prompt = "Once upon a time";
  bool chat = false;
  SamplingParams sampling;
  int ctx_size = 4096;
  std::string kv_type = "f16";
  std::string device = "cpu";
  LoadOptions load;  // --concurrency / --num-requests: the load mode (bench_load.h)
  UrlOptions url;    // --url: the load mode's requests sent to a server (bench_url.h)
};

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

// True when most weight-matrix bytes are in quantized types (the prefill runs on int8 dots).
bool mostly_quantized(const Model& model) {
  int64_t quant = 0, dense = 0;
  for (const GgufTensor& t : model.file().tensors()) {
    if (t.ne.size() != 2) continue;
    const bool is_float =
        t.type == GgmlType::kF32 || t.type == GgmlType::kF16 || t.type == GgmlType::kBF16;
    (is_float ? dense : quant) += static_cast<int64_t>(t.nbytes);
  }
  return quant > dense;
}

void roofline_bench(const BenchOptions& o, Model& model, ThreadPool& pool, nlohmann::json& j) {
  const bool quiet = o.output_format == "json";
  const ModelConfig& c = model.config();
  if (o.n_prompt + o.n_gen + 8 > c.n_ctx_train) {
    throw Error(fmt::format("-p {} plus -n {} exceed the model's context of {} tokens", o.n_prompt,
                            o.n_gen, c.n_ctx_train));
  }
  KvCache kv = model.make_kv_cache(o.n_prompt + o.n_gen + 8, kv_type_from_option(o.kv_type));
  // On the GPU: its measured device-memory bandwidth is the roofline (no FLOP peak measured).
  const bool gpu = device_from_option(o.device) == Device::kCuda;
  if (!quiet) {
    fmt::print(stderr, "{}\n", gpu ? "measuring GPU memory bandwidth ..."
                                    : "measuring memory bandwidth and FLOP peak ...");
  }
  auto measure_bandwidth = [&] {
    return gpu ? gpu_bandwidth_gbs() : measure_read_bandwidth_gbs(&pool);
  };
  double bw_gbs = measure_bandwidth();
  // The peak of the arithmetic the prefill matmuls run on: quantized weights multiply 8-bit
  // activations with integer dot products (VNNI / maddubs), float weights use fp32 FMA.
  const bool quantized = mostly_quantized(model);
  auto measure_peak = [&] {
    if (gpu) return 0.0;
    return quantized ? measure_peak_int8_gops(active_isa(), &pool)
                     : measure_peak_gflops(active_isa(), &pool);
  };
  double peak_gflops = measure_peak();
  // The fp32 FMA peak too: the textbook FLOP peak, four times below the int8 one with VNNI.
  auto measure_fp32_peak = [&] { return gpu ? 0.0 : measure_peak_gflops(active_isa(), &pool); };
  double fp32_peak_gflops = measure_fp32_peak();

  // Prefill: one pass over n_prompt tokens from an empty cache, best of the repetitions.
  const std::vector<int32_t> prompt = synthetic_tokens(o.n_prompt, c.n_vocab, 1);
  std::vector<int32_t> positions(o.n_prompt);
  for (int i = 0; i < o.n_prompt; ++i) positions[i] = i;
  const int32_t last_row = o.n_prompt - 1;
  double prefill_best = 1e30;
  if (!quiet) fmt::print(stderr, "prefill: {} tokens x {} ...\n", o.n_prompt, o.repetitions);
  for (int rep = 0; rep < o.repetitions + 1 && o.n_prompt > 0; ++rep) {
    kv.clear();
    ForwardBatch b;
    b.tokens = prompt;
    b.positions = positions;
    b.output_rows = {&last_row, 1};
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(kv, b, &pool);
    if (rep > 0) prefill_best = std::min(prefill_best, seconds_since(t0));  // rep 0 warms up
  }
  // As for the bandwidth below: measured again after the work, the larger figure kept.
  peak_gflops = std::max(peak_gflops, measure_peak());
  fp32_peak_gflops = std::max(fp32_peak_gflops, measure_fp32_peak());
  const double prefill_tok_s = o.n_prompt > 0 ? o.n_prompt / prefill_best : 0;
  const double prefill_gflops =
      o.n_prompt > 0 ? prefill_flops(c, o.n_prompt) / prefill_best / 1e9 : 0;

  // Decode at batch 1: n_gen single-token passes after a short context, best of repetitions.
  if (!quiet) fmt::print(stderr, "decode: {} tokens x {} ...\n", o.n_gen, o.repetitions);
  const std::vector<int32_t> gen_tokens = synthetic_tokens(o.n_gen + 8, c.n_vocab, 2);
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
      model.forward(kv, b, &pool);
      if (i >= 4) total += seconds_since(t0);  // the first passes warm caches up
    }
    decode_best = std::min(decode_best, total);
  }
  const double decode_tok_s = o.n_gen > 0 ? o.n_gen / decode_best : 0;
  // The machine's bandwidth drifts (shared host): measure it again right after decoding and keep
  // the larger figure, so the utilization is never flattered by a slow first measurement.
  bw_gbs = std::max(bw_gbs, measure_bandwidth());
  const double bytes_per_token = static_cast<double>(model.weight_bytes());
  const double achieved_gbs = bytes_per_token * decode_tok_s / 1e9;

  j["n_prompt"] = o.n_prompt;
  j["n_gen"] = o.n_gen;
  j["prefill_tok_s"] = prefill_tok_s;
  j["prefill_gflops"] = prefill_gflops;
  j["decode_tok_s"] = decode_tok_s;
  j["weight_bytes_per_token"] = bytes_per_token;
  j["decode_gbs"] = achieved_gbs;
  j["measured_bandwidth_gbs"] = bw_gbs;
  j["bandwidth_utilization"] = achieved_gbs / bw_gbs;
  if (gpu) {
    j["gpu_bandwidth_gbs"] = bw_gbs;
    return;  // no FLOP peak of the GPU measured
  }
  j["measured_peak_gflops"] = peak_gflops;
  j["peak_kind"] = quantized ? "int8 dot product (VNNI/maddubs), 2 ops per multiply-add"
                             : "fp32 FMA, 2 FLOPs per lane";
  j["flop_utilization"] = prefill_gflops / peak_gflops;
  j["measured_fp32_peak_gflops"] = fp32_peak_gflops;
  j["flop_utilization_fp32_peak"] = prefill_gflops / fp32_peak_gflops;
}

LoadBenchInput load_bench_input(const BenchOptions& o) {
  LoadBenchInput in;
  in.model = o.model;
  in.threads = o.threads;
  in.prompts_file = o.prompts_file;
  in.chat = o.chat;
  in.sampling = o.sampling;
  in.n_prompt = o.n_prompt;
  in.n_gen = o.n_gen;
  in.ctx_size = o.ctx_size;
  in.kv_type = o.kv_type;
  in.device = o.device;
  in.spec = o.spec;
  in.repeats = o.prompt_repeats;
  in.interleave = o.interleave;
  in.json = o.output_format == "json";
  return in;
}

void run_bench(BenchOptions& o) {
  if (url_mode_requested(o.url)) {
    run_url_bench(o.url, o.load, load_bench_input(o));
    return;
  }
  if (load_mode_requested(o.load)) {
    run_load_bench(o.load, load_bench_input(o));
    return;
  }
  const bool quiet = o.output_format == "json";
  const std::string path = resolve_model_path(o.model);
  const Device device = device_from_option(o.device);
  std::unique_ptr<Model> model = load_model_with_progress(path, quiet, device);
  const ModelConfig& c = model->config();
  const int threads = compute_threads(o.threads);
  ThreadPool pool(threads);
  o.sampling.validate();
  const int64_t ctx = std::min<int64_t>(o.ctx_size, c.n_ctx_train);
  SpecSetup spec = make_spec(o.spec, *model, &pool, ctx, o.sampling, quiet, device);

  nlohmann::json j;
  j["model"] = path;
  j["threads"] = threads;
  j["isa"] = isa_name(active_isa());
  j["kv_type"] = o.kv_type;
  j["device"] = device_name(device);
  if (device == Device::kCuda) j["gpu"] = gpu_name();  // gpu_bandwidth_gbs: roofline_bench
  if (!spec.proposer && !o.calibrate) roofline_bench(o, *model, pool, j);
  const int verify_context = std::clamp(o.n_prompt, 1, c.n_ctx_train - 16);
  if (o.calibrate) {  // only the cost model's constants, written for the engine commands
    if (!quiet) fmt::print(stderr, "calibrating: passes of 1-32 tokens against 1 at context {} ...\n",
                           verify_context);
    const VerifyCost verify = measure_verify_cost(*model, &pool, verify_context,
                                                  o.verify_pairs, kv_type_from_option(o.kv_type));
    Calibration cal;
    cal.verify_cost_ratio = verify.ratio;
    cal.verify_token_cost = std::max(0.0, (verify.ratio - 1.0) / 7.0);
    cal.pass_cost = measure_pass_cost(*model, &pool, verify_context, o.verify_pairs,
                                      kv_type_from_option(o.kv_type));
    cal.isa = calibration_kernels(device);
    cal.threads = threads;
    cal.context = verify_context;
    cal.model = path;
    cal.cpu = cpu_model_name();
    const std::string file =
        o.load.engine.calibration.empty() ? default_calibration_path() : o.load.engine.calibration;
    write_calibration(file, cal);
    j["calibration_file"] = file;
    j["verify_cost_ratio"] = cal.verify_cost_ratio;
    j["verify_token_cost"] = cal.verify_token_cost;
    j["pass_cost"] = cal.pass_cost;
    j["cpu"] = cal.cpu;
    if (quiet) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      fmt::print("calibration ({}, {} kernels, {} threads, context {}): verify_cost_ratio {:.3f}, "
                 "verify_token_cost {:.4f} -> {}\n",
                 cal.cpu, cal.isa, threads, verify_context, cal.verify_cost_ratio,
                 cal.verify_token_cost, file);
      std::string curve;
      for (const auto& [n, r] : cal.pass_cost) curve += fmt::format(" {}:{:.2f}", n, r);
      fmt::print("pass cost by new tokens (one-token passes):{}\n", curve);
    }
    return;
  }
  if (!quiet) fmt::print(stderr, "verify cost: 8-token vs 1-token pass at context {} ...\n", verify_context);
  const VerifyCost verify = measure_verify_cost(*model, &pool, verify_context, o.verify_pairs,
                                                kv_type_from_option(o.kv_type));
  j["verify_cost_ratio"] = verify.ratio;
  j["verify_cost_ratio_best"] = verify.best_ratio;
  j["verify_pass_1_ms"] = verify.ms_1;
  j["verify_pass_8_ms"] = verify.ms_8;
  j["verify_context"] = verify_context;
  j["verify_pairs"] = o.verify_pairs;

  if (spec.proposer) {
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
    SpecBenchInput in;
    in.texts = o.prompts_file.empty() ? std::vector<BenchPrompt>{{0, "", {o.prompt}}}
                                      : read_bench_prompts(o.prompts_file);
    for (const BenchPrompt& p : in.texts) {
      const std::string& t = p.turns[0];
      if (p.turns.size() > 1 && !o.chat) {
        throw Error(fmt::format("{}:{}: a conversation of {} turns needs --chat", o.prompts_file,
                                p.line, p.turns.size()));
      }
      if (o.chat) {
        in.prompts.push_back(tok->encode(tok->apply_chat_template({{"user", t}}, true), false, true));
      } else {
        in.prompts.push_back(tok->encode(t, true, true));
      }
      if (static_cast<int64_t>(in.prompts.back().size()) + o.n_gen + 1 > ctx) {
        throw Error(fmt::format("a prompt of {} tokens plus -n {} does not fit the context of {}",
                                in.prompts.back().size(), o.n_gen, ctx));
      }
    }
    in.tokenizer = tok.get();
    in.chat = o.chat;
    in.n_gen = o.n_gen;
    in.sampling = o.sampling;
    in.verify_token_cost =
        calibrated_verify_token_cost(o.load.engine.calibration, in.verify_token_cost, quiet,
                                     calibration_kernels(device), path);
    in.stop_tokens = tok->eog_ids();
    in.ctx_size = ctx;
    in.kv_type = kv_type_from_option(o.kv_type);
    in.quiet = quiet;
    in.repeats = o.prompt_repeats;
    in.interleave = o.interleave;
    j.update(run_spec_bench(*model, &pool, spec, in));
  }

  if (quiet) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  fmt::print("model: {}\nthreads: {}, kernels: {}, KV cache: {}\n", c.summary(), threads,
             j["isa"].get<std::string>(), o.kv_type);
  if (j.contains("gpu")) fmt::print("device: cuda, gpu: {}\n", j["gpu"].get<std::string>());
  if (j.contains("prefill_tok_s") && !j.contains("measured_peak_gflops")) {  // on the GPU
    fmt::print("measured GPU memory bandwidth: {:.1f} GB/s\n",
               j["measured_bandwidth_gbs"].get<double>());
    fmt::print("prefill ({} tokens): {:.1f} tok/s\n", o.n_prompt, j["prefill_tok_s"].get<double>());
    fmt::print("decode (batch 1, {} tokens): {:.1f} tok/s, {:.1f} MB/token, {:.1f} GB/s = {:.1f}% "
               "of measured bandwidth\n",
               o.n_gen, j["decode_tok_s"].get<double>(), j["weight_bytes_per_token"].get<double>() / 1e6,
               j["decode_gbs"].get<double>(), 100 * j["bandwidth_utilization"].get<double>());
  } else if (j.contains("prefill_tok_s")) {
    fmt::print("measured read bandwidth: {:.1f} GB/s, measured peak: {:.1f} G op/s ({})\n",
               j["measured_bandwidth_gbs"].get<double>(), j["measured_peak_gflops"].get<double>(),
               j["peak_kind"].get<std::string>());
    fmt::print("prefill ({} tokens): {:.1f} tok/s, {:.1f} G op/s = {:.1f}% of that peak "
               "({:.1f}% of the fp32 FMA peak, {:.1f} GFLOP/s)\n",
               o.n_prompt, j["prefill_tok_s"].get<double>(), j["prefill_gflops"].get<double>(),
               100 * j["flop_utilization"].get<double>(),
               100 * j["flop_utilization_fp32_peak"].get<double>(),
               j["measured_fp32_peak_gflops"].get<double>());
    fmt::print("decode (batch 1, {} tokens): {:.1f} tok/s, {:.1f} MB/token, {:.1f} GB/s = {:.1f}% "
               "of measured bandwidth\n",
               o.n_gen, j["decode_tok_s"].get<double>(), j["weight_bytes_per_token"].get<double>() / 1e6,
               j["decode_gbs"].get<double>(), 100 * j["bandwidth_utilization"].get<double>());
  }
  fmt::print("verify cost ratio (8 tokens vs 1, context {}): {:.2f} (median of pairs; fastest "
             "passes: {:.2f})\n",
             verify_context, j["verify_cost_ratio"].get<double>(),
             j["verify_cost_ratio_best"].get<double>());
  if (spec.proposer) {
    fmt::print("speculation: {}\n", spec.description);
    fmt::print("plain {:.1f} tok/s, speculative {:.1f} tok/s: speedup {:.2f}x\n",
               j["plain_tok_s"].get<double>(), j["spec_tok_s"].get<double>(), j["speedup"].get<double>());
    fmt::print("with the prompts' processing: end to end {:.2f}x, prefill time {:.2f}x plain's\n",
               j["end_to_end_speedup"].get<double>(), j["prefill_time_ratio"].get<double>());
    fmt::print("acceptance rate {:.1f}%, mean accepted length {:.2f}, tokens per target pass {:.2f}, "
               "target passes {} (plain {}), identical outputs {}/{}\n",
               100 * j["acceptance_rate"].get<double>(), j["mean_accepted_length"].get<double>(),
               j["tokens_per_pass"].get<double>(), j["spec_target_passes"].get<int64_t>(),
               j["plain_target_passes"].get<int64_t>(), j["identical_outputs"].get<int>(),
               j["turns"].get<int>());
    if (j.contains("categories")) {
      for (const auto& [name, c] : j["categories"].items()) {
        fmt::print("  {:<16s} {:3d} turns: speedup {:.2f}x (slowest {:.2f}x), {:.2f} tokens per "
                   "pass, identical {}/{}\n",
                   name, c["turns"].get<int>(), c["speedup"].get<double>(),
                   c["min_prompt_speedup"].get<double>(), c["tokens_per_pass"].get<double>(),
                   c["identical_outputs"].get<int>(), c["turns"].get<int>());
      }
    }
    if (j.contains("acceptance_at_position")) {
      std::string at;
      for (const auto& v : j["acceptance_at_position"]) at += fmt::format(" {:.2f}", v.get<double>());
      fmt::print("acceptance by draft position:{}; drafting {:.1f}% of the speculative time\n", at,
                 100 * j["draft_time_fraction"].get<double>());
    }
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure speed: prefill/decode against the roofline, or --spec against plain decoding");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("-p,--n-prompt", o->n_prompt,
                  "Prompt tokens for the prefill measurement (and the context of the verify cost)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Tokens to decode (per prompt with --spec)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default, or 0: all cores)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("-r,--repetitions", o->repetitions, "Repetitions (best is reported)")
      ->check(CLI::Range(1, 100))->capture_default_str();
  cmd->add_option("--verify-pairs", o->verify_pairs,
                  "Pairs of passes (1 token, then 8) behind the verify cost ratio; more pairs make "
                  "the ratio of the fastest passes a better estimate of a quiet machine")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--prompts", o->prompts_file, "With --spec: file of prompts, a line each: a JSON string, an array of strings (the "
                  "turns of a conversation, with --chat), or {\"category\": ..., \"turns\": [...]}");
  cmd->add_option("--repeats", o->prompt_repeats,
                  "With --spec: runs of each prompt per mode, alternating; per-prompt times are "
                  "medians")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_flag("--calibrate", o->calibrate,
                "Measure the engine cost model's constants (8-token vs 1-token pass at context "
                "-p) and write them to --calibration FILE (default $SPECDEC_CACHE/calibration.json)");
  cmd->add_flag("--interleave", o->interleave,
                "With --spec: run each plain/speculative pair step by step in turn (each mode "
                "holds the machine from one emitted token to the next) instead of one after "
                "the other");
  cmd->add_option("--prompt", o->prompt, "With --spec and no --prompts: the one prompt")->capture_default_str();
  cmd->add_flag("--chat", o->chat, "Apply the model's chat template to each prompt");
  cmd->add_option("--temp", o->sampling.temperature, "Temperature for --spec runs; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Top-p (1 = off)")->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "Random seed")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context size for --spec runs")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  add_kv_type_option(cmd, &o->kv_type);
  add_device_option(cmd, &o->device);
  cmd->add_option("--output-format", o->output_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  add_spec_options(cmd, &o->spec);
  add_load_options(cmd, &o->load);
  add_url_options(cmd, &o->url);
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace specdec::cli
