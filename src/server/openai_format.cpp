#include "server/openai_format.h"

#include <atomic>
#include <random>

#include <fmt/format.h>

#include "server/metrics.h"

namespace specdec::server {

using nlohmann::json;

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

namespace {

json base_object(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", "specdec"}};
}

}  // namespace

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
    json choice = {{"index", i},
                   {"logprobs", nullptr},
                   {"finish_reason", finish_reason_json(c.finished, c.reason)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      const size_t p = static_cast<size_t>(c.prompt_index);
      choice["text"] = request.echo ? prompt_texts[p] + c.text : c.text;
      if (request.return_token_ids) choice["prompt_token_ids"] = prompt_tokens[p];
    }
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
  json choice = {{"index", part.index},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason_json(part.finished, part.reason)}};
  if (chat) {
    json delta = json::object();
    if (part.role) delta["role"] = "assistant";
    if (part.role || !part.text.empty()) delta["content"] = part.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = part.text;
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
