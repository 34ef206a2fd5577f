#include "server/prompt_builder.h"

#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::server {

std::string render_chat(const ModelBackend& b, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  if (!b.chat_template) return b.tokenizer->apply_chat_template(messages, add_generation_prompt);
  const Tokenizer& tok = *b.tokenizer;
  const std::string bos = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "";
  return apply_chat_template(*b.chat_template, messages, add_generation_prompt, bos, eos);
}

std::optional<ApiError> build_prompts(const CompletionRequest& r, const ModelBackend& b,
                                      std::vector<BuiltPrompt>* out) {
  const Tokenizer& tok = *b.tokenizer;
  out->clear();
  if (r.kind == ApiKind::kChat) {
    std::string text;
    try {
      text = render_chat(b, r.messages, r.add_generation_prompt);
    } catch (const Error& e) {
      return invalid_request(e.what(), "messages");
    }
    BuiltPrompt p;
    p.tokens = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
    out->push_back(std::move(p));
    return std::nullopt;
  }
  for (const RawPrompt& raw : r.prompts) {
    BuiltPrompt p;
    if (raw.is_text) {
      p.tokens = tok.encode(raw.text, r.add_special_tokens, /*parse_special=*/true);
      if (r.echo) p.text = raw.text;
    } else {
      p.tokens = raw.tokens;
      if (r.echo) {
        for (int32_t t : p.tokens) {
          if (t < 0 || t >= tok.n_vocab()) {
            return invalid_request("prompt token id " + std::to_string(t) +
                                       " is outside the vocabulary [0, " +
                                       std::to_string(tok.n_vocab()) + ")",
                                   "prompt");
          }
        }
        p.text = tok.decode(p.tokens);
      }
    }
    out->push_back(std::move(p));
  }
  return std::nullopt;
}

}  // namespace specdec::server
