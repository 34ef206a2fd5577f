// specdec generate: stream a completion (or a chat answer) to stdout, timings to stderr.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/thread_pool.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/generator.h"
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
  bool chat = false;
  bool ignore_eos = false;
  std::string output_format = "text";
  SamplingParams sampling;
  SpecOptions spec;
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

void run_generate(GenerateOptions& o) {
  const bool json = o.output_format == "json";
  const std::string path = resolve_model_path(o.model);
  const auto t_load0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = load_model_with_progress(path, /*quiet=*/false);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load0).count();

  const std::vector<int32_t> prompt = build_prompt(*tok, o);
  const int64_t ctx = std::min<int64_t>(o.ctx_size, model->config().n_ctx_train);
  ThreadPool pool(o.threads > 0 ? o.threads : default_threads());
  Generator gen(*model, &pool, ctx, kv_type_from_option(o.kv_type));
  o.sampling.validate();
  SpecSetup spec = make_spec(o.spec, *model, &pool, ctx, o.sampling, /*quiet=*/false);

  GenerationConfig config;
  config.max_new_tokens = o.n_predict;
  config.sampling = o.sampling;
  if (!o.ignore_eos) config.stop_tokens = tok->eog_ids();
  config.proposer = spec.proposer.get();
  config.draft = spec.draft_length;

  IncrementalDetokenizer detok(*tok, DecodeOptions{.text_start = false});
  std::string text;
  auto on_token = [&](int32_t t) {
    if (!o.ignore_eos && tok->is_eog(t)) return true;  // not shown
    const std::string piece = detok.push(t);
    text += piece;
    if (!json && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  GenerationStats st;
  const std::vector<int32_t> out = gen.generate(prompt, config, on_token, &st);
  const std::string tail = detok.flush();
  text += tail;

  const double prefill_tps = st.prefill_seconds > 0 ? st.n_prompt / st.prefill_seconds : 0;
  const double decode_tps = st.decode_seconds > 0 ? st.n_generated / st.decode_seconds : 0;
  if (json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = out;
    j["text"] = text;
    j["finish_reason"] = finish_reason_name(st.finish);
    j["timings"] = {{"load_s", load_s},
                    {"prompt_n", st.n_prompt},
                    {"prefill_s", st.prefill_seconds},
                    {"prefill_tok_s", prefill_tps},
                    {"generated_n", st.n_generated},
                    {"decode_s", st.decode_seconds},
                    {"decode_tok_s", decode_tps},
                    {"target_passes", st.n_forward_passes}};
    j["spec"] = {{"method", o.spec.spec},
                 {"description", spec.description},
                 {"target_passes", st.n_forward_passes},
                 {"drafted", st.n_drafted},
                 {"accepted", st.n_accepted},
                 {"acceptance_rate", st.acceptance_rate()},
                 {"mean_accepted_length", st.mean_accepted_length()},
                 {"tokens_per_pass", st.tokens_per_pass()},
                 {"draft_s", st.draft_seconds}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
    fmt::print(stderr,
               "\nprompt: {} tokens in {:.3f} s ({:.1f} tok/s) | generated: {} tokens, {} passes "
               "in {:.3f} s ({:.1f} tok/s) | finish: {}\n",
               st.n_prompt, st.prefill_seconds, prefill_tps, st.n_generated, st.n_forward_passes,
               st.decode_seconds, decode_tps, finish_reason_name(st.finish));
    if (spec.proposer) {
      fmt::print(stderr,
                 "speculation: {} | target passes {} | drafted {} | accepted {} ({:.1f}%) | mean "
                 "accepted per verifying pass {:.2f} | tokens per pass {:.2f} | drafting {:.3f} s\n",
                 spec.description, st.n_forward_passes, st.n_drafted, st.n_accepted,
                 100 * st.acceptance_rate(), st.mean_accepted_length(), st.tokens_per_pass(),
                 st.draft_seconds);
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
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context size in tokens (capped at the model's)")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  add_kv_type_option(cmd, &o->kv_type);
  cmd->add_option("--output-format", o->output_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  add_spec_options(cmd, &o->spec);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace specdec::cli
