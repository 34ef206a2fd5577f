// SentencePiece-style BPE (GGUF tokenizer.ggml.model = "llama"), as llama.cpp's
// llm_tokenizer_spm: start from the UTF-8 characters of the (already whitespace-escaped) text,
// repeatedly merge the adjacent pair whose concatenation is a vocabulary token with the highest
// score (ties: the leftmost pair), then emit each final piece's id, falling back to <0xXX> byte
// tokens for pieces that are not in the vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace specdec {

class SpmModel {
 public:
  // `unk_id` (or -1) is used for a byte with no <0xXX> token.
  SpmModel(const Vocab& vocab, int32_t unk_id);

  // Appends the ids of `text` to `out`. `text` must already have spaces replaced by U+2581 and
  // the optional leading U+2581 added.
  void encode(std::string_view text, std::vector<int32_t>* out) const;

  // Id of the <0xXX> token of a byte, or -1.
  int32_t byte_token(uint8_t byte) const { return byte_tokens_[byte]; }

 private:
  const Vocab& vocab_;
  int32_t unk_id_;
  std::array<int32_t, 256> byte_tokens_;
};

// Replaces every ' ' with U+2581 ("▁"), the SentencePiece whitespace escape.
std::string spm_escape_whitespace(std::string_view text);
// The inverse: every U+2581 becomes ' '.
std::string spm_unescape_whitespace(std::string_view text);

}  // namespace specdec
