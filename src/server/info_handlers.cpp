#include "server/info_handlers.h"

#include <string>

#include <httplib.h>

#include "server/completion_request.h"
#include "server/http_response.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec::server {
namespace {

using nlohmann::json;

json model_object(const ModelBackend& b) {
  return {{"id", b.model_name},
          {"object", "model"},
          {"created", b.created},
          {"owned_by", "specdec"},
          {"max_model_len", b.max_context}};
}

// The backend, or an error response when the model is not loaded yet.
const ModelBackend* loaded(const ServerState& state, httplib::Response& res) {
  const ModelBackend* b = state.backend.load();
  if (b == nullptr) send_error(res, unavailable("the model is loading", "loading"));
  return b;
}

// The body as a JSON object, or an error response.
bool parse_object(const httplib::Request& req, httplib::Response& res, json* out) {
  if (auto e = parse_json_body(req.body, out)) {
    send_error(res, *e);
    return false;
  }
  if (!out->is_object()) {
    send_error(res, invalid_request("the request body must be a JSON object"));
    return false;
  }
  return true;
}

// An optional boolean field; false (and an error response) when it has another type.
bool read_flag(const json& body, const char* name, bool* value, httplib::Response& res) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    send_error(res, invalid_request(std::string("'") + name + "' must be a boolean", name));
    return false;
  }
  *value = it->get<bool>();
  return true;
}

}  // namespace

bool ModelBackend::serves(const std::string& name) const {
  if (name == model_name) return true;
  for (const std::string& alias : model_aliases) {
    if (name == alias) return true;
  }
  return false;
}

void handle_health(const ServerState& state, httplib::Response& res) {
  if (state.backend.load() == nullptr) {
    return send_error(res, unavailable("the model is loading", "loading"));
  }
  if (state.shutting_down.load()) {
    return send_error(res, unavailable("the server is shutting down", "shutting_down"));
  }
  send_json(res, 200, {{"status", "ok"}});
}

void handle_models(const ServerState& state, httplib::Response& res) {
  const ModelBackend* b = loaded(state, res);
  if (b == nullptr) return;
  send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object(*b)})}});
}

void handle_model(const ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const ModelBackend* b = loaded(state, res);
  if (b == nullptr) return;
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
  if (!b->serves(id)) {
    ApiError e;
    e.status = 404;
    e.message = "the model '" + id + "' does not exist";
    e.param = "model";
    e.code = "model_not_found";
    return send_error(res, e);
  }
  send_json(res, 200, model_object(*b));
}

void handle_metrics(ServerState& state, httplib::Response& res) {
  const ModelBackend* b = state.backend.load();
  EngineStats stats;
  if (b != nullptr) stats = b->engine->stats();
  res.status = 200;
  res.set_content(state.metrics.render(stats, state.in_flight.load(), b != nullptr),
                  "text/plain; version=0.0.4; charset=utf-8");
}

void handle_tokenize(const ServerState& state, const httplib::Request& req,
                     httplib::Response& res) {
  const ModelBackend* b = loaded(state, res);
  if (b == nullptr) return;
  json body;
  if (!parse_object(req, res, &body)) return;
  auto content = body.find("content");
  if (content == body.end()) content = body.find("prompt");  // vLLM's name
  if (content == body.end() || !content->is_string()) {
    return send_error(res, invalid_request("'content' must be a string", "content"));
  }
  bool add_special = false, parse_special = true, with_pieces = false;
  if (!read_flag(body, "add_special", &add_special, res) ||
      !read_flag(body, "parse_special", &parse_special, res) ||
      !read_flag(body, "with_pieces", &with_pieces, res)) {
    return;
  }
  const Tokenizer& tok = *b->tokenizer;
  const std::vector<int32_t> ids =
      tok.encode(content->get<std::string>(), add_special, parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string& piece = tok.token_to_piece(id);
    if (is_valid_utf8(piece)) {
      tokens.push_back({{"id", id}, {"piece", piece}});
    } else {  // a part of a character: its bytes, as llama-server gives them
      json bytes = json::array();
      for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
      tokens.push_back({{"id", id}, {"piece", bytes}});
    }
  }
  send_json(res, 200,
            {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", b->max_context}});
}

void handle_detokenize(const ServerState& state, const httplib::Request& req,
                       httplib::Response& res) {
  const ModelBackend* b = loaded(state, res);
  if (b == nullptr) return;
  json body;
  if (!parse_object(req, res, &body)) return;
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) {
    return send_error(res, invalid_request("'tokens' must be an array of token ids", "tokens"));
  }
  std::vector<int32_t> ids;
  const Tokenizer& tok = *b->tokenizer;
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab()) {
      return send_error(res, invalid_request("'tokens' must hold token ids in [0, " +
                                                 std::to_string(tok.n_vocab()) + ")",
                                             "tokens"));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  send_json(res, 200, {{"content", sanitize_utf8(tok.decode(ids))}});
}

}  // namespace specdec::server
