// Incremental detokenizer: turns a stream of token ids into a stream of valid UTF-8 text.
// Bytes of a character split across tokens (byte tokens of an emoji, say) are held back until
// the character is complete; invalid bytes become U+FFFD (one per maximal invalid subpart, as
// sanitize_utf8 does), and flush() emits a held-back incomplete tail as U+FFFD. So for any ids:
//   push(ids[0]) + ... + push(ids[n-1]) + flush() == sanitize_utf8(tokenizer.decode(ids, opts))
// and every returned string is valid UTF-8 on its own.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace specdec {

class IncrementalDetokenizer {
 public:
  // `options` as for Tokenizer::decode: text_start = true drops SPM's prefix space at the start
  // (a whole text); use text_start = false to stream a continuation (tokens after a prompt).
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  // The text that `token` completes (possibly empty). Throws specdec::Error for an id outside
  // the vocabulary.
  std::string push(int32_t token);
  // Whatever is held back, as U+FFFD. The detokenizer can be used again afterwards, as if the
  // text continued (the prefix space is not dropped again).
  std::string flush();

  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  bool strip_space_;     // still at the start of an SPM text with a prefix space to drop
  std::string pending_;  // at most 3 bytes: an incomplete but possibly valid UTF-8 sequence
};

}  // namespace specdec
