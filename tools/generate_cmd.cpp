// specdec generate: stream a completion (or a chat answer) to stdout, timings to stderr. Runs
// the one request on the engine (paged KV, the same step as a batch of many).
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/thread_pool.h"
#include "cli_common.h"
#include "commands.h"
#include "engine_options.h"
#include "spec_options.h"
#include "model/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string system;
  int n_predict = 128;
  int threads = 0;
  int ctx_size = 4096;
  std::string kv_type = "f16";
  std::string device = "cpu";
  bool chat = false;
  bool ignore_eos = false;
  std::string output_format = "text";
  SamplingParams sampling;
  SpecOptions spec;
  EngineOptions engine;
};

std::vector<int32_t> build_prompt(const Tokenizer& tok, const GenerateOptions& o) {
  if (!o.chat) return tok.encode(o.prompt, /*add_special=*/true, /*parse_special=*/true);
  std::vector<ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  messages.push_back({"user", o.prompt});
  // The template writes BOS itself where the format has one.
  const std::string text = tok.apply_chat_template(messages, /*add_generation_prompt=*/true);
  return tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
}

void run_generate(GenerateOptions& o, bool pool_size_given) {
  const bool json = o.output_format == "json";
  // Option errors first, before the model is loaded.
  o.sampling.validate();
  std::string spec_desc;
  Request request;
  request.spec = make_spec_params(o.spec, &spec_desc);
  const std::string path = resolve_model_path(o.model);
  const auto t_load0 = std::chrono::steady_clock::now();
  const Device device = device_from_option(o.device);
  std::unique_ptr<Model> model = load_model_with_progress(path, /*quiet=*/false, device);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  const double load_s = seconds_since(t_load0);

  const std::vector<int32_t> prompt = build_prompt(*tok, o);
  const int64_t ctx = std::min<int64_t>(o.ctx_size, model->config().n_ctx_train);
  ThreadPool pool(compute_threads(o.threads));
  std::unique_ptr<Model> draft = load_draft_model(o.spec, /*quiet=*/false, device);
  const std::unique_ptr<ReDrafterHead> head = load_drafter_head(o.spec, *model, /*quiet=*/false);
  const std::unique_ptr<MedusaHeads> medusa = load_medusa_heads(o.spec, *model, /*quiet=*/false);
  EngineConfig config = make_engine_config(o.engine, o.kv_type, ctx, *model, draft.get(), false, device);
  config.drafter_head = head.get();
  config.medusa_heads = medusa.get();
  if (!pool_size_given) {  // one request: a pool of exactly its context
    config.kv_blocks = static_cast<int32_t>((ctx + config.block_size - 1) / config.block_size);
  }
  Engine engine(*model, tok.get(), &pool, config);
  if (!json) {
    const EngineStats es = engine.stats();
    fmt::print(stderr, "KV pool: {} blocks of {} tokens ({:.1f} MiB, {}), prefix cache {}\n",
               engine.num_blocks(), engine.block_size(), es.kv_pool_bytes / 1048576.0, o.kv_type,
               config.prefix_cache ? "on" : "off");
  }

  request.prompt = prompt;
  request.sampling = o.sampling;
  request.max_tokens = o.n_predict;
  request.ignore_eos = o.ignore_eos;
  std::string text;
  std::vector<int32_t> out;
  RequestOutput last;
  auto t0 = std::chrono::steady_clock::now();
  double first_token_s = -1;
  request.on_output = [&](const RequestOutput& r) {
    if (first_token_s < 0 && !r.tokens.empty()) first_token_s = seconds_since(t0);
    out.insert(out.end(), r.tokens.begin(), r.tokens.end());
    text += r.text;
    if (!json && !r.text.empty()) {
      std::fwrite(r.text.data(), 1, r.text.size(), stdout);
      std::fflush(stdout);
    }
    if (r.finished) last = r;
    return true;
  };
  if (o.n_predict == 0) {  // nothing to generate: the prompt is only checked
    request.max_tokens = 1;
    request.on_output = nullptr;
  }
  const SubmitResult submitted = engine.submit(std::move(request));
  if (!submitted.ok()) throw Error(submitted.error);
  while (o.n_predict > 0 && engine.has_work()) engine.step();
  const double total_s = seconds_since(t0);
  if (last.reason == StopReason::kError) throw Error(last.error);
  const RequestStats& st = last.stats;
  const double prefill_s = first_token_s < 0 ? total_s : first_token_s;
  const double decode_s = total_s - prefill_s;
  const double prefill_tps = prefill_s > 0 ? st.n_prompt / prefill_s : 0;
  const double decode_tps = decode_s > 0 ? st.n_generated / decode_s : 0;
  const double acceptance = st.n_drafted ? double(st.n_accepted) / st.n_drafted : 0.0;
  const double tokens_per_pass =
      st.n_passes ? double(st.n_accepted + st.n_passes) / st.n_passes : 0.0;
  const std::string finish = o.n_predict == 0 ? "length" : stop_reason_name(last.reason);
  if (json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = out;
    j["text"] = text;
    j["finish_reason"] = finish;
    j["timings"] = {{"load_s", load_s},
                    {"prompt_n", st.n_prompt},
                    {"prefill_s", prefill_s},
                    {"prefill_tok_s", prefill_tps},
                    {"generated_n", st.n_generated},
                    {"decode_s", decode_s},
                    {"decode_tok_s", decode_tps},
                    {"target_passes", st.n_passes}};
    j["spec"] = {{"method", o.spec.spec},
                 {"description", spec_desc},
                 {"target_passes", st.n_passes},
                 {"drafted", st.n_drafted},
                 {"accepted", st.n_accepted},
                 {"acceptance_rate", acceptance},
                 {"tokens_per_pass", tokens_per_pass}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    fmt::print(stderr,
               "\nprompt: {} tokens in {:.3f} s ({:.1f} tok/s) | generated: {} tokens, {} passes "
               "in {:.3f} s ({:.1f} tok/s) | finish: {}\n",
               st.n_prompt, prefill_s, prefill_tps, st.n_generated, st.n_passes, decode_s,
               decode_tps, finish);
    if (o.spec.spec != "none") {
      fmt::print(stderr,
                 "speculation: {} | target passes {} | drafted {} | accepted {} ({:.1f}%) | "
                 "tokens per pass {:.2f}\n",
                 spec_desc, st.n_passes, st.n_drafted, st.n_accepted, 100 * acceptance,
                 tokens_per_pass);
    }
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: SmolLM2-135M-Instruct from the setup cache)");
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Maximum number of tokens to generate")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat template as a user turn");
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_option("--temp", o->sampling.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Top-p (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Min-p (0 = off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sampling.repetition_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", o->sampling.repeat_last_n, "Tokens the penalty looks back over")
      ->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "Random seed (runs replay exactly)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default, or 0: all cores)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context size in tokens (capped at the model's)")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  add_kv_type_option(cmd, &o->kv_type);
  add_device_option(cmd, &o->device);
  cmd->add_option("--output-format", o->output_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  add_spec_options(cmd, &o->spec);
  add_engine_options(cmd, &o->engine);
  cmd->callback([o, cmd] { run_generate(*o, cmd->count("--kv-cache-mib") > 0); });
}

}  // namespace specdec::cli
