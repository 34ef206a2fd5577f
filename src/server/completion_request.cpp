#include "server/completion_request.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace specdec::server {
namespace {

using nlohmann::json;

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

ApiError wrong_type(const std::string& name, const char* expected, const json& got) {
  return invalid_request(fmt::format("'{}' must be {}, got {}", name, expected, type_name(got)),
                         name);
}

// The value of a field, or null when it is absent (absent and null mean the same).
const json& field(const json& body, const char* name) {
  static const json kNull;
  auto it = body.find(name);
  return it == body.end() ? kNull : *it;
}

// An integral JSON number (16 or 16.0) as int64; false otherwise.
bool as_int64(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

std::optional<ApiError> read_bool(const json& body, const char* name, bool* out) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean()) return wrong_type(name, "a boolean", v);
  *out = v.get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_int(const json& body, const char* name, int64_t lo, int64_t hi,
                                 int64_t* out) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  int64_t x = 0;
  if (!as_int64(v, &x)) return wrong_type(name, "an integer", v);
  if (x < lo || x > hi) {
    return invalid_request(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x), name);
  }
  *out = x;
  return std::nullopt;
}

// A number in [lo, hi] (lo excluded when lo_open).
std::optional<ApiError> read_number(const json& body, const char* name, double lo, double hi,
                                    bool lo_open, float* out) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) return wrong_type(name, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
    return invalid_request(
        fmt::format("'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, x),
        name);
  }
  *out = static_cast<float>(x);
  return std::nullopt;
}

// Fields of the API that the engine cannot honour: present with a value other than "off".
std::optional<ApiError> check_unsupported(const json& body) {
  for (const char* name : {"frequency_penalty", "presence_penalty"}) {
    const json& v = field(body, name);
    if (v.is_null()) continue;
    if (!v.is_number()) return wrong_type(name, "a number", v);
    if (v.get<double>() != 0) {
      return not_supported(fmt::format("'{}' is not supported (use repetition_penalty)", name),
                           name);
    }
  }
  const json& bias = field(body, "logit_bias");
  if (!bias.is_null() && !(bias.is_object() && bias.empty())) {
    return not_supported("logit_bias is not supported", "logit_bias");
  }
  const json& best_of = field(body, "best_of");
  if (!best_of.is_null() && !(best_of.is_number() && best_of.get<double>() == 1)) {
    return not_supported("best_of is not supported", "best_of");
  }
  const json& suffix = field(body, "suffix");
  if (!suffix.is_null() && !(suffix.is_string() && suffix.get<std::string>().empty())) {
    return not_supported("suffix is not supported", "suffix");
  }
  for (const char* name : {"tools", "functions"}) {
    const json& v = field(body, name);
    if (!v.is_null() && !(v.is_array() && v.empty())) {
      return not_supported("tool calling is not supported", name);
    }
  }
  const json& format = field(body, "response_format");
  if (!format.is_null()) {
    if (!format.is_object()) return wrong_type("response_format", "an object", format);
    const json& type = field(format, "type");
    if (!(type.is_string() && type.get<std::string>() == "text")) {
      return not_supported("response_format other than {\"type\": \"text\"} is not supported",
                           "response_format");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_token_ids(const json& v, const std::string& name,
                                       std::vector<int32_t>* out) {
  out->clear();
  for (const json& t : v) {
    int64_t id = 0;
    if (!as_int64(t, &id)) return wrong_type(name, "an array of integers (token ids)", v);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return invalid_request(fmt::format("token id {} in '{}' is out of range", id, name), name);
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

std::optional<ApiError> read_prompts(const json& body, std::vector<RawPrompt>* out) {
  const json& p = field(body, "prompt");
  if (p.is_null()) return invalid_request("'prompt' is required", "prompt");
  const char* expected =
      "a string, an array of strings, an array of token ids or an array of "
      "arrays of token ids";
  if (p.is_string()) {
    out->push_back({true, p.get<std::string>(), {}});
    return std::nullopt;
  }
  if (!p.is_array()) return wrong_type("prompt", expected, p);
  if (p.empty()) return invalid_request("'prompt' must not be an empty array", "prompt");
  if (p[0].is_number()) {  // one prompt of token ids
    RawPrompt r;
    r.is_text = false;
    if (auto e = read_token_ids(p, "prompt", &r.tokens)) return e;
    out->push_back(std::move(r));
    return std::nullopt;
  }
  if (p.size() > static_cast<size_t>(kMaxPrompts)) {
    return invalid_request(fmt::format("at most {} prompts per request", kMaxPrompts), "prompt");
  }
  for (const json& item : p) {
    if (item.is_string()) {
      out->push_back({true, item.get<std::string>(), {}});
    } else if (item.is_array()) {
      RawPrompt r;
      r.is_text = false;
      if (auto e = read_token_ids(item, "prompt", &r.tokens)) return e;
      out->push_back(std::move(r));
    } else {
      return wrong_type("prompt", expected, p);
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_messages(const json& body, std::vector<ChatMessage>* out) {
  const json& m = field(body, "messages");
  if (m.is_null()) return invalid_request("'messages' is required", "messages");
  if (!m.is_array()) return wrong_type("messages", "an array of messages", m);
  if (m.empty()) return invalid_request("'messages' must not be empty", "messages");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    const json& msg = m[i];
    if (!msg.is_object()) return wrong_type(where, "an object", msg);
    const json& role = field(msg, "role");
    if (!role.is_string()) return wrong_type(where + ".role", "a string", role);
    ChatMessage cm;
    cm.role = role.get<std::string>();
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for it
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant") {
      return invalid_request(fmt::format("'{}.role' must be system, developer, user or "
                                         "assistant, got '{}'",
                                         where, cm.role),
                             where + ".role");
    }
    const json& content = field(msg, "content");
    if (content.is_string()) {
      cm.content = content.get<std::string>();
    } else if (content.is_array()) {  // [{"type": "text", "text": "..."}, ...]
      for (const json& part : content) {
        const json& type = part.is_object() ? field(part, "type") : part;
        if (!(type.is_string() && type.get<std::string>() == "text")) {
          return not_supported("only text content parts are supported", where + ".content");
        }
        const json& text = field(part, "text");
        if (!text.is_string()) return wrong_type(where + ".content[].text", "a string", text);
        cm.content += text.get<std::string>();
      }
    } else if (!content.is_null() || cm.role != "assistant") {
      return wrong_type(where + ".content", "a string or an array of text parts", content);
    }
    out->push_back(std::move(cm));
  }
  return std::nullopt;
}

std::optional<ApiError> read_stop(const json& body, std::vector<std::string>* out) {
  const json& s = field(body, "stop");
  if (s.is_null()) return std::nullopt;
  if (s.is_string()) {
    out->push_back(s.get<std::string>());
  } else if (s.is_array()) {
    if (s.size() > static_cast<size_t>(kMaxStopStrings)) {
      return invalid_request(fmt::format("at most {} stop strings", kMaxStopStrings), "stop");
    }
    for (const json& item : s) {
      if (!item.is_string()) return wrong_type("stop", "a string or an array of strings", s);
      out->push_back(item.get<std::string>());
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", s);
  }
  for (const std::string& stop : *out) {
    if (stop.size() > kMaxStopBytes) {
      return invalid_request(fmt::format("stop strings are at most {} bytes", kMaxStopBytes),
                             "stop");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_sampling(const json& body, CompletionRequest* r) {
  SamplingParams& sp = r->sampling;
  sp.temperature = 1.0f;  // OpenAI's default
  if (auto e = read_number(body, "temperature", 0.0, 2.0, false, &sp.temperature)) return e;
  if (auto e = read_number(body, "top_p", 0.0, 1.0, true, &sp.top_p)) return e;
  if (auto e = read_number(body, "min_p", 0.0, 1.0, false, &sp.min_p)) return e;
  if (auto e = read_number(body, "repetition_penalty", 0.0, 100.0, true, &sp.repetition_penalty)) {
    return e;
  }
  int64_t top_k = 0;
  if (auto e = read_int(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) return e;
  sp.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  const json& seed = field(body, "seed");
  if (!seed.is_null()) {
    if (seed.is_number_unsigned()) {
      sp.seed = seed.get<uint64_t>();
    } else {
      int64_t s = 0;
      if (!as_int64(seed, &s)) return wrong_type("seed", "an integer", seed);
      sp.seed = static_cast<uint64_t>(s);
    }
    r->seed_given = true;
  }
  return std::nullopt;
}

// completions: logprobs = k; chat: logprobs = true, top_logprobs = k (0 when absent). OpenAI
// refuses top_logprobs without logprobs: true, as vLLM does.
std::optional<ApiError> read_logprobs(const json& body, CompletionRequest* r) {
  int64_t k = -1;
  if (r->kind == ApiKind::kCompletion) {
    if (auto e = read_int(body, "logprobs", 0, kMaxLogprobs, &k)) return e;
    if (k >= 0 && r->echo) {
      return not_supported("logprobs with echo are not supported (no logprobs of prompt tokens)",
                           "logprobs");
    }
  } else {
    bool on = false;
    if (auto e = read_bool(body, "logprobs", &on)) return e;
    int64_t top = 0;
    if (auto e = read_int(body, "top_logprobs", 0, kMaxLogprobs, &top)) return e;
    if (!field(body, "top_logprobs").is_null() && !on) {
      return invalid_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    }
    if (on) k = top;
  }
  r->logprobs = static_cast<int>(k);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_json_body(const std::string& text, json* out) {
  struct TooDeep {};
  try {
    *out = json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const json::parse_error& e) {
    return invalid_request(std::string("malformed JSON body: ") + e.what(), {}, "invalid_json");
  } catch (const json::exception& e) {  // e.g. a number too large for a double (out_of_range)
    return invalid_request(std::string("malformed JSON body: ") + e.what(), {}, "invalid_json");
  } catch (const TooDeep&) {
    return invalid_request(
        fmt::format("the JSON body is nested deeper than {} levels", kMaxJsonDepth), {},
        "invalid_json");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const json& body, ApiKind kind,
                                                 CompletionRequest* r) {
  if (!body.is_object()) return invalid_request("the request body must be a JSON object");
  r->kind = kind;
  const json& model = field(body, "model");
  if (!model.is_null()) {
    if (!model.is_string()) return wrong_type("model", "a string", model);
    r->model = model.get<std::string>();
  }
  if (auto e = check_unsupported(body)) return e;
  if (kind == ApiKind::kCompletion) {
    if (auto e = read_prompts(body, &r->prompts)) return e;
    if (auto e = read_bool(body, "echo", &r->echo)) return e;
    if (auto e = read_bool(body, "add_special_tokens", &r->add_special_tokens)) return e;
  } else {
    if (auto e = read_messages(body, &r->messages)) return e;
    if (auto e = read_bool(body, "add_generation_prompt", &r->add_generation_prompt)) return e;
  }
  int64_t n = 1;
  if (auto e = read_int(body, "n", 1, kMaxChoices, &n)) return e;
  r->n = static_cast<int>(n);
  const int64_t max_int = std::numeric_limits<int32_t>::max();
  int64_t max_tokens = kind == ApiKind::kCompletion ? 16 : 0;  // OpenAI's defaults
  if (auto e = read_int(body, "max_tokens", 1, max_int, &max_tokens)) return e;
  if (auto e = read_int(body, "max_completion_tokens", 1, max_int, &max_tokens)) return e;
  r->max_tokens = static_cast<int>(max_tokens);
  if (auto e = read_sampling(body, r)) return e;
  if (auto e = read_logprobs(body, r)) return e;
  if (auto e = read_stop(body, &r->stop)) return e;
  const json& stop_ids = field(body, "stop_token_ids");
  if (!stop_ids.is_null()) {
    if (!stop_ids.is_array()) {
      return wrong_type("stop_token_ids", "an array of integers (token ids)", stop_ids);
    }
    if (stop_ids.size() > kMaxStopTokenIds) {
      return invalid_request(fmt::format("at most {} stop_token_ids", kMaxStopTokenIds),
                             "stop_token_ids");
    }
    if (auto e = read_token_ids(stop_ids, "stop_token_ids", &r->stop_token_ids)) return e;
  }
  if (auto e = read_bool(body, "ignore_eos", &r->ignore_eos)) return e;
  if (auto e = read_bool(body, "stream", &r->stream)) return e;
  if (auto e = read_bool(body, "return_token_ids", &r->return_token_ids)) return e;
  const json& options = field(body, "stream_options");
  if (!options.is_null()) {
    if (!options.is_object()) return wrong_type("stream_options", "an object", options);
    if (auto e = read_bool(options, "include_usage", &r->include_usage)) return e;
    if (auto e = read_bool(options, "continuous_usage_stats", &r->continuous_usage)) return e;
  }
  return std::nullopt;
}

}  // namespace specdec::server
