// The token ids of a request's prompts, as `specdec generate` builds them:
//   completions, text      encode(text, add_special = add_special_tokens, parse_special = true)
//   completions, ids       as given (the engine checks the range)
//   chat                   the chat template (--chat-template, else the model's), then
//                          encode(text, add_special = false, parse_special = true): the template
//                          writes BOS itself where the format has one
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/completion_request.h"
#include "server/server_state.h"

namespace specdec::server {

struct BuiltPrompt {
  std::vector<int32_t> tokens;
  std::string text;  // for echo: the prompt as text ("" unless asked for)
};

std::optional<ApiError> build_prompts(const CompletionRequest& request, const ModelBackend& backend,
                                      std::vector<BuiltPrompt>* out);

// The chat template's text for `messages` (the server's template or the model's); throws
// specdec::Error when the template cannot render them.
std::string render_chat(const ModelBackend& backend, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt);

}  // namespace specdec::server
