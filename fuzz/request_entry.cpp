// request_one: the server's request body parsing and checking on arbitrary bytes. Errors are
// values at this boundary (an ApiError for the client), so any exception is a finding.
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_entries.h"
#include "server/completion_request.h"

namespace specdec::fuzz {

void request_one(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    nlohmann::json j;
    if (server::parse_json_body(body, &j).has_value()) return;  // a 400 for the client
    for (server::ApiKind kind : {server::ApiKind::kCompletion, server::ApiKind::kChat}) {
      server::CompletionRequest r;
      if (server::parse_completion_request(j, kind, &r).has_value()) continue;
      FUZZ_CHECK(r.n >= 1 && r.n <= server::kMaxChoices);
      FUZZ_CHECK(r.prompts.size() <= static_cast<size_t>(server::kMaxPrompts));
      FUZZ_CHECK(kind == server::ApiKind::kChat || !r.prompts.empty());
      FUZZ_CHECK(r.stop.size() <= static_cast<size_t>(server::kMaxStopStrings));
      for (const std::string& s : r.stop) FUZZ_CHECK(s.size() <= server::kMaxStopBytes);
      FUZZ_CHECK(r.stop_token_ids.size() <= server::kMaxStopTokenIds);
      FUZZ_CHECK(r.logprobs >= -1 && r.logprobs <= server::kMaxLogprobs);
      FUZZ_CHECK(r.max_tokens >= 0);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "request_one: exception at the request boundary: %s\n", e.what());
    FUZZ_CHECK(false);
  }
}

}  // namespace specdec::fuzz
