// The body of POST /v1/completions and /v1/chat/completions, read and checked: every field of
// the wrong type or out of range is an ApiError naming it, fields this server cannot honour
// (tools, penalties other than repetition_penalty, echo with logprobs, ...) are a 400 saying so,
// unknown fields are ignored (as vLLM does), and null means "absent".
//
//   field                   completions          chat                 range / notes
//   model                   string               string               checked by the server
//   prompt                  str | [str] | [int] | [[int]]             one choice set per prompt
//   messages                                     [{role, content}]    content: str | text parts
//   max_tokens              int (default 16)     int (to the context end)   >= 1
//   max_completion_tokens   int                  int                  preferred over max_tokens
//   n                       1..16                1..16                choices per prompt
//   logprobs                int 0..20            bool                 per generated token
//   top_logprobs                                 int 0..20            needs logprobs: true
//   temperature [0, 2] (default 1), top_p (0, 1], top_k >= -1 (-1, 0: off), min_p [0, 1],
//   repetition_penalty > 0, seed int64 (default: random per choice)
//   stop str | [str] (at most 16, each at most 256 bytes), stop_token_ids [int] (at most 256),
//   ignore_eos bool, add_special_tokens bool (completions, default true), stream,
//   stream_options.include_usage, stream_options.continuous_usage_stats, echo (completions),
//   return_token_ids (token ids of the prompt and of each choice, as vLLM)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "specdec/sampling_params.h"
#include "tokenizer/chat_template.h"

namespace specdec::server {

enum class ApiKind { kCompletion, kChat };

// One prompt of a completions request before tokenization: text, or token ids.
struct RawPrompt {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> tokens;
};

struct CompletionRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // "" when absent
  std::vector<RawPrompt> prompts;     // completions: one or more
  std::vector<ChatMessage> messages;  // chat
  bool add_generation_prompt = true;  // chat (vLLM's extension)
  bool add_special_tokens = true;     // completions: BOS as the model's metadata says
  int n = 1;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage: a last chunk with usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats: usage in every chunk
  bool echo = false;              // completions: the prompt's text before the completion
  bool return_token_ids = false;
  int max_tokens = 0;  // 0: not given (the endpoint's default)
  SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // -1: no logprobs; k >= 0: each generated token's logprob and the k most likely (completions:
  // `logprobs`; chat: `top_logprobs`, 0 when only `logprobs: true`).
  int logprobs = -1;
};

inline constexpr int kMaxLogprobs = 20;  // OpenAI's bound on logprobs / top_logprobs

inline constexpr int kMaxChoices = 16;  // n at most
inline constexpr int kMaxPrompts = 64;  // prompts of one completions request at most
inline constexpr int kMaxStopStrings = 16;
// Bounds that keep one request from slowing the engine's step for everyone (stop strings are
// matched against held-back text on every token).
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr size_t kMaxStopTokenIds = 256;

// Parses a request body (any route's) as JSON: malformed JSON, invalid UTF-8 (nlohmann's parser
// checks it) and nesting deeper than kMaxJsonDepth are a 400 "invalid_json".
inline constexpr int kMaxJsonDepth = 64;
std::optional<ApiError> parse_json_body(const std::string& text, nlohmann::json* out);

// Reads a request body (already parsed JSON). On error returns it and *out is unspecified.
std::optional<ApiError> parse_completion_request(const nlohmann::json& body, ApiKind kind,
                                                 CompletionRequest* out);

}  // namespace specdec::server
