// Tokenizer tests: llama.cpp's vocabulary fixtures (SPM and byte-level BPE), the tiny models'
// golden prompts, SmolLM2 (digits, ChatML special tokens, round trips), Qwen2.5-Coder (when
// fetched: reference ids, ChatML with a default system prompt), metadata handling and
// errors on synthetic GGUF files, and encoding speed.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/gguf_writer.h"
#include "common/test_paths.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "util/check.h"
#include "util/paths.h"

namespace specdec {
namespace {

using test::file_exists;
using test::read_file;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const auto gguf = GgufFile::open(path);
  return Tokenizer::from_gguf(*gguf);
}

// X.gguf.inp: every case is followed by "\n__ggml_vocab_test__\n" (llama.cpp's
// test-tokenizer-0 convention); X.gguf.out: one line of space-separated ids per case.
struct FixtureCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<FixtureCase> read_fixture(const std::string& gguf_path) {
  const std::string inp = read_file(gguf_path + ".inp");
  const std::string out = read_file(gguf_path + ".out");
  static const std::string kSeparator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t hit = inp.find(kSeparator); hit != std::string::npos;
       hit = inp.find(kSeparator, pos)) {
    texts.push_back(inp.substr(pos, hit - pos));
    pos = hit + kSeparator.size();
  }
  EXPECT_EQ(pos, inp.size()) << "text after the last separator in " << gguf_path << ".inp";
  std::vector<std::vector<int32_t>> id_lines;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<int32_t> ids;
    for (int32_t id; fields >> id;) ids.push_back(id);
    id_lines.push_back(std::move(ids));
  }
  EXPECT_EQ(texts.size(), id_lines.size()) << gguf_path;
  std::vector<FixtureCase> cases;
  for (size_t i = 0; i < std::min(texts.size(), id_lines.size()); ++i) {
    cases.push_back({texts[i], id_lines[i]});
  }
  return cases;
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s.append(" ").append(std::to_string(id));
  return s;
}

class VocabFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabFixtureTest, EncodesEveryCaseExactlyAndRoundTrips) {
  const std::string path = test::fixture_dir() + "/ggml-vocab-" + GetParam() + ".gguf";
  ASSERT_TRUE(file_exists(path)) << path;
  const auto tok = load_tokenizer(path);
  const std::vector<FixtureCase> cases = read_fixture(path);
  ASSERT_EQ(cases.size(), 46u);
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const FixtureCase& c = cases[i];
    const std::vector<int32_t> ids = tok->encode(c.text, /*add_special=*/false,
                                                 /*parse_special=*/false);
    EXPECT_EQ(ids, c.ids) << "case " << i << " '" << c.text << "'\n  got     " << ids_to_string(ids)
                          << "\n  expected" << ids_to_string(c.ids);
    failures += ids != c.ids;
    // Both algorithms are lossless here (byte-level BPE; SPM with byte fallback).
    EXPECT_EQ(tok->decode(c.ids), c.text) << "case " << i;
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VocabFixtureTest,
                         ::testing::Values("gpt-2", "starcoder", "llama-spm", "phi-3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(TokenizerFixtures, MetadataOfTheVocabularies) {
  const auto spm = load_tokenizer(test::fixture_dir() + "/ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(spm->kind(), TokenizerKind::kSpm);
  EXPECT_EQ(spm->n_vocab(), 32000);
  EXPECT_EQ(spm->bos_id(), 1);
  EXPECT_EQ(spm->eos_id(), 2);
  EXPECT_EQ(spm->unk_id(), 0);
  EXPECT_TRUE(spm->add_bos());
  EXPECT_FALSE(spm->add_eos());
  EXPECT_TRUE(spm->add_space_prefix());  // absent key: the SPM default
  EXPECT_TRUE(spm->is_eog(2));
  EXPECT_FALSE(spm->is_eog(1));
  EXPECT_EQ(spm->token_text(1), "<s>");
  EXPECT_EQ(spm->token_type(1), TokenType::kControl);
  EXPECT_EQ(spm->token_type(3), TokenType::kByte);
  EXPECT_EQ(spm->token_to_piece(1), "");
  EXPECT_EQ(spm->token_to_piece(1, /*render_special=*/true), "<s>");
  EXPECT_EQ(spm->token_to_piece(0), "");           // <unk>
  EXPECT_EQ(spm->token_to_piece(3 + 0x0A), "\n");  // <0x0A>
  EXPECT_EQ(spm->token_to_piece(*spm->find_token("\xE2\x96\x81Hello")), " Hello");
  EXPECT_THROW(spm->token_to_piece(32000), Error);
  EXPECT_THROW(spm->token_to_piece(-1), Error);

  const std::vector<int32_t> with_bos = spm->encode("Hello world", true, false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()),
            spm->encode("Hello world", false, false));
  EXPECT_EQ(spm->decode(with_bos), "Hello world");
  EXPECT_EQ(spm->encode("", true, false), std::vector<int32_t>{1});
  EXPECT_TRUE(spm->encode("", false, false).empty());

  const auto gpt2 = load_tokenizer(test::fixture_dir() + "/ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(gpt2->kind(), TokenizerKind::kBpe);
  EXPECT_EQ(gpt2->pre_name(), "gpt-2");
  EXPECT_FALSE(gpt2->add_bos());
  EXPECT_FALSE(gpt2->add_space_prefix());
  EXPECT_TRUE(gpt2->is_eog(50256));                                               // <|endoftext|>
  EXPECT_EQ(gpt2->token_to_piece(*gpt2->find_token("\xC4\xA0Hello")), " Hello");  // "ĠHello"
  EXPECT_EQ(gpt2->token_to_piece(*gpt2->find_token("\xC4\x8A")), "\n");           // "Ċ"
  EXPECT_EQ(gpt2->encode("Hello", true, false), gpt2->encode("Hello", false, false));

  const auto phi3 = load_tokenizer(test::fixture_dir() + "/ggml-vocab-phi-3.gguf");
  EXPECT_EQ(phi3->eos_id(), 32000);
  EXPECT_TRUE(phi3->is_eog(32000));   // <|endoftext|>
  EXPECT_TRUE(phi3->is_eog(32007));   // <|end|>
  EXPECT_FALSE(phi3->is_eog(32010));  // <|user|>
  // Control tokens are text unless parse_special; "</s>" is user-defined here, so always parsed.
  EXPECT_EQ(phi3->encode("<|user|>", false, true), std::vector<int32_t>{32010});
  EXPECT_NE(phi3->encode("<|user|>", false, false), std::vector<int32_t>{32010});
  const std::vector<int32_t> eos_text = phi3->encode("a</s>", false, false);
  ASSERT_FALSE(eos_text.empty());
  EXPECT_EQ(eos_text.back(), 2);
}

// The SPM prefix space after a special token, as llama.cpp: every text fragment that starts the
// text or follows a special token gets one.
TEST(TokenizerFixtures, SpmSpacePrefixAfterSpecialTokens) {
  const auto phi3 = load_tokenizer(test::fixture_dir() + "/ggml-vocab-phi-3.gguf");
  const std::vector<int32_t> hello = phi3->encode("Hello", false, false);  // "▁Hello"
  std::vector<int32_t> expected = {32010};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(32007);
  EXPECT_EQ(phi3->encode("<|user|>Hello<|end|>", false, true), expected);
  EXPECT_EQ(phi3->decode(expected, {.text_start = true, .render_special = true}),
            "<|user|> Hello<|end|>");
}

// The golden prompts of the tiny models (SentencePiece vocabulary of 512 tokens, BOS added), and
// their greedy continuations decoded as continuation text.
TEST(TokenizerGolden, TinyModelsPromptsAndContinuations) {
  for (const char* name : {"stories260K", "tinystories280K"}) {
    const std::string model = test::tiny_model((std::string(name) + ".gguf").c_str());
    const std::string golden = test::golden_file((std::string(name) + ".json").c_str());
    ASSERT_TRUE(file_exists(model)) << model;
    ASSERT_TRUE(file_exists(golden)) << golden;
    const auto tok = load_tokenizer(model);
    const auto json = nlohmann::json::parse(read_file(golden));
    EXPECT_EQ(tok->n_vocab(), json["n_vocab"].get<int32_t>());
    EXPECT_EQ(tok->add_bos(), json["add_bos"].get<bool>());
    ASSERT_FALSE(json["cases"].empty());
    for (const auto& c : json["cases"]) {
      const std::string prompt = c["prompt"].get<std::string>();
      const auto expected = c["tokens"].get<std::vector<int32_t>>();
      const std::vector<int32_t> ids = tok->encode(prompt, /*add_special=*/true,
                                                   /*parse_special=*/false);
      EXPECT_EQ(ids, expected) << name << ": '" << prompt << "'\n  got     " << ids_to_string(ids)
                               << "\n  expected" << ids_to_string(expected);
      EXPECT_EQ(tok->decode(ids), prompt);
      const auto greedy = c["greedy"].get<std::vector<int32_t>>();
      EXPECT_EQ(tok->decode(greedy, {.text_start = false}), c["greedy_text"].get<std::string>())
          << name << ": '" << prompt << "'";
    }
  }
}

class SmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_path();
    if (file_exists(path)) tok_ = load_tokenizer(path).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) {
      GTEST_SKIP() << "SmolLM2 model not found at " << test::default_model_path()
                   << " (set SPECDEC_CACHE or run the setup that downloads it)";
    }
  }
  int32_t id(const std::string& text) const {
    const std::optional<int32_t> found = tok_->find_token(text);
    EXPECT_TRUE(found.has_value()) << "no token '" << text << "'";
    return found.value_or(-1);
  }
  static Tokenizer* tok_;
};
Tokenizer* SmolLM2Test::tok_ = nullptr;

TEST_F(SmolLM2Test, Metadata) {
  EXPECT_EQ(tok_->n_vocab(), 49152);
  EXPECT_EQ(tok_->kind(), TokenizerKind::kBpe);
  EXPECT_EQ(tok_->pre_name(), "smollm");
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_TRUE(tok_->is_eog(2));  // <|im_end|>
  EXPECT_TRUE(tok_->is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_eog(1));
  EXPECT_EQ(tok_->eog_ids(), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(tok_->token_text(1), "<|im_start|>");
  EXPECT_FALSE(tok_->chat_template().empty());
}

TEST_F(SmolLM2Test, DigitsAreSplitOneByOne) {
  EXPECT_EQ(tok_->encode("12345", false, false),
            (std::vector<int32_t>{id("1"), id("2"), id("3"), id("4"), id("5")}));
  // " 2024" -> "Ġ" then the four digits (the digit split comes before the GPT-2 regex, which then
  // sees " " alone).
  EXPECT_EQ(tok_->encode("in 2024", false, false),
            (std::vector<int32_t>{id("in"), id("\xC4\xA0"), id("2"), id("0"), id("2"), id("4")}));
}

// Ids computed independently with HF tokenizers 0.23 (BPE built from this GGUF's vocabulary and
// merges, pre-tokenizer Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=False)],
// SmolLM2's tokenizer.json configuration).
TEST_F(SmolLM2Test, MatchesReferenceIds) {
  struct Case {
    const char* text;
    std::vector<int32_t> ids;
  };
  const std::vector<Case> cases = {
      {"Hello world", {19556, 905}},
      {" Hello World!", {38699, 2260, 17}},
      {"The quick brown fox jumps over the lazy dog.",
       {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30}},
      {"12345", {33, 34, 35, 36, 37}},
      {"Version 3.14159 released on 2024-11-21 at 10:45.",
       {22348, 216, 35, 30, 33, 36, 33, 37,  41,  5118, 335, 216, 34, 32, 34,
        36,    29,  33, 33, 29, 34, 33, 418, 216, 33,   32,  42,  36, 37, 30}},
      {"  two leading spaces and trailing  ", {216, 827, 2899, 5600, 284, 35079, 256}},
      {"line one\nline two\n\n\tindented\r\n",
       {1311, 582, 198, 1311, 827, 1116, 197, 526, 6574, 2738}},
      {"I've been 'told he's there, 'RE you sure? We'Ve a'lL",
       {57,   3543, 719,  637, 100,  793, 384,   506, 665, 28, 637,
        3256, 346,  2090, 47,  1046, 23,  25917, 253, 23,  92, 60}},
      {"\xC3\x9Cn\xC3\xAF"
       "c\xC3\xB6"
       "d\xC3\xA9: "
       "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3"
       "\x83\x88, \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC, "
       "\xD1\x80\xD1\x83\xD1\x81\xD1\x81\xD0\xBA\xD0\xB8\xD0\xB9",
       {142,   246,   94,  25972, 83,   7466,  84,    2756,  42,    17097, 241,
        115,   40993, 179, 120,   248,  26453, 11100, 224,   10391, 251,   10391,
        134,   11100, 226, 28,    5664, 239,   17162, 17162, 25723, 11517, 12001,
        21118, 26112, 28,  216,   9175, 14714, 9382,  39511, 7872,  24958}},
      {"emoji: "
       "\xF0\x9F\xA6\x99\xF0\x9F\x9A\x80\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
       "\xF0\x9F\x91\xA7 and \xE2\x9C\x85 done",
       {391,   33777, 42,  15107, 116, 243,   10813, 244, 218, 10813, 235, 119, 321, 231,
        10813, 235,   119, 321,   231, 10813, 235,   117, 284, 4636,  246, 223, 2294}},
      {"def f(x):\n    return x ** 2  # square\n",
       {1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 216, 907, 5222, 198}},
      {"!!!!!!  ??? ...... ------======",
       {36689, 10095, 216, 9148, 16693, 32543, 950, 216, 21771, 2031, 1189}},
      {"What is the capital of France? The capital of France is Paris.",
       {1780, 314, 260, 3575, 282, 4649, 47, 378, 3575, 282, 4649, 314, 7042, 30}},
  };
  ASSERT_FALSE(cases.empty());
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = tok_->encode(c.text, false, false);
    EXPECT_EQ(ids, c.ids) << "'" << c.text << "'\n  got     " << ids_to_string(ids)
                          << "\n  expected" << ids_to_string(c.ids);
    EXPECT_EQ(tok_->decode(ids), c.text);
  }
}

TEST_F(SmolLM2Test, ChatMLSpecialTokens) {
  const std::string text = "<|im_start|>user\nHi there<|im_end|>\n";
  const std::vector<int32_t> parsed = tok_->encode(text, false, /*parse_special=*/true);
  std::vector<int32_t> expected = {1};
  for (const int32_t t : tok_->encode("user\nHi there", false, false)) expected.push_back(t);
  expected.push_back(2);
  for (const int32_t t : tok_->encode("\n", false, false)) expected.push_back(t);
  EXPECT_EQ(parsed, expected);
  EXPECT_EQ(tok_->decode(parsed), "user\nHi there\n");
  EXPECT_EQ(tok_->decode(parsed, {.render_special = true}), text);

  // Without parse_special the markers are plain text.
  const std::vector<int32_t> plain = tok_->encode(text, false, /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(tok_->decode(plain), text);

  // Adjacent specials and a special at the very end.
  EXPECT_EQ(tok_->encode("<|im_end|><|im_start|>", false, true), (std::vector<int32_t>{2, 1}));
  // Leftmost-longest: "<|im_start|" (no closing '>') is not a special token.
  const std::vector<int32_t> partial = tok_->encode("<|im_start|", false, true);
  EXPECT_EQ(std::count(partial.begin(), partial.end(), 1), 0);
}

TEST_F(SmolLM2Test, ChatTemplateEncodes) {
  const std::vector<ChatMessage> messages = {{"user", "What is 2+2?"}};
  const std::string prompt = tok_->apply_chat_template(messages, /*add_generation_prompt=*/true);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> ids = tok_->encode(prompt, false, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);  // three <|im_start|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);  // two <|im_end|>
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok_->decode(ids, {.render_special = true}), prompt);
}

TEST_F(SmolLM2Test, RoundTripsArbitraryText) {
  const std::vector<std::string> texts = {
      "Hello, world! The year 1999 had 365 days.",
      "  leading and trailing spaces  ",
      "tabs\tand\nnewlines\r\n\n\n",
      "Ünïcödé: 日本語のテキスト, Ελληνικά, русский, עברית, العربية",
      "emoji: 🦙🚀👩‍👩‍👧 and ✅",
      "code: for (int i = 0; i < n; ++i) { x[i] += 3.14e-2f; }",
      "'s 're 've 'll 'd 'm ''' ```",
      std::string("invalid \x80\xE3 bytes and a cut emoji \xF0\x9F\x98"),
  };
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok_->encode(text, false, false);
    EXPECT_EQ(tok_->decode(ids), text) << text;
  }
  // SmolLM2 has no token for some bytes that never occur in UTF-8 text (0xFF, 0xC0, ...) and a
  // few control characters (0x04, ...): encode drops them, as HF tokenizers does.
  std::vector<bool> encodable(256);
  int n_missing = 0;
  for (int b = 0; b < 256; ++b) {
    encodable[b] = tok_->find_token(byte_to_unicode(static_cast<uint8_t>(b))).has_value();
    n_missing += !encodable[b];
  }
  EXPECT_FALSE(encodable[0xFF]);
  EXPECT_GT(n_missing, 0);
  EXPECT_LT(n_missing, 32);
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    std::string expected;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      const auto b = static_cast<uint8_t>(rng() % 256);
      text.push_back(static_cast<char>(b));
      if (encodable[b]) expected.push_back(static_cast<char>(b));
    }
    EXPECT_EQ(tok_->decode(tok_->encode(text, false, false)), expected);
  }
}

// The encoding speed is measured by bench/micro/bench_tokenizer.cpp (a wall-clock bound in a test
// could fail on a busy machine).

// Qwen2.5-Coder (scripts/fetch-model.sh qwen2.5-coder-0.5b): byte-level BPE with the qwen2
// pre-tokenizer (digits one by one, case-insensitive contractions), a 151,936-token vocabulary,
// ChatML with Qwen's default system prompt. Skipped when the model has not been fetched.
class Qwen2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = known_model_path("qwen2.5-coder-0.5b");
    if (file_exists(path)) tok_ = load_tokenizer(path).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) {
      GTEST_SKIP() << "Qwen2.5-Coder-0.5B not found at " << known_model_path("qwen2.5-coder-0.5b")
                   << "; run scripts/fetch-model.sh qwen2.5-coder-0.5b";
    }
  }
  static Tokenizer* tok_;
};
Tokenizer* Qwen2Test::tok_ = nullptr;

TEST_F(Qwen2Test, Metadata) {
  EXPECT_EQ(tok_->n_vocab(), 151936);
  EXPECT_EQ(tok_->kind(), TokenizerKind::kBpe);
  EXPECT_EQ(tok_->pre_name(), "qwen2");
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->eos_id(), 151645);  // <|im_end|>
  EXPECT_TRUE(tok_->is_eog(151645));
  EXPECT_TRUE(tok_->is_eog(151643));  // <|endoftext|>
  EXPECT_EQ(tok_->token_text(151644), "<|im_start|>");
  EXPECT_EQ(tok_->token_text(151645), "<|im_end|>");
}

// Ids computed independently with HF tokenizers 0.23.3 (BPE built from this GGUF's vocabulary
// and merges, normalizer NFC, pre-tokenizer Sequence[Split(Qwen2's regex, isolated),
// ByteLevel(add_prefix_space=False, use_regex=False)], Qwen2's tokenizer.json configuration).
TEST_F(Qwen2Test, MatchesReferenceIds) {
  struct Case {
    const char* text;
    std::vector<int32_t> ids;
  };
  const std::vector<Case> cases = {
      {"Hello world", {9707, 1879}},
      {" Hello World!", {21927, 4337, 0}},
      {"12345", {16, 17, 18, 19, 20}},
      {"Version 3.14159 released on 2024-11-21 at 10:45.",
       {5637, 220, 18, 13, 16, 19, 16, 20,  24,  5880, 389, 220, 17, 15, 17,
        19,   12,  16, 16, 12, 17, 16, 518, 220, 16,   15,  25,  19, 20, 13}},
      {"  two leading spaces and trailing  ", {220, 1378, 6388, 12621, 323, 27748, 256}},
      {"line one\nline two\n\n\tindented\r\n",
       {1056, 825, 198, 1056, 1378, 271, 197, 484, 15864, 319}},
      {"I've been 'told he's there, 'RE you sure? We'Ve a'lL",
       {40,  3003, 1012, 364, 83,   813, 566,   594, 1052,  11, 364,
        787, 498,  2704, 30,  1205, 6,   42612, 264, 63866, 43}},
      {"\xC3\x9Cn\xC3\xAF"
       "c\xC3\xB6"
       "d\xC3\xA9: "
       "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3"
       "\x83\x88, \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC, "
       "\xD1\x80\xD1\x83\xD1\x81\xD1\x81\xD0\xBA\xD0\xB8\xD0\xB9",
       {52491, 77,    37572, 66,    2956, 128505, 25,    75402, 21894, 102819,
        15767, 56833, 61803, 70534, 11,   7851,   243,   33486, 33486, 41424,
        33269, 29762, 67337, 74134, 11,   18108,  43055, 126302}},
      {"\xE8\xAF\xB7\xE7\x94\xA8\xE4\xB8\x80\xE5\x8F\xA5\xE8\xAF\x9D\xE4\xBB\x8B\xE7\xBB\x8D\xE4"
       "\xBD\xA0\xE8\x87\xAA\xE5\xB7\xB1\xE3\x80\x82",
       {14880, 11622, 105321, 100157, 107828, 1773}},
      {"def f(x):\n    return x ** 2  # square\n",
       {750, 282, 2075, 982, 262, 470, 856, 3070, 220, 17, 220, 671, 9334, 198}},
      {"    if (a != b) {\n\t\treturn -1;\n    }\n",
       {262, 421, 320, 64, 961, 293, 8, 341, 197, 853, 481, 16, 280, 262, 456}},
      {"!!!!!!  ??? ...... ------======", {17085, 2928, 220, 51317, 74108, 55460, 45347}},
      {"emoji: "
       "\xF0\x9F\xA6\x99\xF0\x9F\x9A\x80\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
       "\xF0\x9F\x91\xA7 and \xE2\x9C\x85 done",
       {37523, 25, 11162, 99, 247, 145836, 145233, 378, 235, 145233, 378, 235, 145665, 323, 25521,
        227, 2814}},
  };
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = tok_->encode(c.text, false, false);
    EXPECT_EQ(ids, c.ids) << "'" << c.text << "'\n  got     " << ids_to_string(ids)
                          << "\n  expected" << ids_to_string(c.ids);
    EXPECT_EQ(tok_->decode(ids), c.text);
  }
}

// Qwen's template (read from the GGUF's tokenizer.chat_template) inserts its default system
// prompt when the conversation does not start with one, and keeps a given one.
TEST_F(Qwen2Test, ChatTemplateWithDefaultSystemPrompt) {
  const ChatTemplate tmpl = ChatTemplate::from_source(tok_->chat_template());
  EXPECT_EQ(tmpl.kind, ChatTemplateKind::kChatML);
  EXPECT_EQ(tmpl.default_system_message,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  const std::string prompt = tok_->apply_chat_template({{"user", "What is 2+2?"}}, true);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  const std::vector<int32_t> ids = tok_->encode(prompt, false, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 3);  // three <|im_start|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 2);  // two <|im_end|>
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(tok_->decode(ids, {.render_special = true}), prompt);
  EXPECT_EQ(tok_->apply_chat_template({{"system", "Be brief."}, {"user", "Hi"}}, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(PreTokenizer, SplitsLikeTheRegexes) {
  const PreTokenizer gpt2("gpt-2");
  std::vector<std::string_view> words;
  gpt2.split("Hello world's  3rd   test!!\n", &words);
  EXPECT_EQ(words, (std::vector<std::string_view>{"Hello", " world", "'s", " ", " 3", "rd", "  ",
                                                  " test", "!!", "\n"}));
  const PreTokenizer smollm("smollm");
  words.clear();
  smollm.split("a 123b", &words);
  EXPECT_EQ(words, (std::vector<std::string_view>{"a", " ", "1", "2", "3", "b"}));
  // Invalid UTF-8 never matches and stays in the unmatched stretches, nothing is lost.
  words.clear();
  const std::string bad = "ab\xFF\xFE cd";
  gpt2.split(bad, &words);
  std::string joined;
  for (const auto w : words) joined += w;
  EXPECT_EQ(joined, bad);
  EXPECT_THROW(PreTokenizer("no-such-pre"), Error);
  EXPECT_TRUE(PreTokenizer("llama3").ignore_merges());
  EXPECT_FALSE(PreTokenizer("").ignore_merges());
  EXPECT_EQ(PreTokenizer("").name(), "default");
}

// Synthetic vocabularies written as GGUF files.
std::string write_vocab(const std::string& name, const std::string& model,
                        const std::vector<std::string>& tokens, const std::vector<int32_t>& types,
                        const std::vector<float>& scores, const std::vector<std::string>& merges,
                        const std::string& pre = "") {
  test::GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_str("tokenizer.ggml.model", model);
  if (!pre.empty()) w.kv_str("tokenizer.ggml.pre", pre);
  w.kv_str_array("tokenizer.ggml.tokens", tokens);
  if (!types.empty()) w.kv_i32_array("tokenizer.ggml.token_type", types);
  if (!scores.empty()) w.kv_f32_array("tokenizer.ggml.scores", scores);
  if (!merges.empty()) w.kv_str_array("tokenizer.ggml.merges", merges);
  return test::write_temp_file(name, w.finish());
}

std::string error_of(const std::string& path) {
  try {
    load_tokenizer(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerErrors, NamesTheProblem) {
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a"};
  EXPECT_NE(error_of(write_vocab("bert.gguf", "bert", tokens, {}, {}, {})).find("'bert'"),
            std::string::npos);
  EXPECT_NE(error_of(write_vocab("pre.gguf", "gpt2", tokens, {}, {}, {"a a"}, "martian"))
                .find("'martian'"),
            std::string::npos);
  EXPECT_NE(
      error_of(write_vocab("nomerges.gguf", "gpt2", tokens, {}, {}, {}, "gpt-2")).find("merges"),
      std::string::npos);
  EXPECT_NE(error_of(write_vocab("scores.gguf", "llama", tokens, {}, {0.0f}, {})).find("scores"),
            std::string::npos);
  EXPECT_NE(
      error_of(write_vocab("types.gguf", "llama", tokens, {1, 3, 3, 9}, {}, {})).find("token_type"),
      std::string::npos);
  test::GgufWriter w;
  w.kv_str("general.architecture", "llama");
  EXPECT_NE(
      error_of(test::write_temp_file("nomodel.gguf", w.finish())).find("tokenizer.ggml.model"),
      std::string::npos);
  test::GgufWriter w2;
  w2.kv_str("tokenizer.ggml.model", "llama");
  w2.kv_str_array("tokenizer.ggml.tokens", tokens);
  w2.kv_u32("tokenizer.ggml.bos_token_id", 7);
  EXPECT_NE(error_of(test::write_temp_file("badbos.gguf", w2.finish())).find("bos_token_id"),
            std::string::npos);
  test::GgufWriter w3;  // 0xFFFFFFFF means "none"
  w3.kv_str("tokenizer.ggml.model", "llama");
  w3.kv_str_array("tokenizer.ggml.tokens", tokens);
  w3.kv_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
  const auto tok = load_tokenizer(test::write_temp_file("nopad.gguf", w3.finish()));
  EXPECT_EQ(tok->pad_id(), -1);
}

// A hand-made SPM vocabulary: the highest-scoring merge wins, ties go left, and characters that
// are not tokens fall back to bytes (or <unk> when there are no byte tokens).
TEST(SpmAlgorithm, MergesByScoreWithByteFallback) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  auto add = [&](const std::string& t, float s) {
    tokens.push_back(t);
    types.push_back(1);
    scores.push_back(s);
    return static_cast<int32_t>(tokens.size() - 1);
  };
  const std::string sp = "\xE2\x96\x81";
  const int32_t t_sp = add(sp, -1);
  const int32_t t_a = add("a", -2);
  const int32_t t_b = add("b", -2);
  const int32_t t_c = add("c", -2);
  const int32_t t_ab = add("ab", -5);
  const int32_t t_bc = add("bc", -3);  // better than "ab": "abc" -> a + bc
  const int32_t t_spa = add(sp + "a", -4);
  const auto tok = load_tokenizer(write_vocab("spm.gguf", "llama", tokens, types, scores, {}));
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{t_spa, t_bc}));
  EXPECT_EQ(tok->encode("bab", false, false), (std::vector<int32_t>{t_sp, t_b, t_ab}));
  // 'é' (C3 A9) is no token: byte fallback.
  EXPECT_EQ(tok->encode("c\xC3\xA9", false, false),
            (std::vector<int32_t>{t_sp, t_c, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("c\xC3\xA9 ab", true, false)), "c\xC3\xA9 ab");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("a", true, false), (std::vector<int32_t>{1, t_spa}));
  (void)t_a;
}

// A hand-made byte-level BPE: merges apply by rank, not by length or order of appearance.
TEST(BpeAlgorithm, MergesByRank) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_to_unicode(static_cast<uint8_t>(b)));
  auto add = [&](const std::string& t) {
    tokens.push_back(t);
    return static_cast<int32_t>(tokens.size() - 1);
  };
  const int32_t t_bc = add("bc");
  const int32_t t_ab = add("ab");
  const int32_t t_abc = add("abc");
  const int32_t t_end = add("<|end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[t_end] = 3;
  // Rank 0: "b c", rank 1: "a b", rank 2: "a bc".
  const auto tok = load_tokenizer(
      write_vocab("bpe.gguf", "gpt2", tokens, types, {}, {"b c", "a b", "a bc"}, "gpt-2"));
  const auto byte_id = [&](char c) { return static_cast<int32_t>(static_cast<uint8_t>(c)); };
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{t_abc}));
  EXPECT_EQ(tok->encode("abab", false, false), (std::vector<int32_t>{t_ab, t_ab}));
  EXPECT_EQ(tok->encode("cab", false, false), (std::vector<int32_t>{byte_id('c'), t_ab}));
  EXPECT_EQ(tok->encode("bcab", false, false), (std::vector<int32_t>{t_bc, t_ab}));
  EXPECT_EQ(tok->encode("x<|end|>", false, true), (std::vector<int32_t>{byte_id('x'), t_end}));
  EXPECT_TRUE(tok->is_eog(t_end));
  EXPECT_EQ(tok->decode(tok->encode("a bc\n\xF0\x9F\xA6\x99", false, false)),
            "a bc\n\xF0\x9F\xA6\x99");
}

}  // namespace
}  // namespace specdec
