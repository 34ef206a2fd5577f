#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec {
namespace {

// Token texts that end generation (llama.cpp's list in llama_vocab::impl::load).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};

// A token id from metadata: absent, negative or 0xFFFFFFFF (uint32 -1) mean "none".
int32_t read_token_id(const GgufFile& gguf, const char* key, int32_t fallback, int32_t n_vocab) {
  const std::optional<int64_t> value = gguf.get_int(key);
  if (!value) return fallback;
  if (*value < 0 || *value == 0xFFFFFFFFll) return -1;
  if (*value >= n_vocab) {
    throw Error(fmt::format("{}: {} = {} is outside the vocabulary of {} tokens", gguf.path(), key,
                            *value, n_vocab));
  }
  return static_cast<int32_t>(*value);
}

bool is_special_type(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUnknown;
}

// The bytes a token stands for when special tokens are not rendered (see tokenizer.h).
std::string token_piece(const std::string& text, TokenType type, bool spm, const std::string& path,
                        size_t id) {
  switch (type) {
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUnused:
      return "";
    case TokenType::kUserDefined:
      return text;
    case TokenType::kByte: {
      unsigned value = 0;
      if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>' ||
          std::sscanf(text.c_str() + 3, "%2x", &value) != 1) {
        throw Error(fmt::format("{}: token {} '{}' has type byte but is not of the form <0xAB>",
                                path, id, text));
      }
      return std::string(1, static_cast<char>(value));
    }
    case TokenType::kNormal:
    case TokenType::kUndefined:
      break;
  }
  return spm ? spm_unescape_whitespace(text) : byte_level_decode(text);
}

}  // namespace

const char* token_type_name(TokenType type) {
  switch (type) {
    case TokenType::kUndefined:
      return "undefined";
    case TokenType::kNormal:
      return "normal";
    case TokenType::kUnknown:
      return "unknown";
    case TokenType::kControl:
      return "control";
    case TokenType::kUserDefined:
      return "user-defined";
    case TokenType::kUnused:
      return "unused";
    case TokenType::kByte:
      return "byte";
  }
  return "?";
}

void Vocab::build_index() {
  text_to_id.clear();
  text_to_id.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    text_to_id[std::string_view(tokens[i])] = static_cast<int32_t>(i);
  }
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  const std::string& path = gguf.path();

  const std::optional<std::string> model = gguf.get_string("tokenizer.ggml.model");
  if (!model) throw Error(fmt::format("{}: no tokenizer.ggml.model in the metadata", path));
  tok->model_name_ = *model;
  if (*model == "llama") {
    tok->kind_ = TokenizerKind::kSpm;
  } else if (*model == "gpt2") {
    tok->kind_ = TokenizerKind::kBpe;
  } else {
    throw Error(
        fmt::format("{}: unsupported tokenizer.ggml.model '{}' (supported: 'llama' "
                    "SentencePiece-style BPE, 'gpt2' byte-level BPE)",
                    path, *model));
  }

  const std::vector<std::string>* tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->empty()) {
    throw Error(fmt::format("{}: no tokenizer.ggml.tokens in the metadata", path));
  }
  const size_t n = tokens->size();
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw Error(fmt::format("{}: tokenizer.ggml.tokens has {} entries, too many", path, n));
  }
  Vocab& vocab = tok->vocab_;
  vocab.tokens = *tokens;
  vocab.scores.assign(n, 0.0f);
  vocab.types.assign(n, TokenType::kNormal);
  if (const std::vector<double>* scores = gguf.get_float_array("tokenizer.ggml.scores")) {
    if (scores->size() != n) {
      throw Error(fmt::format("{}: tokenizer.ggml.scores has {} entries for {} tokens", path,
                              scores->size(), n));
    }
    for (size_t i = 0; i < n; ++i) vocab.scores[i] = static_cast<float>((*scores)[i]);
  }
  if (const std::vector<int64_t>* types = gguf.get_int_array("tokenizer.ggml.token_type")) {
    if (types->size() != n) {
      throw Error(fmt::format("{}: tokenizer.ggml.token_type has {} entries for {} tokens", path,
                              types->size(), n));
    }
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (*types)[i];
      if (t < 0 || t > 6) {
        throw Error(fmt::format("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)",
                                path, i, t));
      }
      vocab.types[i] = static_cast<TokenType>(t);
    }
  }
  vocab.build_index();
  const auto n_vocab = static_cast<int32_t>(n);

  const bool spm = tok->kind_ == TokenizerKind::kSpm;
  // Defaults as llama.cpp: SPM models have <unk>=0, <s>=1, </s>=2 and add BOS.
  tok->bos_id_ = read_token_id(gguf, "tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1, n_vocab);
  tok->eos_id_ = read_token_id(gguf, "tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1, n_vocab);
  tok->unk_id_ = read_token_id(gguf, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n_vocab);
  tok->pad_id_ = read_token_id(gguf, "tokenizer.ggml.padding_token_id", -1, n_vocab);
  tok->eot_id_ = read_token_id(gguf, "tokenizer.ggml.eot_token_id", -1, n_vocab);
  tok->eom_id_ = read_token_id(gguf, "tokenizer.ggml.eom_token_id", -1, n_vocab);

  if (!spm) {
    const std::optional<std::string> pre = gguf.get_string("tokenizer.ggml.pre");
    tok->pre_name_ = pre.value_or("default");
    tok->pre_tokenizer_ = std::make_unique<PreTokenizer>(tok->pre_name_);
  }
  // llama3-style pre-tokenizers imply BOS; other byte-level BPE models do not by default.
  const bool default_add_bos = spm || (tok->pre_tokenizer_ && tok->pre_tokenizer_->ignore_merges());
  tok->add_bos_ = gguf.get_bool("tokenizer.ggml.add_bos_token").value_or(default_add_bos);
  tok->add_eos_ = gguf.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  tok->add_space_prefix_ = gguf.get_bool("tokenizer.ggml.add_space_prefix").value_or(spm);
  if (tok->add_bos_ && tok->bos_id_ < 0) {
    throw Error(
        fmt::format("{}: tokenizer.ggml.add_bos_token is set but there is no BOS token", path));
  }
  if (tok->add_eos_ && tok->eos_id_ < 0) {
    throw Error(
        fmt::format("{}: tokenizer.ggml.add_eos_token is set but there is no EOS token", path));
  }

  if (spm) {
    tok->spm_ = std::make_unique<SpmModel>(vocab, tok->unk_id_);
  } else {
    const std::vector<std::string>* merges = gguf.get_string_array("tokenizer.ggml.merges");
    if (merges == nullptr) {
      throw Error(fmt::format("{}: byte-level BPE needs tokenizer.ggml.merges", path));
    }
    tok->bpe_ = std::make_unique<BpeModel>(vocab, *merges, tok->pre_tokenizer_->ignore_merges());
  }

  // Pieces, decoded once.
  tok->pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    tok->pieces_[i] = token_piece(vocab.tokens[i], vocab.types[i], spm, path, i);
  }

  tok->init_special_tokens();

  tok->chat_template_ = gguf.get_string("tokenizer.chat_template").value_or("");
  try {
    tok->parsed_template_ = ChatTemplate::from_source(tok->chat_template_);
  } catch (const Error& e) {
    tok->template_error_ = e.what();
  }
  return tok;
}

void Tokenizer::init_special_tokens() {
  const int32_t n = n_vocab();
  is_eog_.assign(static_cast<size_t>(n), 0);
  auto add_eog = [&](int32_t id) {
    if (id >= 0 && !is_eog_[static_cast<size_t>(id)]) {
      is_eog_[static_cast<size_t>(id)] = 1;
      eog_ids_.push_back(id);
    }
  };
  add_eog(eos_id_);
  add_eog(eot_id_);
  add_eog(eom_id_);
  for (const char* text : kEogTexts) {
    const int32_t id = vocab_.find(text);
    if (id >= 0) add_eog(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());

  special_by_first_byte_.assign(256, {});
  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = vocab_.types[static_cast<size_t>(id)];
    const std::string& text = vocab_.tokens[static_cast<size_t>(id)];
    if (text.empty()) continue;
    if (type != TokenType::kControl && type != TokenType::kUserDefined &&
        type != TokenType::kUnknown) {
      continue;
    }
    if (vocab_.find(text) != id) continue;  // a shadowed duplicate
    special_by_first_byte_[static_cast<uint8_t>(text[0])].push_back(id);
  }
  for (auto& ids : special_by_first_byte_) {
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return vocab_.tokens[static_cast<size_t>(a)].size() >
             vocab_.tokens[static_cast<size_t>(b)].size();
    });
  }
}

size_t Tokenizer::match_special(std::string_view text, size_t pos, bool parse_special,
                                int32_t* id) const {
  const auto& candidates = special_by_first_byte_[static_cast<uint8_t>(text[pos])];
  for (const int32_t candidate : candidates) {
    if (!parse_special && vocab_.types[static_cast<size_t>(candidate)] != TokenType::kUserDefined) {
      continue;
    }
    const std::string& t = vocab_.tokens[static_cast<size_t>(candidate)];
    if (text.size() - pos >= t.size() && std::memcmp(text.data() + pos, t.data(), t.size()) == 0) {
      *id = candidate;
      return t.size();
    }
  }
  return 0;
}

void Tokenizer::encode_fragment(std::string_view text, bool after_special,
                                std::vector<int32_t>* out) const {
  if (kind_ == TokenizerKind::kSpm) {
    std::string escaped;
    if (add_space_prefix_ && after_special) {
      escaped = spm_escape_whitespace(std::string(" ").append(text));
    } else {
      escaped = spm_escape_whitespace(text);
    }
    spm_->encode(escaped, out);
    return;
  }
  std::vector<std::string_view> words;
  pre_tokenizer_->split(text, &words);
  for (const std::string_view word : words) bpe_->encode_word(word, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) out.push_back(bos_id_);
  bool after_special = true;  // the first fragment counts as following a special token
  size_t fragment_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = -1;
    const size_t len = match_special(text, pos, parse_special, &id);
    if (len == 0) {
      ++pos;
      continue;
    }
    if (pos > fragment_begin) {
      encode_fragment(text.substr(fragment_begin, pos - fragment_begin), after_special, &out);
    }
    out.push_back(id);
    after_special = true;
    pos += len;
    fragment_begin = pos;
  }
  if (fragment_begin < text.size()) {
    encode_fragment(text.substr(fragment_begin), after_special, &out);
  }
  if (add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error(fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab()));
  }
}

const std::string& Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  check_id(id);
  const auto i = static_cast<size_t>(id);
  if (render_special && is_special_type(vocab_.types[i])) return vocab_.tokens[i];
  return pieces_[i];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, DecodeOptions options) const {
  std::string out;
  bool strip_space = options.text_start && kind_ == TokenizerKind::kSpm && add_space_prefix_;
  for (const int32_t id : ids) {
    const std::string& piece = token_to_piece(id, options.render_special);
    if (strip_space && !piece.empty()) {
      strip_space = false;
      if (piece[0] == ' ') {
        out.append(piece, 1);
        continue;
      }
    }
    out.append(piece);
  }
  return out;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return vocab_.tokens[static_cast<size_t>(id)];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return vocab_.types[static_cast<size_t>(id)];
}

float Tokenizer::token_score(int32_t id) const {
  check_id(id);
  return vocab_.scores[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const int32_t id = vocab_.find(text);
  if (id < 0) return std::nullopt;
  return id;
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  if (!parsed_template_) {
    throw Error(fmt::format("the model's chat template cannot be used: {}", template_error_));
  }
  const std::string bos_text = bos_id_ >= 0 ? vocab_.tokens[static_cast<size_t>(bos_id_)] : "";
  const std::string eos_text = eos_id_ >= 0 ? vocab_.tokens[static_cast<size_t>(eos_id_)] : "";
  return specdec::apply_chat_template(*parsed_template_, messages, add_generation_prompt, bos_text,
                                      eos_text);
}

}  // namespace specdec
