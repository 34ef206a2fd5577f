#include "tokenizer/spm.h"

#include <queue>

#include <fmt/format.h>

#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec {
namespace {

// One piece of the text being merged: a contiguous byte range, in a doubly linked list.
struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t begin;  // byte offset in the text
  uint32_t size;   // bytes; 0 once merged into its left neighbor
};

// A candidate merge of symbols `left` and `left`'s right neighbor `right`.
struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // bytes of the merged piece when it was queued (stale check)
};

// Highest score first; on equal scores the leftmost pair first (llama.cpp's comparator).
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

std::string spm_escape_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (const char c : text) {
    if (c == ' ') {
      out.append("\xE2\x96\x81");  // U+2581
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string spm_unescape_whitespace(std::string_view text) {
  static constexpr std::string_view kEscape = "\xE2\x96\x81";
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit = text.find(kEscape); hit != std::string_view::npos;
       hit = text.find(kEscape, pos)) {
    out.append(text.substr(pos, hit - pos));
    out.push_back(' ');
    pos = hit + kEscape.size();
  }
  out.append(text.substr(pos));
  return out;
}

SpmModel::SpmModel(const Vocab& vocab, int32_t unk_id) : vocab_(vocab), unk_id_(unk_id) {
  for (int b = 0; b < 256; ++b) {
    byte_tokens_[b] = vocab_.find(fmt::format("<0x{:02X}>", b));
  }
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  // [n_symbols] the UTF-8 characters of the text (invalid bytes cut as llama.cpp does).
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t len =
        std::min(text.size() - offset, utf8_sequence_length(static_cast<uint8_t>(text[offset])));
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, offset + len == text.size() ? -1 : index + 1,
                       static_cast<uint32_t>(offset), static_cast<uint32_t>(len)});
    offset += len;
  }

  std::vector<Bigram> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue(BigramLess{},
                                                                     std::move(storage));
  auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].size + symbols[right].size;
    const int32_t id = vocab_.find(text.substr(symbols[left].begin, size));
    if (id < 0) return;
    queue.push({vocab_.scores[id], left, right, size});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_add_bigram(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale: one side was merged away, or grew, since this pair was queued.
    if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  // Every merged piece is a vocabulary token (merges only form tokens); a piece left as a
  // single character that is not a token falls back to its bytes.
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string_view piece = text.substr(s.begin, s.size);
    const int32_t id = vocab_.find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    bool all_bytes = true;
    for (const char c : piece) all_bytes = all_bytes && byte_tokens_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (const char c : piece) out->push_back(byte_tokens_[static_cast<uint8_t>(c)]);
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);  // no byte fallback: one unknown token per piece, as SentencePiece
    } else {
      throw Error(
          fmt::format("SentencePiece tokenizer: cannot encode the piece '{}': it is not in "
                      "the vocabulary, which has no <0xXX> byte tokens and no unknown "
                      "token",
                      sanitize_utf8(piece)));
    }
  }
}

}  // namespace specdec
