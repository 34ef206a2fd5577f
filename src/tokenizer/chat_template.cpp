#include "tokenizer/chat_template.h"

#include <string_view>

#include <fmt/format.h>

#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec {
namespace {

bool contains(const std::string& s, std::string_view what) {
  return s.find(what) != std::string::npos;
}

// Python's str.isspace() for one code point (what Jinja's trim and str.strip() remove).
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Jinja's `trim` / Python's `strip()`: whitespace removed at both ends.
std::string trim(std::string_view s) {
  size_t begin = 0;
  size_t end = 0;  // one past the last non-space character
  size_t pos = 0;
  bool seen = false;
  while (pos < s.size()) {
    const size_t start = pos;
    uint32_t cp = 0;
    const bool ok = next_code_point(s, &pos, &cp);
    if (ok && is_python_space(cp)) continue;
    if (!seen) begin = start;
    seen = true;
    end = pos;
  }
  return seen ? std::string(s.substr(begin, end - begin)) : std::string();
}

// The literal system message of a ChatML template that inserts one when the conversation does
// not start with its own, e.g. SmolLM2's
//   {% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\n' }}
// The newline after "system" may be a real newline or the escape \n. A match whose text holds
// Jinja syntax or quotes (an expression such as `+ messages[0]['content']`) is not a literal.
std::string find_default_system_message(const std::string& src) {
  static constexpr std::string_view kStart = "<|im_start|>system";
  static constexpr std::string_view kEnd = "<|im_end|>";
  // The insertion depends on the first message's role.
  if (!contains(src, "'system'") && !contains(src, "\"system\"")) return "";
  for (size_t at = src.find(kStart); at != std::string::npos; at = src.find(kStart, at + 1)) {
    size_t p = at + kStart.size();
    if (src.compare(p, 1, "\n") == 0) {
      p += 1;
    } else if (src.compare(p, 2, "\\n") == 0) {
      p += 2;
    } else {
      continue;
    }
    const size_t end = src.find(kEnd, p);
    if (end == std::string::npos) continue;
    const std::string_view body(src.data() + p, end - p);
    if (body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string message;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size()) {
        const char e = body[++i];
        message.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
      } else {
        message.push_back(body[i]);
      }
    }
    return message;
  }
  return "";
}

void check_alternating(const std::vector<ChatMessage>& messages, size_t first, const char* what) {
  for (size_t i = first; i < messages.size(); ++i) {
    if ((messages[i].role == "user") != ((i - first) % 2 == 0)) {
      throw Error(
          fmt::format("{} chat template: conversation roles must alternate "
                      "user/assistant/user/assistant/... (message {} has role '{}')",
                      what, i, messages[i].role));
    }
  }
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& default_system) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && !default_system.empty() && m.role != "system") {
      out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    }
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// meta-llama/Llama-2-*-chat-hf's template.
std::string render_llama2(const std::vector<ChatMessage>& messages, const std::string& bos,
                          const std::string& eos) {
  size_t first = 0;
  const std::string* system = nullptr;
  if (!messages.empty() && messages[0].role == "system") {
    system = &messages[0].content;
    first = 1;
  }
  check_alternating(messages, first, "Llama 2");
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string content = m.content;
    if (i == first && system != nullptr) {
      content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + m.content;
    }
    if (m.role == "user") {
      out.append(bos).append("[INST] ").append(trim(content)).append(" [/INST]");
    } else if (m.role == "assistant") {
      out.append(" ").append(trim(content)).append(" ").append(eos);
    }
  }
  return out;
}

// meta-llama/Meta-Llama-3-8B-Instruct's template.
std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& bos) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos;
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
           trim(messages[i].content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// google/gemma-*-it's template.
std::string render_gemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         const std::string& bos) {
  if (!messages.empty() && messages[0].role == "system") {
    throw Error("Gemma chat template: the system role is not supported");
  }
  check_alternating(messages, 0, "Gemma");
  std::string out = bos;
  for (const ChatMessage& m : messages) {
    const std::string& role = m.role == "assistant" ? std::string("model") : m.role;
    out += "<start_of_turn>" + role + "\n" + trim(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

// microsoft/Phi-3-mini-4k-instruct's original template: other roles than user / assistant are
// dropped, and every user turn opens the assistant's.
std::string render_phi3(const std::vector<ChatMessage>& messages, const std::string& bos) {
  std::string out = bos;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      out += "<|user|>\n" + m.content + "<|end|>\n<|assistant|>\n";
    } else if (m.role == "assistant") {
      out += m.content + "<|end|>\n";
    }
  }
  return out;
}

}  // namespace

const char* chat_template_kind_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML:
      return "chatml";
    case ChatTemplateKind::kLlama2:
      return "llama2";
    case ChatTemplateKind::kLlama3:
      return "llama3";
    case ChatTemplateKind::kGemma:
      return "gemma";
    case ChatTemplateKind::kPhi3:
      return "phi3";
  }
  return "?";
}

ChatTemplateKind detect_chat_template(const std::string& src) {
  if (src.empty()) return ChatTemplateKind::kChatML;
  if (contains(src, "<|im_start|>")) return ChatTemplateKind::kChatML;
  if (contains(src, "<|start_header_id|>")) {
    if (contains(src, "Cutting Knowledge Date")) {
      throw Error("unsupported chat template: Llama 3.1+ style (date and tools preamble)");
    }
    return ChatTemplateKind::kLlama3;
  }
  if (contains(src, "[INST]")) {
    if (!contains(src, "<<SYS>>")) {
      throw Error("unsupported chat template: [INST] without <<SYS>> (Mistral family)");
    }
    return ChatTemplateKind::kLlama2;
  }
  if (contains(src, "<start_of_turn>")) return ChatTemplateKind::kGemma;
  if (contains(src, "<|user|>") && contains(src, "<|end|>")) {
    if (contains(src, "<|system|>")) {
      throw Error("unsupported chat template: Phi-3 variant with <|system|> turns");
    }
    return ChatTemplateKind::kPhi3;
  }
  throw Error(
      fmt::format("unrecognized chat template (none of the ChatML, Llama 2, Llama 3, "
                  "Gemma or Phi-3 markers): '{}'",
                  src.substr(0, 120)));
}

ChatTemplate ChatTemplate::from_source(const std::string& jinja_source) {
  ChatTemplate t;
  t.kind = detect_chat_template(jinja_source);
  if (t.kind == ChatTemplateKind::kChatML) {
    t.default_system_message = find_default_system_message(jinja_source);
  }
  return t;
}

std::string apply_chat_template(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_text,
                                const std::string& eos_text) {
  switch (tmpl.kind) {
    case ChatTemplateKind::kChatML:
      return render_chatml(messages, add_generation_prompt, tmpl.default_system_message);
    case ChatTemplateKind::kLlama2:
      return render_llama2(messages, bos_text, eos_text);
    case ChatTemplateKind::kLlama3:
      return render_llama3(messages, add_generation_prompt, bos_text);
    case ChatTemplateKind::kGemma:
      return render_gemma(messages, add_generation_prompt, bos_text);
    case ChatTemplateKind::kPhi3:
      return render_phi3(messages, bos_text);
  }
  SPECDEC_CHECK(false, "unhandled ChatTemplateKind");
  return {};
}

std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& jinja_source,
                                const std::string& bos_text, const std::string& eos_text) {
  ChatTemplate tmpl;
  tmpl.kind = kind;
  if (kind == ChatTemplateKind::kChatML) {
    tmpl.default_system_message = find_default_system_message(jinja_source);
  }
  return apply_chat_template(tmpl, messages, add_generation_prompt, bos_text, eos_text);
}

}  // namespace specdec
