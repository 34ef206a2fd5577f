// The OpenAI-compatible HTTP server (cpp-httplib): routes, API key, errors, lifecycle.
//
//   POST /v1/completions, /v1/chat/completions   completion_handler.h (also without /v1)
//   POST /tokenize, /detokenize                  info_handlers.h
//   GET  /v1/models, /v1/models/{id}, /health, /metrics
//   anything else                                404; a known route with another method: 405
//
// Every error is OpenAI's error object. With an API key, every route but /health needs
// `Authorization: Bearer KEY` (401 otherwise). HTTP threads only parse, submit, stream and
// cancel; the engine's own loop thread (Engine::start) does all the model work.
//
// Lifecycle: bind() (fails fast when the port is taken) -> run() on a thread, serving /health
// 503 until set_backend() publishes the loaded model -> shutdown() (SIGINT / SIGTERM): stop
// accepting, let in-flight generations finish for shutdown_timeout_s, cancel the rest; run()
// then returns once every connection's handler is done.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "server/server_state.h"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib

namespace specdec::server {

class Server {
 public:
  explicit Server(ServerConfig config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the configured address; returns the port (the chosen one for port 0). Throws
  // specdec::Error when the address cannot be bound.
  int bind();
  // Serves connections until shutdown(); blocks.
  void run();
  // The model is loaded: completions are served and /health says 200. `backend` must outlive
  // the server.
  void set_backend(const ModelBackend* backend);
  // Stops accepting, waits for in-flight generations (config.shutdown_timeout_s at most), then
  // cancels what is left and waits for the cancellations. Thread-safe; later calls return at once.
  void shutdown();
  // Cancels every running generation now (their clients get finish_reason "abort").
  void cancel_all();

  ServerState& state() { return state_; }

 private:
  void add_routes();
  bool authorized(const httplib::Request& req) const;

  ServerState state_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = -1;  // bound
  std::atomic<bool> run_done_{false};
  std::mutex shutdown_mu_;
  bool shutdown_started_ = false;
};

}  // namespace specdec::server
