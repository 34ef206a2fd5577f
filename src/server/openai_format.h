// The JSON of OpenAI's completion and chat-completion responses and of their stream chunks, plus
// the `specdec` object every response carries (what speculation did for it).
//
// Logprobs (one entry per generated token, stop tokens included, as the usage counts them):
//   completions  {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
//                 "text_offset": [int]}; top_logprobs holds the k best and the chosen token (up to
//                 k + 1 entries, as OpenAI); text_offset counts code points of the token strings
//   chat         {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
//                 "logprob", "bytes"}]}], "refusal": null}; top_logprobs: exactly the k best
// A token's string is its piece (special tokens as their text, e.g. "</s>") with invalid UTF-8
// (half a character of a byte-level token) replaced by U+FFFD; `bytes` are the piece's raw
// bytes, as llama-server gives them. A logprob of -inf is sent as -9999.0 (as vLLM).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/completion_request.h"
#include "specdec/engine.h"

namespace specdec {
class Tokenizer;
}

namespace specdec::server {

// Responses keep their keys in the order written (OpenAI's order; a completion's top_logprobs
// best first).
using Json = nlohmann::ordered_json;

// What every response / chunk of one request repeats.
struct ResponseMeta {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  SpecMethod spec_method = SpecMethod::kNone;
  const Tokenizer* tokenizer = nullptr;  // token strings of logprobs
  int logprobs = -1;                     // the request's k (-1: no logprobs)
  bool ignore_eos = false;               // the request's (for stop_reason)
};

// A fresh response id with the endpoint's prefix.
std::string make_response_id(ApiKind kind);

// "stop", "length", "abort" (cancelled), "error"; null while running.
Json finish_reason_json(bool finished, StopReason reason);

// vLLM's stop_reason of a finished choice: the stop string, the stop token id (a number), or
// null (the model's end-of-generation token, or no stop at all).
Json stop_reason_json(const ResponseMeta& meta, bool finished, StopReason reason,
                      int32_t stop_token, const std::string& stop_string);

// The logprobs object of `logprobs` (consecutive tokens of one choice); completions: the first
// token's text_offset is *text_offset, advanced past the tokens' strings.
Json logprobs_json(const ResponseMeta& meta, const std::vector<TokenLogprob>& logprobs,
                   int64_t* text_offset);

// Everything one choice produced.
struct ChoiceResult {
  int prompt_index = 0;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // [tokens] when the request asked for logprobs
  bool finished = false;
  StopReason reason = StopReason::kNone;
  int32_t stop_token = -1;
  std::string stop_string;
  std::string error;
  RequestStats stats;
};

// Token counts of a request: prompts counted once each, completions summed over choices.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
};
Json usage_json(const Usage& u);

// {"method", "drafted_tokens", "accepted_tokens", "acceptance_rate", "target_passes"} summed
// over `choices`.
Json specdec_json(SpecMethod method, const std::vector<const RequestStats*>& stats);

// The whole (non-streamed) response. `prompt_tokens[i]` / `prompt_texts[i]`: prompt i (ids for
// return_token_ids, text for echo).
Json full_response(const ResponseMeta& meta, const CompletionRequest& request,
                   const std::vector<ChoiceResult>& choices,
                   const std::vector<std::vector<int32_t>>& prompt_tokens,
                   const std::vector<std::string>& prompt_texts, const Usage& usage);

// One stream chunk for one choice: new text (chat: delta.content), the logprobs of its tokens,
// and the finish and stop reasons when it ended. `role`: chat's first chunk (delta.role =
// "assistant").
struct ChunkPart {
  int index = 0;
  std::string text;
  const std::vector<int32_t>* token_ids = nullptr;      // return_token_ids
  const std::vector<TokenLogprob>* logprobs = nullptr;  // with logprobs
  int64_t* text_offset = nullptr;                       // completions: the choice's running offset
  bool role = false;
  bool finished = false;
  StopReason reason = StopReason::kNone;
  int32_t stop_token = -1;
  std::string stop_string;
};
Json stream_chunk(const ResponseMeta& meta, const ChunkPart& part);
// The last chunk of stream_options.include_usage: no choices, the usage and specdec totals.
Json usage_chunk(const ResponseMeta& meta, const Usage& usage, const Json& specdec);

}  // namespace specdec::server
