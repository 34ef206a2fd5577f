// The JSON of OpenAI's completion and chat-completion responses and of their stream chunks, plus
// the `specdec` object every response carries (what speculation did for it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/completion_request.h"
#include "specdec/engine.h"

namespace specdec::server {

// What every response / chunk of one request repeats.
struct ResponseMeta {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  SpecMethod spec_method = SpecMethod::kNone;
};

// A fresh response id with the endpoint's prefix.
std::string make_response_id(ApiKind kind);

// "stop", "length", "abort" (cancelled), "error"; null while running.
nlohmann::json finish_reason_json(bool finished, StopReason reason);

// Everything one choice produced.
struct ChoiceResult {
  int prompt_index = 0;
  std::string text;
  std::vector<int32_t> tokens;
  bool finished = false;
  StopReason reason = StopReason::kNone;
  std::string error;
  RequestStats stats;
};

// Token counts of a request: prompts counted once each, completions summed over choices.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
};
nlohmann::json usage_json(const Usage& u);

// {"method", "drafted_tokens", "accepted_tokens", "acceptance_rate", "target_passes"} summed
// over `choices`.
nlohmann::json specdec_json(SpecMethod method, const std::vector<const RequestStats*>& stats);

// The whole (non-streamed) response. `prompt_tokens[i]` / `prompt_texts[i]`: prompt i (ids for
// return_token_ids, text for echo).
nlohmann::json full_response(const ResponseMeta& meta, const CompletionRequest& request,
                             const std::vector<ChoiceResult>& choices,
                             const std::vector<std::vector<int32_t>>& prompt_tokens,
                             const std::vector<std::string>& prompt_texts, const Usage& usage);

// One stream chunk for one choice: new text (chat: delta.content), and the finish reason when
// it ended. `role`: chat's first chunk (delta.role = "assistant").
struct ChunkPart {
  int index = 0;
  std::string text;
  const std::vector<int32_t>* token_ids = nullptr;  // return_token_ids
  bool role = false;
  bool finished = false;
  StopReason reason = StopReason::kNone;
};
nlohmann::json stream_chunk(const ResponseMeta& meta, const ChunkPart& part);
// The last chunk of stream_options.include_usage: no choices, the usage and specdec totals.
nlohmann::json usage_chunk(const ResponseMeta& meta, const Usage& usage,
                           const nlohmann::json& specdec);

}  // namespace specdec::server
