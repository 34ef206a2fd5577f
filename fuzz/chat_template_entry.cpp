// chat_template_one: the chat template detection and rendering on arbitrary bytes.
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.h"
#include "tokenizer/chat_template.h"
#include "util/check.h"

namespace specdec::fuzz {

void chat_template_one(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const size_t nul = bytes.find('\0');
  const std::string source = bytes.substr(0, nul);
  std::vector<ChatMessage> messages;
  if (nul != std::string::npos) {
    const std::string rest = bytes.substr(nul + 1);
    size_t at = 0;
    while (at <= rest.size() && messages.size() < 64) {
      size_t end = rest.find('\x01', at);
      if (end == std::string::npos) end = rest.size();
      const std::string rec = rest.substr(at, end - at);
      const size_t sep = rec.find('\x02');
      ChatMessage m;
      m.role = sep == std::string::npos ? "user" : rec.substr(0, sep);
      m.content = sep == std::string::npos ? rec : rec.substr(sep + 1);
      messages.push_back(std::move(m));
      at = end + 1;
    }
  }
  ChatTemplate tmpl;
  try {
    tmpl = ChatTemplate::from_source(source);
  } catch (const Error&) {
    return;  // a template it does not recognize: refused with a message
  }
  for (bool generation_prompt : {false, true}) {
    std::string text;
    try {
      text = apply_chat_template(tmpl, messages, generation_prompt, "<s>", "</s>");
    } catch (const Error&) {
      continue;  // a conversation the template refuses (roles, system message)
    }
    if (tmpl.kind == ChatTemplateKind::kChatML) {
      for (const ChatMessage& m : messages) FUZZ_CHECK(text.find(m.content) != std::string::npos);
    }
  }
}

}  // namespace specdec::fuzz
