// Byte-level BPE (GGUF tokenizer.ggml.model = "gpt2"): each pre-tokenized word is cut into its
// bytes (each byte standing for its GPT-2 code point, see unicode.h), then the adjacent pair
// with the lowest merge rank (position in tokenizer.ggml.merges) is merged until none applies
// (ties: the leftmost pair), as llama.cpp's llm_tokenizer_bpe and HF tokenizers do.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/vocab.h"

namespace specdec {

class BpeModel {
 public:
  // `merges` are "left right" strings in rank order. Throws specdec::Error for a malformed
  // merge line. Merges whose parts or result are not vocabulary tokens can never apply to
  // token sequences and are skipped (counted in skipped_merges()).
  BpeModel(const Vocab& vocab, const std::vector<std::string>& merges, bool ignore_merges);

  // Appends the ids of one pre-tokenized word (raw bytes, not yet byte-level mapped). Bytes
  // whose code point is not a token are dropped before merging, as HF tokenizers does without
  // an unknown token (has_byte() tells which).
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  bool has_byte(uint8_t byte) const { return byte_tokens_[byte] >= 0; }
  int32_t num_merges() const { return static_cast<int32_t>(merges_.size()); }
  int32_t skipped_merges() const { return skipped_merges_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // token id of the merged text
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  const Vocab& vocab_;
  bool ignore_merges_;                    // a word that is itself a token is emitted whole (llama3)
  std::array<int32_t, 256> byte_tokens_;  // byte -> id of its mapped code point, or -1
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> merge
  int32_t skipped_merges_ = 0;
};

}  // namespace specdec
