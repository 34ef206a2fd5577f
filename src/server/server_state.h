// What the HTTP handlers share: the server's configuration, the loaded model (set once, when
// loading is done: until then /health says 503), the count of generations in flight (the queue
// limit), the shutdown flags and the metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "specdec/engine.h"
#include "tokenizer/chat_template.h"

namespace specdec {
class Tokenizer;
}

namespace specdec::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0: any free port (printed at start)
  std::string api_key;       // non-empty: every request but /health needs it
  int64_t max_queue = 1024;  // generations in flight at most; more: 503 + Retry-After
  int http_threads = 0;      // 0: min(max_queue, 256) + 8
  int64_t max_body_bytes = 16 << 20;
  double shutdown_timeout_s = 5;  // in-flight requests may finish this long after SIGTERM
  bool verbose = false;           // a line per request on stderr
  SpecMethod spec_method = SpecMethod::kNone;  // for the metrics' rows
  int num_draft = 0;
};

// The loaded model and how requests use it. Immutable once published.
struct ModelBackend {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::string model_name;                  // served name (--served-model-name or the file's stem)
  std::vector<std::string> model_aliases;  // also accepted in "model" (e.g. the -m path)
  int64_t max_context = 0;                 // tokens per request (prompt + completion)
  SpecParams spec;                         // every request's speculation
  std::optional<ChatTemplate> chat_template;  // --chat-template; none: the model's own
  int64_t created = 0;                        // unix time the model was loaded

  bool serves(const std::string& name) const;
};

struct ServerState {
  explicit ServerState(ServerConfig c)
      : config(std::move(c)), metrics(config.spec_method, config.num_draft) {}

  ServerConfig config;
  std::atomic<const ModelBackend*> backend{nullptr};
  std::atomic<int64_t> in_flight{0};       // engine requests submitted and not finished
  std::atomic<bool> shutting_down{false};  // refuse new generations
  std::atomic<bool> cancel_all{false};     // cancel every generation still running
  ServerMetrics metrics;
};

}  // namespace specdec::server
