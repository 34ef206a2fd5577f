// Writing JSON and OpenAI error objects into an httplib response.
#pragma once

#include <concepts>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace specdec::server {

inline void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

// The responses built in order (openai_format.h); a template so that a braced list picks the one
// above.
template <typename OrderedJson>
requires std::same_as<OrderedJson, nlohmann::ordered_json>
void send_json(httplib::Response& res, int status, const OrderedJson& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

// The error's status and body; 503s also say when to retry.
inline void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_json(e));
}

}  // namespace specdec::server
