#include "server/api_error.h"

#include <utility>

namespace specdec::server {

ApiError invalid_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError not_supported(std::string message, std::string param) {
  return invalid_request(std::move(message), std::move(param), "not_supported");
}

ApiError unavailable(std::string message, std::string code) {
  ApiError e;
  e.status = 503;
  e.message = std::move(message);
  e.type = "service_unavailable_error";
  e.code = std::move(code);
  return e;
}

nlohmann::json error_json(const ApiError& e) {
  nlohmann::json err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return {{"error", std::move(err)}};
}

ApiError error_for_status(int status) {
  ApiError e;
  e.status = status;
  switch (status) {
    case 400:
      e.message = "bad request";
      break;
    case 401:
      e.message = "invalid or missing API key (send the header 'Authorization: Bearer KEY')";
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case 404:
      e.message = "not found";
      e.type = "not_found_error";
      break;
    case 405:
      e.message = "method not allowed";
      break;
    case 413:
      e.message = "the request body is larger than the server's limit (--max-body-size)";
      e.code = "request_too_large";
      break;
    case 414:
      e.message = "the request URI is too long";
      break;
    case 503:
      e.message = "the server cannot take requests now";
      e.type = "service_unavailable_error";
      break;
    default:
      e.message = status >= 500 ? "internal server error" : "request failed";
      e.type = status >= 500 ? "server_error" : "invalid_request_error";
      break;
  }
  return e;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace specdec::server
