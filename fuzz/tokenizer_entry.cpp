// tokenizer_one: the two real tokenizer kinds on arbitrary bytes. The models are loaded once per
// process (a fuzzer runs millions of inputs through them).
//
// Input: byte 0 = flags, the rest = the payload.
//   bit 0   0: SentencePiece-style (stories260K), 1: byte-level BPE (SmolLM2; SPM when absent)
//   bit 1   encode: add_special              bit 2   encode: parse_special
//   bit 3   0: encode the payload as text, 1: decode the payload as little-endian int32 ids
//   bit 4   decode: render_special           bit 5   decode: text_start
//   bit 6   decode: ids taken modulo the vocabulary (else raw: most are out of range)
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.h"
#include "model/gguf.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace specdec::fuzz {
namespace {

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

Loaded load(const std::string& path) {
  Loaded l;
  l.file = GgufFile::open(path);
  l.tokenizer = Tokenizer::from_gguf(*l.file);
  return l;
}

const Tokenizer& pick(bool bpe) {
  static const Loaded spm = load(fuzz_shared_dir() + "/models/tiny/stories260K.gguf");
  static const Loaded byte_bpe = [] {
    const std::string path = fuzz_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    try {
      return load(path);
    } catch (const Error& e) {
      std::fprintf(stderr, "tokenizer fuzz: no byte-level BPE (%s); SPM only\n", e.what());
      return Loaded{};
    }
  }();
  return bpe && byte_bpe.tokenizer ? *byte_bpe.tokenizer : *spm.tokenizer;
}

bool valid_utf8(const std::string& s) { return sanitize_utf8(s) == s; }

void encode(const Tokenizer& tok, std::string_view text, bool add_special, bool parse_special) {
  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.n_vocab());
  (void)tok.decode(ids);
}

void decode(const Tokenizer& tok, const std::vector<int32_t>& ids, DecodeOptions options) {
  bool in_range = true;
  for (int32_t id : ids) in_range = in_range && id >= 0 && id < tok.n_vocab();
  std::string whole;
  try {
    whole = tok.decode(ids, options);
  } catch (const Error&) {
    FUZZ_CHECK(!in_range);  // refused only for an id outside the vocabulary
    return;
  }
  FUZZ_CHECK(in_range);
  // The incremental detokenizer's promise (detokenizer.h): the same text, sanitized, and valid
  // UTF-8 in every piece.
  IncrementalDetokenizer detok(tok, options);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    FUZZ_CHECK(valid_utf8(piece));
    streamed += piece;
  }
  const std::string tail = detok.flush();
  FUZZ_CHECK(valid_utf8(tail));
  streamed += tail;
  FUZZ_CHECK(streamed == sanitize_utf8(whole));
}

}  // namespace

void tokenizer_one(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  const Tokenizer& tok = pick(flags & 1);
  const std::string_view payload(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(flags & 8)) {
    encode(tok, payload, flags & 2, flags & 4);
    return;
  }
  std::vector<int32_t> ids(payload.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t raw;
    std::memcpy(&raw, payload.data() + 4 * i, 4);
    ids[i] = (flags & 64) ? static_cast<int32_t>(raw % static_cast<uint32_t>(tok.n_vocab()))
                          : static_cast<int32_t>(raw);
  }
  DecodeOptions options;
  options.render_special = flags & 16;
  options.text_start = flags & 32;
  decode(tok, ids, options);
}

std::string fuzz_shared_dir() {
  if (const char* env = std::getenv("SPECDEC_SHARED_DIR"); env && *env) return env;
  return SPECDEC_FUZZ_SHARED_DIR;
}

std::string fuzz_cache_dir() {
  if (const char* env = std::getenv("SPECDEC_CACHE"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/specdec";
}

}  // namespace specdec::fuzz
