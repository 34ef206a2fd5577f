#include "tokenizer/pretokenizer.h"

#include <array>
#include <initializer_list>

#include <fmt/format.h>
#include <pcre2.h>

#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec {
namespace {

// GPT-2's pattern, without the final "|\s+": whitespace it leaves unmatched stays a word of
// its own, which is the same cut.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kBloom = R"( ?[^(\s|.,!?…。，、।۔،)]+)";

struct PreType {
  std::initializer_list<const char*> names;
  std::initializer_list<const char*> patterns;
  bool ignore_merges;
};

// The pre-tokenizer types we know, after llama.cpp's llama-vocab.cpp.
const std::array<PreType, 9>& pre_types() {
  static const std::array<PreType, 9> kTypes = {{
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}, false},
      {{"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de",
        "jina-v2-code", "roberta-bpe", "gigachat", "mpt", "olmo", "jais", "trillion"},
       {kGpt2},
       false},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2},
       false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {kLlama3}, true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {kLlama3}, false},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"}, {kQwen2}, false},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}, false},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", R"([一-龥ࠀ-一가-퟿]+)", R"(\p{N})"},
       false},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloom}, false},
  }};
  return kTypes;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};
using MatchDataPtr = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string_view pre_name)
    : name_(pre_name.empty() ? "default" : pre_name) {
  const PreType* found = nullptr;
  for (const PreType& type : pre_types()) {
    for (const char* name : type.names) {
      if (name_ == name) found = &type;
    }
  }
  if (found == nullptr) {
    throw Error(
        fmt::format("unsupported tokenizer.ggml.pre '{}' (byte-level BPE pre-tokenizer "
                    "type); known: default, gpt-2, starcoder, smollm, llama3, qwen2, ...",
                    name_));
  }
  ignore_merges_ = found->ignore_merges;
  for (const char* pattern : found->patterns) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                &error_offset, nullptr);
    if (regex->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      SPECDEC_CHECK(false,
                    fmt::format("pre-tokenizer regex '{}' does not compile at {}: {}", pattern,
                                error_offset, reinterpret_cast<const char*>(message.data())));
    }
    // JIT is an optimization only: without it pcre2_match interprets.
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    patterns_.emplace_back(pattern);
    regexes_.push_back(std::move(regex));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* words) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (size_t r = 0; r < regexes_.size(); ++r) {
    const Regex* regex = regexes_[r].get();
    MatchDataPtr match(pcre2_match_data_create_from_pattern(regex->code, nullptr));
    SPECDEC_CHECK(match != nullptr, "out of memory for PCRE2 match data");
    next.clear();
    for (const std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t emitted = 0;  // end of the last word cut from this piece
      size_t start = 0;    // where the next search starts
      while (start < piece.size()) {
        int rc = pcre2_match(regex->code, subject, piece.size(), start, 0, match.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // the interpreter keeps its stack on the heap
          rc = pcre2_match(regex->code, subject, piece.size(), start, PCRE2_NO_JIT, match.get(),
                           nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          std::array<PCRE2_UCHAR, 256> message{};
          pcre2_get_error_message(rc, message.data(), message.size());
          throw Error(
              fmt::format("pre-tokenizer '{}': matching /{}/ failed at byte {} of a {}-byte "
                          "piece: {}",
                          name_, patterns_[r], start, piece.size(),
                          reinterpret_cast<const char*>(message.data())));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t begin = ovector[0];
        const size_t end = ovector[1];
        if (end == begin) {  // an empty match cuts nothing: step over one character
          if (begin >= piece.size()) break;
          start = begin + std::min(piece.size() - begin,
                                   utf8_sequence_length(static_cast<uint8_t>(piece[begin])));
          continue;
        }
        if (begin > emitted) next.push_back(piece.substr(emitted, begin - emitted));
        next.push_back(piece.substr(begin, end - begin));
        emitted = end;
        start = end;
      }
      if (emitted < piece.size()) next.push_back(piece.substr(emitted));
    }
    pieces.swap(next);
  }
  words->insert(words->end(), pieces.begin(), pieces.end());
}

}  // namespace specdec
