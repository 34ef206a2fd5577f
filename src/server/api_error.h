// Errors of the HTTP API, as values: an HTTP status plus OpenAI's error object
//
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
//              "code": null}}
//
// Handlers return an ApiError instead of throwing; the server writes it as the response body.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace specdec::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field ("" -> null)
  std::string code;   // a machine-readable code ("" -> null)
};

// 400: a malformed or out-of-range request; `param` names the field.
ApiError invalid_request(std::string message, std::string param = {}, std::string code = {});
// 400 for a feature of the API that this server does not implement (yet).
ApiError not_supported(std::string message, std::string param);
// 503: the server cannot take the request now (queue full, loading, shutting down).
ApiError unavailable(std::string message, std::string code);

// The JSON body {"error": {...}}.
nlohmann::json error_json(const ApiError& e);
// The default error object for an HTTP status with no body of its own (404, 413, ...).
ApiError error_for_status(int status);

// JSON text that never throws: invalid UTF-8 (from a token cut in the middle of a character, or
// a client's input) becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace specdec::server
