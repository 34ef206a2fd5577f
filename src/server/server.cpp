#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <sys/socket.h>

#include <fmt/format.h>
#include <httplib.h>

#include "server/client_connection.h"
#include "server/completion_handler.h"
#include "server/http_response.h"
#include "server/info_handlers.h"
#include "util/check.h"

namespace specdec::server {
namespace {

using httplib::Request;
using httplib::Response;

// Same length and bytes, without stopping at the first difference.
bool equal_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

int http_threads(const ServerConfig& c) {
  if (c.http_threads > 0) return c.http_threads;
  return static_cast<int>(std::min<int64_t>(c.max_queue, 256)) + 8;
}

}  // namespace

Server::Server(ServerConfig config)
    : state_(std::move(config)), http_(std::make_unique<httplib::Server>()) {
  const int threads = http_threads(state_.config);
  http_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  http_->set_payload_max_length(static_cast<size_t>(state_.config.max_body_bytes));
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half its connections; only SO_REUSEADDR (restart while old sockets linger).
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  add_routes();
}

Server::~Server() = default;

bool Server::authorized(const Request& req) const {
  const std::string& key = state_.config.api_key;
  if (key.empty()) return true;
  return equal_constant_time(req.get_header_value("Authorization"), "Bearer " + key);
}

void Server::add_routes() {
  httplib::Server& h = *http_;
  ServerState* st = &state_;
  // Every handler but /health checks the key first (after httplib has read the body, so that a
  // refused request leaves its connection usable).
  auto guarded = [this](auto handler) {
    return [this, handler](const Request& req, Response& res) {
      if (!authorized(req)) {
        res.set_header("WWW-Authenticate", "Bearer");
        return send_error(res, error_for_status(401));
      }
      try {
        handler(req, res);
      } catch (const std::exception& e) {
        ApiError err = error_for_status(500);
        err.message = std::string("internal error: ") + e.what();
        send_error(res, err);
      }
    };
  };
  auto completion = [st](ApiKind kind) {
    return
        [st, kind](const Request& req, Response& res) { handle_completion(*st, kind, req, res); };
  };
  auto health = [st](const Request&, Response& res) { handle_health(*st, res); };
  h.Get("/health", health);
  h.Get("/v1/health", health);
  for (const char* prefix : {"/v1", ""}) {
    const std::string p = prefix;
    h.Post(p + "/completions", guarded(completion(ApiKind::kCompletion)));
    h.Post(p + "/chat/completions", guarded(completion(ApiKind::kChat)));
    h.Get(p + "/models", guarded([st](const Request&, Response& res) { handle_models(*st, res); }));
    h.Get(p + "/models/(.+)",
          guarded([st](const Request& req, Response& res) { handle_model(*st, req, res); }));
  }
  h.Get("/metrics", guarded([st](const Request&, Response& res) { handle_metrics(*st, res); }));
  h.Post("/tokenize",
         guarded([st](const Request& req, Response& res) { handle_tokenize(*st, req, res); }));
  h.Post("/detokenize",
         guarded([st](const Request& req, Response& res) { handle_detokenize(*st, req, res); }));
  // A known route asked with the wrong method.
  auto not_allowed = [](const Request&, Response& res) { send_error(res, error_for_status(405)); };
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/completions",
                           "/chat/completions", "/tokenize", "/detokenize"}) {
    h.Get(path, not_allowed);
  }
  for (const char* path : {"/health", "/v1/health", "/v1/models", "/models", "/metrics"}) {
    h.Post(path, not_allowed);
  }

  // Statuses httplib sets itself (404, 413, 400 for a bad request line, ...) get an error
  // object; responses that already have a body keep it.
  using HandlerResponse = httplib::Server::HandlerResponse;
  h.set_error_handler(
      httplib::Server::HandlerWithResponse([](const Request&, Response& res) -> HandlerResponse {
        if (!res.body.empty() || res.content_provider_) return HandlerResponse::Unhandled;
        send_error(res, error_for_status(res.status));
        return HandlerResponse::Handled;
      }));
  h.set_exception_handler([](const Request&, Response& res, std::exception_ptr) {
    send_error(res, error_for_status(500));
  });
  if (state_.config.verbose) {
    h.set_logger([](const Request& req, const Response& res) {
      fmt::print(stderr, "{} {} {} -> {}\n", req.remote_addr, req.method, req.path, res.status);
    });
  }
}

int Server::bind() {
  const ServerConfig& c = state_.config;
  int port = c.port;
  bool ok;
  if (port == 0) {
    port = http_->bind_to_any_port(c.host);
    ok = port > 0;
  } else {
    ok = http_->bind_to_port(c.host, port);
  }
  if (!ok) {
    throw Error(
        fmt::format("cannot listen on {}:{} (address in use or not available)", c.host, c.port));
  }
  port_ = port;
  return port;
}

void Server::run() {
  if (!state_.shutting_down.load()) http_->listen_after_bind();
  run_done_ = true;
}

void Server::set_backend(const ModelBackend* backend) {
  state_.backend.store(backend);
}

void Server::shutdown() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shutdown_started_) return;
    shutdown_started_ = true;
  }
  using Clock = std::chrono::steady_clock;
  state_.shutting_down = true;
  // Stop accepting. httplib's stop() only works once listen has started; run() may be about to.
  const auto give_up = Clock::now() + std::chrono::seconds(2);
  while (!run_done_.load() && Clock::now() < give_up) {
    if (http_->is_running()) {
      http_->stop();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // In-flight generations may finish, for a while.
  const auto grace =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                         std::max(0.0, state_.config.shutdown_timeout_s)));
  // Once run() is done every handler has returned: nothing is left to wait for.
  auto waiting = [this] { return state_.in_flight.load() > 0 && !run_done_.load(); };
  while (waiting() && Clock::now() < grace) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  cancel_all();
  const auto cancelled = Clock::now() + std::chrono::seconds(5);
  while (waiting() && Clock::now() < cancelled) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Connections idling between keep-alive requests would hold run() for httplib's keep-alive
  // timeout (5 s); end them now.
  if (port_ > 0) shutdown_connection_reads(port_);
}

void Server::cancel_all() {
  state_.cancel_all = true;
}

}  // namespace specdec::server
