// Chat templates: the few prompt formats our models use, recognized from the model's Jinja
// source (tokenizer.chat_template) by markers and rendered natively, producing exactly the text
// the Hugging Face Jinja template renders for plain role/content messages (no tools).
//
// Detection (detect_chat_template), first rule that applies:
//   ""                                   -> kChatML (no template: ChatML, as llama.cpp defaults)
//   "<|im_start|>"                       -> kChatML
//   "<|start_header_id|>" + "Cutting Knowledge Date" -> Error (Llama 3.1+ date/tool preamble)
//   "<|start_header_id|>"                -> kLlama3
//   "[INST]" + "<<SYS>>"                 -> kLlama2 ("[INST]" alone is Mistral's family: Error)
//   "<start_of_turn>"                    -> kGemma
//   "<|user|>" + "<|end|>" (no "<|system|>") -> kPhi3
//   anything else                        -> specdec::Error naming the problem
#pragma once

#include <string>
#include <vector>

namespace specdec {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

enum class ChatTemplateKind {
  // <|im_start|>{role}\n{content}<|im_end|>\n ... ; prompt: <|im_start|>assistant\n
  kChatML,
  // Llama 2 chat: {bos}[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} {eos}
  kLlama2,
  // Llama 3: {bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|> ...
  kLlama3,
  // Gemma: {bos}<start_of_turn>{user|model}\n{content|trim}<end_of_turn>\n ...
  kGemma,
  // Phi-3 (mini-4k original): {bos}<|user|>\n{content}<|end|>\n<|assistant|>\n ...
  kPhi3,
};

const char* chat_template_kind_name(ChatTemplateKind kind);

// The kind of a Jinja chat template, by the rules above. Throws specdec::Error for a template
// it does not recognize.
ChatTemplateKind detect_chat_template(const std::string& jinja_source);

// A recognized template plus the details read from its source.
struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::kChatML;
  // ChatML only: a system message the template inserts before the first message when that is
  // not a system message (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by
  // Hugging Face"). Empty: none.
  std::string default_system_message;

  // Detects the kind and reads the default system message. Throws as detect_chat_template.
  static ChatTemplate from_source(const std::string& jinja_source);
};

// Renders `messages`. `bos_text` / `eos_text` are what the template's {{ bos_token }} /
// {{ eos_token }} render (the token texts, e.g. "<s>" / "</s>"; eos_text is used by kLlama2
// only). `add_generation_prompt` appends the header of the assistant's turn (kPhi3 ignores it:
// its user turns already end with <|assistant|>, as in the original template). Throws
// specdec::Error where the original template raises an exception (roles not alternating
// user/assistant for kLlama2 and kGemma, a system message for kGemma).
// The text already holds the BOS where the template puts it: tokenize it without adding
// special tokens and with special-token parsing (as HF's apply_chat_template(tokenize=True)).
std::string apply_chat_template(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_text,
                                const std::string& eos_text = "");

// The same for a kind already detected from `jinja_source`; the default system message (kChatML)
// is read from `jinja_source` ("" for none).
std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& jinja_source,
                                const std::string& bos_text, const std::string& eos_text = "");

}  // namespace specdec
