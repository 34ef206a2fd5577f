// Incremental detokenizer tests: streamed text equals decode() (sanitized) for random token
// sequences on every vocabulary we have, every streamed piece is valid UTF-8, characters split
// across byte tokens are held back, and the SPM prefix space is handled as decode() does. Also
// the UTF-8 sanitizing it builds on.
#include "tokenizer/detokenizer.h"

#include <random>

#include <gtest/gtest.h>

#include "common/test_paths.h"
#include "model/gguf.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec {
namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";

std::unique_ptr<Tokenizer> load(const std::string& path) {
  return Tokenizer::from_gguf(*GgufFile::open(path));
}

std::vector<std::string> vocab_paths() {
  std::vector<std::string> paths;
  for (const char* name : {"gpt-2", "starcoder", "llama-spm", "phi-3"}) {
    paths.push_back(test::fixture_dir() + "/ggml-vocab-" + name + ".gguf");
  }
  paths.push_back(test::tiny_model("stories260K.gguf"));
  if (test::file_exists(test::default_model_path())) paths.push_back(test::default_model_path());
  return paths;
}

// Streams `ids` and checks every piece and the total against decode().
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, DecodeOptions options,
                  const std::string& where) {
  IncrementalDetokenizer detok(tok, options);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string piece = detok.push(id);
    ASSERT_TRUE(is_valid_utf8(piece)) << where << ": token " << id;
    EXPECT_LE(detok.pending_bytes(), 3u) << where;
    streamed += piece;
  }
  const std::string tail = detok.flush();
  ASSERT_TRUE(is_valid_utf8(tail)) << where;
  streamed += tail;
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(streamed, sanitize_utf8(tok.decode(ids, options))) << where;
}

TEST(IncrementalDetokenizer, RandomTokenSequencesMatchDecode) {
  std::mt19937 rng(42);
  for (const std::string& path : vocab_paths()) {
    const auto tok = load(path);
    const auto n_vocab = static_cast<uint32_t>(tok->n_vocab());
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids(1 + rng() % 24);
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % n_vocab);
      // Byte-heavy sequences: the first 300 ids hold the byte tokens of SPM vocabularies and the
      // single-byte tokens of byte-level ones.
      if (trial % 2 == 1) {
        for (int32_t& id : ids) id = static_cast<int32_t>(rng() % std::min(300u, n_vocab));
      }
      const DecodeOptions options{.text_start = trial % 3 != 0, .render_special = trial % 5 == 0};
      check_stream(*tok, ids, options, path + " trial " + std::to_string(trial));
    }
  }
}

TEST(IncrementalDetokenizer, TextsWithMultiByteCharactersRoundTrip) {
  const std::vector<std::string> texts = {
      "Hello world",
      " leading space",
      "emoji 🦙🚀👩‍👩‍👧 and ✅, CJK 日本語のテキスト, Greek "
      "Ελληνικά",
      "\n\n tabs\tand 🎉 at the end 🦙",
      "ied 4 ½ months",
  };
  for (const std::string& path : vocab_paths()) {
    const auto tok = load(path);
    for (const std::string& text : texts) {
      const std::vector<int32_t> ids = tok->encode(text, /*add_special=*/true, false);
      check_stream(*tok, ids, {}, path + ": " + text);
      // Every vocabulary here encodes these texts losslessly, so the stream is the text itself.
      IncrementalDetokenizer detok(*tok);
      std::string streamed;
      for (const int32_t id : ids) streamed += detok.push(id);
      streamed += detok.flush();
      EXPECT_EQ(streamed, text) << path;
    }
  }
}

// An emoji that SPM encodes as four byte tokens appears whole with the fourth.
TEST(IncrementalDetokenizer, HoldsBackSplitCharacters) {
  const auto tok = load(test::fixture_dir() + "/ggml-vocab-llama-spm.gguf");
  const std::vector<int32_t> ids = tok->encode("🦙", false, false);
  // "▁" then <0xF0> <0x9F> <0xA6> <0x99>.
  ASSERT_EQ(ids.size(), 5u);
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(tok->token_type(ids[i]), TokenType::kByte);
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.push(ids[0]), "");  // the prefix space, dropped at the start of a text
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.pending_bytes(), 1u);
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.push(ids[3]), "");
  EXPECT_EQ(detok.pending_bytes(), 3u);
  EXPECT_EQ(detok.push(ids[4]), "🦙");
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(detok.flush(), "");

  // As a continuation the space is kept.
  IncrementalDetokenizer cont(*tok, {.text_start = false});
  EXPECT_EQ(cont.push(ids[0]), " ");

  // An incomplete character followed by other text: U+FFFD, then the text.
  const int32_t f0 = ids[1];
  const int32_t hello = *tok->find_token("\xE2\x96\x81Hello");
  IncrementalDetokenizer broken(*tok, {.text_start = false});
  EXPECT_EQ(broken.push(f0), "");
  EXPECT_EQ(broken.push(hello), std::string(kReplacement) + " Hello");
  // A lone continuation byte is invalid at once.
  EXPECT_EQ(broken.push(ids[3]), kReplacement);
  // Flushing an incomplete character.
  EXPECT_EQ(broken.push(f0), "");
  EXPECT_EQ(broken.push(ids[2]), "");
  EXPECT_EQ(broken.flush(), kReplacement);
  EXPECT_EQ(broken.push(hello), " Hello");  // usable after flush
}

// Byte-level BPE splits a rare emoji over tokens that each hold part of its bytes.
TEST(IncrementalDetokenizer, ByteLevelSplitEmoji) {
  const auto tok = load(test::fixture_dir() + "/ggml-vocab-gpt-2.gguf");
  const std::string text = "🦙!";
  const std::vector<int32_t> ids = tok->encode(text, false, false);
  ASSERT_GE(ids.size(), 2u);
  IncrementalDetokenizer detok(*tok);
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(detok.push(id));
  // Nothing comes out before the emoji is complete, then the whole emoji at once.
  size_t first_non_empty = 0;
  while (first_non_empty < pieces.size() && pieces[first_non_empty].empty()) ++first_non_empty;
  ASSERT_LT(first_non_empty, pieces.size());
  EXPECT_GT(first_non_empty, 0u) << "the emoji should span several tokens";
  EXPECT_EQ(pieces[first_non_empty].substr(0, 4), "🦙");
  std::string all;
  for (const auto& p : pieces) all += p;
  EXPECT_EQ(all + detok.flush(), text);
}

TEST(IncrementalDetokenizer, SpmPrefixSpaceLikeDecode) {
  const auto tok = load(test::tiny_model("stories260K.gguf"));
  const std::vector<int32_t> ids = tok->encode("Once upon a time", true, false);
  IncrementalDetokenizer detok(*tok);
  std::string streamed;
  for (const int32_t id : ids) streamed += detok.push(id);
  EXPECT_EQ(streamed + detok.flush(), "Once upon a time");
  EXPECT_THROW(detok.push(tok->n_vocab()), Error);
}

TEST(Utf8, SanitizesMaximalSubparts) {
  // The example of the Unicode Standard, chapter 3 (U+FFFD substitution of maximal subparts).
  EXPECT_EQ(sanitize_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "c\xEF\xBF\xBD\xEF\xBF\xBD"
            "d");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), std::string(kReplacement) + kReplacement + kReplacement);
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), std::string(kReplacement) + kReplacement);
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80").size(), 12u);  // above U+10FFFF
  EXPECT_EQ(sanitize_utf8("ok \xF0\x9F\xA6\x99 \xF4\x8F\xBF\xBF"),
            "ok \xF0\x9F\xA6\x99 \xF4\x8F\xBF\xBF");
  EXPECT_TRUE(is_valid_utf8("日本"));
  EXPECT_FALSE(is_valid_utf8("\xE6\x97"));
  EXPECT_TRUE(is_valid_utf8(""));

  // Streaming: an incomplete but possibly valid tail is held back, nothing else.
  std::string out;
  EXPECT_EQ(sanitize_utf8_prefix("ab\xF0\x9F", /*final=*/false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(sanitize_utf8_prefix("ab\xF0\x41", /*final=*/false, &out), 4u);
  EXPECT_EQ(out, std::string("ab") + kReplacement + "A");
  out.clear();
  EXPECT_EQ(sanitize_utf8_prefix("\xE0\x80", /*final=*/false, &out), 2u);  // never valid
  EXPECT_EQ(out, std::string(kReplacement) + kReplacement);
}

TEST(Utf8, ByteLevelMapping) {
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // Ċ
  for (int b = 0; b < 256; ++b) {
    const std::string& text = byte_to_unicode(static_cast<uint8_t>(b));
    size_t pos = 0;
    uint32_t cp = 0;
    ASSERT_TRUE(next_code_point(text, &pos, &cp));
    EXPECT_EQ(pos, text.size());
    EXPECT_EQ(unicode_to_byte(cp), b);
  }
  EXPECT_EQ(unicode_to_byte(0x4E00), -1);
  EXPECT_EQ(byte_level_decode("\xC4\xA0Hello\xC4\x8A"), " Hello\n");
}

}  // namespace
}  // namespace specdec
