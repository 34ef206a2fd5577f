// The small routes:
//   GET  /health       200 {"status": "ok"} once the model is loaded; 503 before and while
//                      shutting down
//   GET  /v1/models    the served model (OpenAI's list object); /v1/models/{id} one of them
//   GET  /metrics      Prometheus text (metrics.h)
//   POST /tokenize     llama-server's: {"content": str, "add_special": false,
//                      "with_pieces": false} -> {"tokens": [ids | {"id", "piece"}]}
//   POST /detokenize   {"tokens": [ids]} -> {"content": str} (invalid UTF-8 -> U+FFFD)
#pragma once

#include "server/server_state.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace specdec::server {

void handle_health(const ServerState& state, httplib::Response& res);
void handle_models(const ServerState& state, httplib::Response& res);
void handle_model(const ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_metrics(ServerState& state, httplib::Response& res);
void handle_tokenize(const ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(const ServerState& state, const httplib::Request& req,
                       httplib::Response& res);

}  // namespace specdec::server
