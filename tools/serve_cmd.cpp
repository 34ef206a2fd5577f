// specdec serve: the OpenAI-compatible HTTP server (src/server/) over one engine.
//
//   bind the address (fails fast) -> serve /health 503 while the model loads -> engine.start()
//   and publish the model -> on SIGINT / SIGTERM: stop accepting, let in-flight requests finish
//   (--shutdown-timeout), cancel the rest, exit 0. A second signal cancels at once.
//
// Signals are blocked in every thread and taken by one thread with sigtimedwait, so no handler
// code runs in signal context.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "backend/cpu/thread_pool.h"
#include "cli_common.h"
#include "commands.h"
#include "engine_options.h"
#include "server/server.h"
#include "spec_options.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int64_t max_queue = 1024;
  std::string served_model_name;
  std::string chat_template;
  int threads = 0;
  int http_threads = 0;
  int ctx_size = 4096;
  std::string kv_type = "f16";
  std::string device = "cpu";
  int64_t max_body_size = 16 << 20;
  double shutdown_timeout = 5;
  bool verbose = false;
  SpecOptions spec;
  EngineOptions engine;
};

// --chat-template: a file holding a Jinja chat template of a format we render (see
// tokenizer/chat_template.h), or one of those formats by name.
ChatTemplate load_chat_template(const std::string& arg) {
  std::ifstream in(arg, std::ios::binary);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      return ChatTemplate::from_source(ss.str());
    } catch (const Error& e) {
      throw Error(fmt::format("--chat-template {}: {}", arg, e.what()));
    }
  }
  for (ChatTemplateKind kind :
       {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama2, ChatTemplateKind::kLlama3,
        ChatTemplateKind::kGemma, ChatTemplateKind::kPhi3}) {
    if (arg == chat_template_kind_name(kind)) {
      ChatTemplate t;
      t.kind = kind;
      return t;
    }
  }
  throw Error(
      fmt::format("--chat-template {}: no such file, and not one of the built-in formats "
                  "chatml, llama2, llama3, gemma, phi3",
                  arg));
}

// Takes SIGINT / SIGTERM on its own thread: the first starts the server's shutdown (on another
// thread, as it waits for requests), a second cancels everything at once.
class SignalWatcher {
 public:
  explicit SignalWatcher(server::Server& server) : server_(server) {
    thread_ = std::thread([this] { loop(); });
  }
  ~SignalWatcher() {
    stop_ = true;
    thread_.join();
    if (shutdown_.joinable()) shutdown_.join();
  }
  // Shutdown without a signal (an error on the way up).
  void shutdown_now() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutdown_.joinable()) shutdown_ = std::thread([this] { server_.shutdown(); });
  }

 private:
  void loop() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    const timespec tick{0, 100 * 1000 * 1000};
    int received = 0;
    while (!stop_) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig < 0) continue;
      ++received;
      if (received == 1) {
        fmt::print(stderr, "specdec serve: {} received, shutting down\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
        shutdown_now();
      } else {
        fmt::print(stderr, "specdec serve: second signal, cancelling every request\n");
        server_.cancel_all();
      }
    }
  }

  server::Server& server_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::thread shutdown_;
  std::thread thread_;
};

void block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread started after this
  signal(SIGPIPE, SIG_IGN);                   // a client gone mid-write is an error value
}

// Loads the model, publishes it and runs the engine until the server has stopped (`http`, the
// thread running the server, joined: no handler can touch the engine any more).
void serve_model(const ServeOptions& o, const std::string& path,
                 const std::optional<ChatTemplate>& chat_template, const SpecParams& spec,
                 server::Server& server, std::thread& http) {
  const Device device = device_from_option(o.device);
  std::unique_ptr<Model> model = load_model_with_progress(path, /*quiet=*/false, device);
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());
  std::unique_ptr<Model> draft = load_draft_model(o.spec, /*quiet=*/false, device);
  const int64_t ctx = std::min<int64_t>(o.ctx_size, model->config().n_ctx_train);
  ThreadPool pool(compute_threads(o.threads));
  const std::unique_ptr<ReDrafterHead> head = load_drafter_head(o.spec, *model, /*quiet=*/false);
  const std::unique_ptr<MedusaHeads> medusa = load_medusa_heads(o.spec, *model, /*quiet=*/false);
  EngineConfig config = make_engine_config(o.engine, o.kv_type, ctx, *model, draft.get(), false, device);
  config.drafter_head = head.get();
  config.medusa_heads = medusa.get();
  Engine engine(*model, tok.get(), &pool, config);

  server::ModelBackend backend;
  backend.engine = &engine;
  backend.tokenizer = tok.get();
  const std::filesystem::path p(path);
  backend.model_name = o.served_model_name.empty() ? p.stem().string() : o.served_model_name;
  backend.model_aliases = {path, p.filename().string(), p.stem().string()};
  backend.max_context = ctx;
  backend.spec = spec;
  backend.chat_template = chat_template;
  backend.created = static_cast<int64_t>(std::time(nullptr));
  if (!chat_template) {
    try {
      tok->apply_chat_template({{"user", "hi"}}, true);
    } catch (const Error& e) {
      fmt::print(stderr, "warning: chat completions will fail: {} (use --chat-template)\n",
                 e.what());
    }
  }

  engine.start();
  server.set_backend(&backend);
  fmt::print(stderr, "specdec serve: model '{}' ready ({} KV blocks of {} tokens, context {})\n",
             backend.model_name, engine.num_blocks(), engine.block_size(), ctx);
  http.join();  // returns after shutdown(), once every connection's handler is done
  server.set_backend(nullptr);
  engine.stop();
}

void run_serve(ServeOptions o) {
  std::string spec_desc;
  const SpecParams spec = make_spec_params(o.spec, &spec_desc);  // option errors before binding
  std::optional<ChatTemplate> chat_template;
  if (!o.chat_template.empty()) chat_template = load_chat_template(o.chat_template);
  const std::string path = resolve_model_path(o.model);
  if (!o.spec.draft_model.empty()) resolve_model_path(o.spec.draft_model, "--draft-model");
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("SPECDEC_API_KEY")) o.api_key = env;
  }

  block_signals();
  server::ServerConfig c;
  c.host = o.host;
  c.port = o.port;
  c.api_key = o.api_key;
  c.max_queue = o.max_queue;
  c.http_threads = o.http_threads;
  c.max_body_bytes = o.max_body_size;
  c.shutdown_timeout_s = o.shutdown_timeout;
  c.verbose = o.verbose;
  c.spec_method = spec.method;
  c.num_draft = spec.method == SpecMethod::kNone ? 0 : spec.num_draft;
  server::Server server(c);
  const int port = server.bind();
  fmt::print(stderr, "specdec serve: listening on http://{}:{} (speculation: {}{})\n", o.host, port,
             spec_desc, o.api_key.empty() ? "" : ", API key required");
  std::thread http([&server] { server.run(); });
  {
    SignalWatcher signals(server);
    try {
      serve_model(o, path, chat_template, spec, server, http);
    } catch (...) {  // the model failed to load: stop serving, then report
      signals.shutdown_now();
      if (http.joinable()) http.join();
      throw;
    }
  }
  fmt::print(stderr, "specdec serve: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file (default: SmolLM2-135M-Instruct from the setup cache)");
  cmd->add_option("--host", o->host, "Address to listen on (loopback unless told otherwise)")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health (default: "
                  "$SPECDEC_API_KEY, else none)");
  cmd->add_option("--max-queue", o->max_queue,
                  "Generations in flight at most (one per choice); more get 503 + Retry-After")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Model name in the API (default: the model file's name without .gguf)");
  cmd->add_option("--chat-template", o->chat_template,
                  "Chat template: a file with a Jinja template of a known format, or chatml, "
                  "llama2, llama3, gemma, phi3 (default: the model's)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (default, or 0: all cores)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--http-threads", o->http_threads,
                  "HTTP connection threads (default: min(--max-queue, 256) + 8)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "Context per request in tokens (capped at the model's)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--max-body-size", o->max_body_size, "Largest request body in bytes (413 above)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "Seconds in-flight requests may run on after SIGINT / SIGTERM")
      ->check(CLI::Range(0.0, 3600.0))
      ->check(finite_number())
      ->capture_default_str();
  cmd->add_flag("-v,--verbose", o->verbose, "Log every HTTP request on stderr");
  add_kv_type_option(cmd, &o->kv_type);
  add_device_option(cmd, &o->device);
  add_spec_options(cmd, &o->spec);
  add_engine_options(cmd, &o->engine);
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace specdec::cli
