#include "tokenizer/detokenizer.h"

#include "tokenizer/unicode.h"

namespace specdec {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer),
      options_(options),
      strip_space_(options.text_start && tokenizer.kind() == TokenizerKind::kSpm &&
                   tokenizer.add_space_prefix()) {}

std::string IncrementalDetokenizer::push(int32_t token) {
  const std::string& piece = tokenizer_.token_to_piece(token, options_.render_special);
  std::string_view bytes = piece;
  if (strip_space_ && !bytes.empty()) {
    strip_space_ = false;
    if (bytes[0] == ' ') bytes.remove_prefix(1);
  }
  if (bytes.empty()) return {};
  std::string out;
  if (pending_.empty()) {
    const size_t used = sanitize_utf8_prefix(bytes, /*final=*/false, &out);
    pending_.assign(bytes.substr(used));
  } else {
    pending_.append(bytes);
    const size_t used = sanitize_utf8_prefix(pending_, /*final=*/false, &out);
    pending_.erase(0, used);
  }
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  sanitize_utf8_prefix(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace specdec
