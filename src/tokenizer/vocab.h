// The vocabulary shared by the tokenizer algorithms: token texts, scores, types and the
// text -> id lookup. Built once by Tokenizer::from_gguf and immutable afterwards.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace specdec {

// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

const char* token_type_name(TokenType type);

struct Vocab {
  Vocab() = default;
  Vocab(const Vocab&) = delete;  // text_to_id views `tokens`: a copy would dangle
  Vocab& operator=(const Vocab&) = delete;
  Vocab(Vocab&&) = default;  // moving the vectors keeps their buffers, so the views stay valid
  Vocab& operator=(Vocab&&) = default;

  std::vector<std::string> tokens;  // [n_vocab] token text as stored in the file
  std::vector<float> scores;        // [n_vocab] SentencePiece scores (0 when absent)
  std::vector<TokenType> types;     // [n_vocab]
  // Text -> id. Keys view `tokens`, which never changes after construction. When two ids share
  // a text the later one wins (as in llama.cpp).
  std::unordered_map<std::string_view, int32_t> text_to_id;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  // The id of a token text, or -1.
  int32_t find(std::string_view text) const {
    const auto it = text_to_id.find(text);
    return it == text_to_id.end() ? -1 : it->second;
  }
  // Fills text_to_id from tokens; call once after `tokens` has its final size.
  void build_index();
};

}  // namespace specdec
