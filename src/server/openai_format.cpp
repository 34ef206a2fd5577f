#include "server/openai_format.h"

#include <algorithm>
#include <atomic>
#include <random>

#include <fmt/format.h>

#include "server/metrics.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace specdec::server {

using json = Json;  // ordered

std::string make_response_id(ApiKind kind) {
  // Random per process, then a counter: unique without a lock.
  static const uint64_t base = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1);
  return fmt::format("{}-{:016x}{:08x}", kind == ApiKind::kChat ? "chatcmpl" : "cmpl", base,
                     static_cast<uint32_t>(n));
}

json finish_reason_json(bool finished, StopReason reason) {
  if (!finished) return nullptr;
  switch (reason) {
    case StopReason::kStop:
      return "stop";
    case StopReason::kLength:
      return "length";
    case StopReason::kCancelled:
      return "abort";
    case StopReason::kError:
      return "error";
    case StopReason::kNone:
      break;
  }
  return nullptr;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json specdec_json(SpecMethod method, const std::vector<const RequestStats*>& stats) {
  int64_t drafted = 0, accepted = 0, passes = 0;
  for (const RequestStats* s : stats) {
    drafted += s->n_drafted;
    accepted += s->n_accepted;
    passes += s->n_passes;
  }
  return {{"method", spec_method_name(method)},
          {"drafted_tokens", drafted},
          {"accepted_tokens", accepted},
          {"acceptance_rate", drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0},
          {"target_passes", passes}};
}

json stop_reason_json(const ResponseMeta& meta, bool finished, StopReason reason,
                      int32_t stop_token, const std::string& stop_string) {
  if (!finished || reason != StopReason::kStop) return nullptr;
  if (stop_token < 0) return stop_string.empty() ? json(nullptr) : json(stop_string);
  const bool eog =
      !meta.ignore_eos && meta.tokenizer != nullptr && meta.tokenizer->is_eog(stop_token);
  return eog ? json(nullptr) : json(stop_token);
}

namespace {

// vLLM's floor for a logprob that JSON cannot carry (-inf).
double finite_logprob(float logprob) {
  return std::max(static_cast<double>(logprob), -9999.0);
}

// A token's string as the API shows it: its piece, special tokens as their text, U+FFFD for half
// a character.
std::string token_string(const Tokenizer* tok, int32_t id) {
  if (tok == nullptr || id < 0 || id >= tok->n_vocab()) {
    return "token_id:" + std::to_string(id);  // vLLM's return_tokens_as_token_ids form
  }
  return sanitize_utf8(tok->token_to_piece(id, /*render_special=*/true));
}

// The piece's raw bytes (chat's `bytes`).
json token_bytes(const Tokenizer* tok, int32_t id) {
  json bytes = json::array();
  if (tok == nullptr || id < 0 || id >= tok->n_vocab()) return bytes;
  for (unsigned char c : tok->token_to_piece(id, /*render_special=*/true)) {
    bytes.push_back(static_cast<int>(c));
  }
  return bytes;
}

// Code points, as Python's len() and OpenAI's text_offset count them.
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

json completion_logprobs(const ResponseMeta& meta, const std::vector<TokenLogprob>& logprobs,
                         int64_t* text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& lp : logprobs) {
    const std::string text = token_string(meta.tokenizer, lp.token);
    tokens.push_back(text);
    token_logprobs.push_back(finite_logprob(lp.logprob));
    // The k best, then the chosen token when it is not among them (OpenAI: up to k + 1). Two
    // tokens with the same string keep the better logprob.
    json entries = json::object();
    auto add = [&](int32_t id, float logprob) {
      const std::string key = token_string(meta.tokenizer, id);
      if (!entries.contains(key)) entries[key] = finite_logprob(logprob);
    };
    for (const auto& [id, logprob] : lp.top) add(id, logprob);
    add(lp.token, lp.logprob);
    top.push_back(std::move(entries));
    offsets.push_back(*text_offset);
    *text_offset += code_points(text);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json chat_logprob_entry(const Tokenizer* tok, int32_t id, float logprob) {
  return {{"token", token_string(tok, id)},
          {"logprob", finite_logprob(logprob)},
          {"bytes", token_bytes(tok, id)}};
}

json chat_logprobs(const ResponseMeta& meta, const std::vector<TokenLogprob>& logprobs) {
  json content = json::array();
  for (const TokenLogprob& lp : logprobs) {
    json entry = chat_logprob_entry(meta.tokenizer, lp.token, lp.logprob);
    json top = json::array();
    for (const auto& [id, logprob] : lp.top) {
      top.push_back(chat_logprob_entry(meta.tokenizer, id, logprob));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json base_object(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", "specdec"}};
}

}  // namespace

json logprobs_json(const ResponseMeta& meta, const std::vector<TokenLogprob>& logprobs,
                   int64_t* text_offset) {
  if (meta.logprobs < 0) return nullptr;
  if (meta.kind == ApiKind::kChat) return chat_logprobs(meta, logprobs);
  return completion_logprobs(meta, logprobs, text_offset);
}

json full_response(const ResponseMeta& meta, const CompletionRequest& request,
                   const std::vector<ChoiceResult>& choices,
                   const std::vector<std::vector<int32_t>>& prompt_tokens,
                   const std::vector<std::string>& prompt_texts, const Usage& usage) {
  const bool chat = meta.kind == ApiKind::kChat;
  json out = base_object(meta, chat ? "chat.completion" : "text_completion");
  json list = json::array();
  std::vector<const RequestStats*> stats;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    stats.push_back(&c.stats);
    json choice = {{"index", i}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      const size_t p = static_cast<size_t>(c.prompt_index);
      choice["text"] = request.echo ? prompt_texts[p] + c.text : c.text;
      if (request.return_token_ids) choice["prompt_token_ids"] = prompt_tokens[p];
    }
    int64_t text_offset = 0;
    choice["logprobs"] = logprobs_json(meta, c.logprobs, &text_offset);
    choice["finish_reason"] = finish_reason_json(c.finished, c.reason);
    choice["stop_reason"] =
        stop_reason_json(meta, c.finished, c.reason, c.stop_token, c.stop_string);
    if (request.return_token_ids) choice["token_ids"] = c.tokens;
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  if (chat && request.return_token_ids) out["prompt_token_ids"] = prompt_tokens[0];
  out["usage"] = usage_json(usage);
  out["specdec"] = specdec_json(meta.spec_method, stats);
  return out;
}

json stream_chunk(const ResponseMeta& meta, const ChunkPart& part) {
  const bool chat = meta.kind == ApiKind::kChat;
  json out = base_object(meta, chat ? "chat.completion.chunk" : "text_completion");
  int64_t no_offset = 0;
  json logprobs = nullptr;
  if (part.logprobs != nullptr) {
    logprobs = logprobs_json(meta, *part.logprobs,
                             part.text_offset != nullptr ? part.text_offset : &no_offset);
  }
  json choice = {{"index", part.index}};
  if (chat) {
    json delta = json::object();
    if (part.role) delta["role"] = "assistant";
    if (part.role || !part.text.empty()) delta["content"] = part.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = part.text;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason_json(part.finished, part.reason);
  if (part.finished) {
    choice["stop_reason"] =
        stop_reason_json(meta, part.finished, part.reason, part.stop_token, part.stop_string);
  }
  if (part.token_ids != nullptr) choice["token_ids"] = *part.token_ids;
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json usage_chunk(const ResponseMeta& meta, const Usage& usage, const json& specdec) {
  const bool chat = meta.kind == ApiKind::kChat;
  json out = base_object(meta, chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  out["specdec"] = specdec;
  return out;
}

}  // namespace specdec::server
