// UTF-8 helpers for the tokenizers and the detokenizer: sequence lengths, encoding, the
// GPT-2 byte <-> unicode mapping of byte-level BPE, and sanitizing (streaming or not) of byte
// strings into valid UTF-8, with U+FFFD for every maximal invalid subpart (the Unicode
// "substitution of maximal subparts" practice, as Python's errors="replace" does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specdec {

// Length of the UTF-8 sequence that `lead` starts, from its high bits alone: 1 for ASCII and
// for bytes that cannot start a sequence (continuation bytes), else 2..4. Used to cut text into
// "characters" the way llama.cpp does, so invalid UTF-8 is cut into pieces too.
inline size_t utf8_sequence_length(uint8_t lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

// Appends the UTF-8 encoding of `cp` (cp <= 0x10FFFF) to `out`.
void append_utf8(uint32_t cp, std::string* out);

// GPT-2 byte-level BPE maps every byte to a printable code point ('!'..'~', '¡'..'¬', '®'..'ÿ'
// map to themselves, the others to U+0100 upwards). Returns that code point's UTF-8 text.
const std::string& byte_to_unicode(uint8_t byte);
// The inverse: the byte a code point stands for, or -1 when `cp` is not in the mapping.
int unicode_to_byte(uint32_t cp);
// Undoes the byte-level mapping of a token's text: every mapped code point becomes its byte;
// code points outside the mapping (or invalid UTF-8) are copied through unchanged.
std::string byte_level_decode(std::string_view token_text);

// Decodes one code point at `s[*pos]`, advancing *pos. Returns false (and advances by one byte)
// for an invalid or truncated sequence.
bool next_code_point(std::string_view s, size_t* pos, uint32_t* cp);

// Sanitizes bytes into valid UTF-8, appending to `out`. Every maximal invalid subpart becomes
// U+FFFD. When `final` is false, a trailing sequence that is incomplete but could still become
// valid is left unconsumed. Returns the number of bytes of `in` consumed.
size_t sanitize_utf8_prefix(std::string_view in, bool final, std::string* out);

// The whole string sanitized (final = true).
std::string sanitize_utf8(std::string_view in);

bool is_valid_utf8(std::string_view s);

}  // namespace specdec
