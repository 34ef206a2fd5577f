#include "tokenizer/bpe.h"

#include <queue>

#include <fmt/format.h>

#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec {
namespace {

struct Symbol {
  int32_t id;  // current token id, -1 for a byte with no token
  int32_t prev;
  int32_t next;
  bool alive;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t left_id;  // ids when queued (stale check)
  int32_t right_id;
  int32_t result;  // id of the merged token
};

// Lowest rank first; on equal ranks the leftmost pair first.
struct BigramGreater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

BpeModel::BpeModel(const Vocab& vocab, const std::vector<std::string>& merges, bool ignore_merges)
    : vocab_(vocab), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) byte_tokens_[b] = vocab_.find(byte_to_unicode(uint8_t(b)));
  merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& line = merges[rank];
    // The separator is the first space after the first character: byte-level texts never hold
    // a raw space, but a left part could in other vocabularies, so start the search at 1.
    const size_t sep = line.find(' ', 1);
    if (sep == std::string::npos || sep + 1 >= line.size()) {
      throw Error(fmt::format("tokenizer.ggml.merges[{}] = '{}' is not of the form 'left right'",
                              rank, line));
    }
    const std::string_view left(line.data(), sep);
    const std::string_view right(line.data() + sep + 1, line.size() - sep - 1);
    merged.assign(left);
    merged.append(right);
    const int32_t left_id = vocab_.find(left);
    const int32_t right_id = vocab_.find(right);
    const int32_t result = vocab_.find(merged);
    if (left_id < 0 || right_id < 0 || result < 0) {
      ++skipped_merges_;
      continue;
    }
    // A repeated pair keeps its first (lowest) rank.
    merges_.emplace(pair_key(left_id, right_id), Merge{static_cast<int32_t>(rank), result});
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string mapped;
    for (const char c : word) mapped += byte_to_unicode(static_cast<uint8_t>(c));
    const int32_t id = vocab_.find(mapped);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  // [n] one symbol per byte of the word. A byte with no token (some vocabularies lack bytes
  // that never occur in UTF-8 text, like 0xFF) is dropped before merging, as HF tokenizers does
  // without an unknown token, so its neighbors can merge.
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (const char c : word) {
    const int32_t id = byte_tokens_[static_cast<uint8_t>(c)];
    if (id < 0) continue;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  }
  if (symbols.empty()) return;
  const auto n = static_cast<int32_t>(symbols.size());
  symbols.back().next = -1;
  if (n == 1) {
    out->push_back(symbols[0].id);
    return;
  }
  std::vector<Bigram> storage;
  storage.reserve(n);
  std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue(BigramGreater{},
                                                                        std::move(storage));
  auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[right].id;
    if (left_id < 0 || right_id < 0) return;
    const auto it = merges_.find(pair_key(left_id, right_id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, left_id, right_id, it->second.result});
  };
  for (int32_t i = 1; i < n; ++i) try_add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (!left.alive || !right.alive || left.next != bigram.right || left.id != bigram.left_id ||
        right.id != bigram.right_id) {
      continue;  // stale: one side changed since this pair was queued
    }
    left.id = bigram.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace specdec
