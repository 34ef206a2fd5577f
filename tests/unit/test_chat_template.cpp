// Chat template tests: detection by markers, the default system message of SmolLM2-style
// ChatML templates, and renders compared with what jinja2 produces from the real templates.
#include "tokenizer/chat_template.h"

#include <map>

#include <gtest/gtest.h>

#include "common/gguf_writer.h"
#include "common/test_paths.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec {
namespace {

struct Expected {
  const char* template_name;
  const char* conversation;
  bool add_generation_prompt;
  const char* text;  // "!" when the template raises an exception
};

// Template sources (SmolLM2 and Phi-3 as stored in their GGUF files; the others as published in
// the models' tokenizer_config.json), cut into adjacent raw string literals.
constexpr const char* kSmollm2Template =
    R"J({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system)J"
    R"J(' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained )J"
    R"J(by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
)J"
    R"J(' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_pr)J"
    R"J(ompt %}{{ '<|im_start|>assistant
' }}{% endif %})J";
constexpr const char* kPhi3Template =
    R"J({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %})J"
    R"J({{'<|user|>' + '
' + message['content'] + '<|end|>' + '
' + '<|assistant|>' + '
)J"
    R"J('}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' +)J"
    R"J( '
'}}{% endif %}{% endfor %})J";
constexpr const char* kLlama2Template =
    R"J({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{%)J"
    R"J( set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = )J"
    R"J(messages %}{% set system_message = false %}{% endif %}{% for message in loop_mes)J"
    R"J(sages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_e)J"
    R"J(xception('Conversation roles must alternate user/assistant/user/assistant/...') )J"
    R"J(}}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content)J"
    R"J( = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% els)J"
    R"J(e %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'u)J"
    R"J(ser' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message)J"
    R"J(['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif)J"
    R"J( %}{% endfor %})J";
constexpr const char* kLlama3Template =
    R"J({% set loop_messages = messages %}{% for message in loop_messages %}{% set conte)J"
    R"J(nt = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message[)J"
    R"J('content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos)J"
    R"J(_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prom)J"
    R"J(pt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})J";
constexpr const char* kGemmaTemplate =
    R"J({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('Syste)J"
    R"J(m role not supported') }}{% endif %}{% for message in messages %}{% if (message[)J"
    R"J('role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation )J"
    R"J(roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (mes)J"
    R"J(sage['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = m)J"
    R"J(essage['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['conten)J"
    R"J(t'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<s)J"
    R"J(tart_of_turn>model\n'}}{% endif %})J";
constexpr const char* kQwenTemplate =
    R"J({%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messa)J"
    R"J(ges[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nY)J"
    R"J(ou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n')J"
    R"J( }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "use)J"
    R"J(r") or (message.role == "system" and not loop.first) or (message.role == "assist)J"
    R"J(ant") %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<)J"
    R"J(|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt)J"
    R"J( %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)J";

// Expected renders, produced by jinja2 3.1 (trim_blocks, lstrip_blocks, as HF transformers) from
// the sources above; "!" marks a render where the template raises an exception.
const std::vector<Expected>& expected_renders() {
  static const std::vector<Expected> kExpected = {
      {"smollm2", "user", false,
       "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugg"
       "ing Face<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"},
      {"smollm2", "user", true,
       "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugg"
       "ing Face<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant"
       "\n"},
      {"smollm2", "sys_user", false,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im"
       "_end|>\n"},
      {"smollm2", "sys_user", true,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im"
       "_end|>\n<|im_start|>assistant\n"},
      {"smollm2", "multi", false,
       "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugg"
       "ing Face<|im_end|>\n<|im_start|>user\n  Hello \n<|im_end|>\n<|im_start|>assistan"
       "t\n Hi! How can I help?\n<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>"
       "\n"},
      {"smollm2", "multi", true,
       "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugg"
       "ing Face<|im_end|>\n<|im_start|>user\n  Hello \n<|im_end|>\n<|im_start|>assistan"
       "t\n Hi! How can I help?\n<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>"
       "\n<|im_start|>assistant\n"},
      {"smollm2", "sys_multi", false,
       "<|im_start|>system\n Be nice. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_s"
       "tart|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"},
      {"smollm2", "sys_multi", true,
       "<|im_start|>system\n Be nice. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_s"
       "tart|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>"
       "assistant\n"},
      {"phi3", "user", false, "<s><|user|>\nHi there!<|end|>\n<|assistant|>\n"},
      {"phi3", "user", true, "<s><|user|>\nHi there!<|end|>\n<|assistant|>\n"},
      {"phi3", "sys_user", false, "<s><|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"},
      {"phi3", "sys_user", true, "<s><|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"},
      {"phi3", "multi", false,
       "<s><|user|>\n  Hello \n<|end|>\n<|assistant|>\n Hi! How can I help?\n<|end|>\n<|"
       "user|>\nTell me a joke.<|end|>\n<|assistant|>\n"},
      {"phi3", "multi", true,
       "<s><|user|>\n  Hello \n<|end|>\n<|assistant|>\n Hi! How can I help?\n<|end|>\n<|"
       "user|>\nTell me a joke.<|end|>\n<|assistant|>\n"},
      {"phi3", "sys_multi", false,
       "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n<|as"
       "sistant|>\n"},
      {"phi3", "sys_multi", true,
       "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n<|as"
       "sistant|>\n"},
      {"llama2", "user", false, "<s>[INST] Hi there! [/INST]"},
      {"llama2", "user", true, "<s>[INST] Hi there! [/INST]"},
      {"llama2", "sys_user", false,
       "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nWhat is 2+2? [/INST]"},
      {"llama2", "sys_user", true,
       "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nWhat is 2+2? [/INST]"},
      {"llama2", "multi", false,
       "<s>[INST] Hello [/INST] Hi! How can I help? </s><s>[INST] Tell me a joke. [/INST"
       "]"},
      {"llama2", "multi", true,
       "<s>[INST] Hello [/INST] Hi! How can I help? </s><s>[INST] Tell me a joke. [/INST"
       "]"},
      {"llama2", "sys_multi", false,
       "<s>[INST] <<SYS>>\n Be nice. \n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye ["
       "/INST]"},
      {"llama2", "sys_multi", true,
       "<s>[INST] <<SYS>>\n Be nice. \n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye ["
       "/INST]"},
      {"llama3", "user", false,
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"},
      {"llama3", "user", true,
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"llama3", "sys_user", false,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|e"
       "ot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"},
      {"llama3", "sys_user", true,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|e"
       "ot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start"
       "_header_id|>assistant<|end_header_id|>\n\n"},
      {"llama3", "multi", false,
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|st"
       "art_header_id|>assistant<|end_header_id|>\n\nHi! How can I help?<|eot_id|><|star"
       "t_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"},
      {"llama3", "multi", true,
       "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|st"
       "art_header_id|>assistant<|end_header_id|>\n\nHi! How can I help?<|eot_id|><|star"
       "t_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|><|start_header_id"
       "|>assistant<|end_header_id|>\n\n"},
      {"llama3", "sys_multi", false,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|"
       "><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assi"
       "stant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id"
       "|>\n\nBye<|eot_id|>"},
      {"llama3", "sys_multi", true,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|"
       "><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assi"
       "stant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id"
       "|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"gemma", "user", false, "<bos><start_of_turn>user\nHi there!<end_of_turn>\n"},
      {"gemma", "user", true,
       "<bos><start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n"},
      {"gemma", "sys_user", false, "!"},
      {"gemma", "sys_user", true, "!"},
      {"gemma", "multi", false,
       "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi! How can "
       "I help?<end_of_turn>\n<start_of_turn>user\nTell me a joke.<end_of_turn>\n"},
      {"gemma", "multi", true,
       "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi! How can "
       "I help?<end_of_turn>\n<start_of_turn>user\nTell me a joke.<end_of_turn>\n<start_"
       "of_turn>model\n"},
      {"gemma", "sys_multi", false, "!"},
      {"gemma", "sys_multi", true, "!"},
      {"qwen", "user", false,
       "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful as"
       "sistant.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"},
      {"qwen", "user", true,
       "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful as"
       "sistant.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant"
       "\n"},
      {"qwen", "sys_user", false,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im"
       "_end|>\n"},
      {"qwen", "sys_user", true,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im"
       "_end|>\n<|im_start|>assistant\n"},
      {"qwen", "multi", false,
       "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful as"
       "sistant.<|im_end|>\n<|im_start|>user\n  Hello \n<|im_end|>\n<|im_start|>assistan"
       "t\n Hi! How can I help?\n<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>"
       "\n"},
      {"qwen", "multi", true,
       "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful as"
       "sistant.<|im_end|>\n<|im_start|>user\n  Hello \n<|im_end|>\n<|im_start|>assistan"
       "t\n Hi! How can I help?\n<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>"
       "\n<|im_start|>assistant\n"},
      {"qwen", "sys_multi", false,
       "<|im_start|>system\n Be nice. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_s"
       "tart|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"},
      {"qwen", "sys_multi", true,
       "<|im_start|>system\n Be nice. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_s"
       "tart|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>"
       "assistant\n"},
  };
  return kExpected;
}

const std::map<std::string, std::vector<ChatMessage>>& conversations() {
  static const std::map<std::string, std::vector<ChatMessage>> kConversations = {
      {"user", {{"user", "Hi there!"}}},
      {"sys_user", {{"system", "You are terse."}, {"user", "What is 2+2?"}}},
      {"multi",
       {{"user", "  Hello \n"},
        {"assistant", " Hi! How can I help?\n"},
        {"user", "Tell me a joke."}}},
      {"sys_multi",
       {{"system", " Be nice. "}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}}},
  };
  return kConversations;
}

struct TemplateInfo {
  const char* source;
  ChatTemplateKind kind;
  const char* bos;
  const char* eos;
};

const std::map<std::string, TemplateInfo>& templates() {
  static const std::map<std::string, TemplateInfo> kTemplates = {
      {"smollm2", {kSmollm2Template, ChatTemplateKind::kChatML, "<|im_start|>", "<|im_end|>"}},
      {"qwen", {kQwenTemplate, ChatTemplateKind::kChatML, "", "<|im_end|>"}},
      {"phi3", {kPhi3Template, ChatTemplateKind::kPhi3, "<s>", "<|endoftext|>"}},
      {"llama2", {kLlama2Template, ChatTemplateKind::kLlama2, "<s>", "</s>"}},
      {"llama3", {kLlama3Template, ChatTemplateKind::kLlama3, "<|begin_of_text|>", "<|eot_id|>"}},
      {"gemma", {kGemmaTemplate, ChatTemplateKind::kGemma, "<bos>", "<eos>"}},
  };
  return kTemplates;
}

TEST(ChatTemplate, DetectsTheKinds) {
  for (const auto& [name, info] : templates()) {
    EXPECT_EQ(detect_chat_template(info.source), info.kind) << name;
  }
  EXPECT_EQ(detect_chat_template(""), ChatTemplateKind::kChatML);
  EXPECT_STREQ(chat_template_kind_name(ChatTemplateKind::kLlama3), "llama3");
}

TEST(ChatTemplate, RejectsWhatItCannotRender) {
  // Llama 3.1+: a date and tools preamble in the system turn.
  EXPECT_THROW(
      detect_chat_template("{{- bos_token }}{{- \"<|start_header_id|>system<|end_header_id|>"
                           "\\n\\n\" }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}"),
      Error);
  // Mistral's [INST] without Llama 2's <<SYS>>.
  EXPECT_THROW(detect_chat_template("{{ bos_token }}{% for m in messages %}{{ '[INST] ' + "
                                    "m['content'] + ' [/INST]' }}{% endfor %}"),
               Error);
  EXPECT_THROW(detect_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}"),
               Error);
  try {
    detect_chat_template("### Human: {{ x }}");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unrecognized chat template"), std::string::npos);
  }
}

TEST(ChatTemplate, ReadsTheDefaultSystemMessage) {
  EXPECT_EQ(ChatTemplate::from_source(kSmollm2Template).default_system_message,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(ChatTemplate::from_source(kQwenTemplate).default_system_message,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  // A plain ChatML template has none.
  const char* plain =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  EXPECT_EQ(ChatTemplate::from_source(plain).default_system_message, "");
  EXPECT_EQ(apply_chat_template(ChatTemplate::from_source(plain), {{"user", "Hi"}}, true, ""),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::kChatML, {{"user", "Hi"}}, false, "", ""),
            "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::kChatML, {}, true, "", ""),
            "<|im_start|>assistant\n");
}

// The kind-based overload reads the default system message from the source it is given.
TEST(ChatTemplate, KindOverloadReadsTheSource) {
  const std::vector<ChatMessage> messages = {{"user", "Hi there!"}};
  const ChatTemplateKind kind = detect_chat_template(kSmollm2Template);
  EXPECT_EQ(apply_chat_template(kind, messages, true, kSmollm2Template, "<|im_start|>"),
            apply_chat_template(ChatTemplate::from_source(kSmollm2Template), messages, true,
                                "<|im_start|>"));
  EXPECT_NE(apply_chat_template(kind, messages, true, kSmollm2Template, "<|im_start|>"),
            apply_chat_template(kind, messages, true, "", "<|im_start|>"));
}

TEST(ChatTemplate, RendersLikeJinja) {
  int checked = 0;
  for (const Expected& e : expected_renders()) {
    const TemplateInfo& info = templates().at(e.template_name);
    const std::vector<ChatMessage>& messages = conversations().at(e.conversation);
    const ChatTemplate tmpl = ChatTemplate::from_source(info.source);
    const std::string where = std::string(e.template_name) + "/" + e.conversation +
                              (e.add_generation_prompt ? "/gen" : "");
    if (std::string(e.text) == "!") {
      EXPECT_THROW(apply_chat_template(tmpl, messages, e.add_generation_prompt, info.bos, info.eos),
                   Error)
          << where;
    } else {
      EXPECT_EQ(apply_chat_template(tmpl, messages, e.add_generation_prompt, info.bos, info.eos),
                e.text)
          << where;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 48);
}

TEST(ChatTemplate, RaisesWhereTheTemplateRaises) {
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  EXPECT_THROW(apply_chat_template(ChatTemplateKind::kLlama2, two_users, false, "", "<s>", "</s>"),
               Error);
  EXPECT_THROW(apply_chat_template(ChatTemplateKind::kGemma, two_users, false, "", "<bos>"), Error);
  EXPECT_THROW(
      apply_chat_template(ChatTemplateKind::kGemma, {{"assistant", "x"}}, false, "", "<bos>"),
      Error);
  // ChatML and Llama 3 accept any order of roles.
  EXPECT_NO_THROW(apply_chat_template(ChatTemplateKind::kChatML, two_users, false, "", ""));
  EXPECT_NO_THROW(apply_chat_template(ChatTemplateKind::kLlama3, two_users, false, "", ""));
}

// Trimming follows Python's str.strip(): Unicode spaces too, but not other characters.
TEST(ChatTemplate, TrimsLikePython) {
  const std::vector<ChatMessage> messages = {{"user", "\xE3\x80\x80\t x\xC2\xA0y \n\xC2\xA0"}};
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::kLlama3, messages, false, "", ""),
            "<|start_header_id|>user<|end_header_id|>\n\nx\xC2\xA0y<|eot_id|>");
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::kLlama3, {{"user", " \n "}}, false, "", ""),
            "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

// The tokenizer renders with the model's own template and token texts.
TEST(ChatTemplate, TokenizerUsesTheModelTemplate) {
  const auto gguf = GgufFile::open(test::fixture_dir() + "/ggml-vocab-phi-3.gguf");
  const auto tok = Tokenizer::from_gguf(*gguf);
  const std::string prompt = tok->apply_chat_template({{"user", "Hi"}}, true);
  EXPECT_EQ(prompt, "<s><|user|>\nHi<|end|>\n<|assistant|>\n");
  const std::vector<int32_t> ids = tok->encode(prompt, /*add_special=*/false,
                                               /*parse_special=*/true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1);      // <s>
  EXPECT_EQ(ids[1], 32010);  // <|user|>
  EXPECT_EQ(ids.back(), tok->encode("\n", false, false).back());

  // A model without a template gets ChatML; one with an unknown template loads but cannot chat.
  const auto spm =
      Tokenizer::from_gguf(*GgufFile::open(test::fixture_dir() + "/ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(spm->chat_template(), "");
  EXPECT_EQ(spm->apply_chat_template({{"user", "Hi"}}, false), "<|im_start|>user\nHi<|im_end|>\n");
  test::GgufWriter w;
  w.kv_str("tokenizer.ggml.model", "llama");
  w.kv_str_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  w.kv_str("tokenizer.chat_template", "{{ messages | tojson }}");
  const auto odd =
      Tokenizer::from_gguf(*GgufFile::open(test::write_temp_file("odd.gguf", w.finish())));
  EXPECT_EQ(odd->chat_template(), "{{ messages | tojson }}");
  EXPECT_THROW(odd->apply_chat_template({{"user", "Hi"}}, true), Error);
}

TEST(ChatTemplate, SmolLM2ModelFile) {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) GTEST_SKIP() << "SmolLM2 model not found at " << path;
  const auto tok = Tokenizer::from_gguf(*GgufFile::open(path));
  EXPECT_EQ(tok->chat_template(), kSmollm2Template);
  EXPECT_EQ(tok->apply_chat_template({{"user", "Hi there!"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace specdec
