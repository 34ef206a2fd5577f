// The fuzz targets' bodies, one function per target, shared by the libFuzzer binaries
// (fuzz_<target>.cpp, -DSPECDEC_FUZZ=ON with clang) and the corpus replay test of the normal
// suite (tests/unit/test_fuzz_corpus.cpp), so that every input kept in fuzz/corpus/ - the seeds
// and any crash found since - runs on every build, not only under the fuzzer.
//
// Each function takes arbitrary bytes. An input the library rejects with specdec::Error is a
// normal outcome; any other exception escapes (the fuzzer reports it), and a broken invariant
// traps (FUZZ_CHECK), so a finding is a crash in both places.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace specdec::fuzz {

// The bytes as a GGUF file: header, metadata, tensor table, offsets; then the model config and
// the tokenizer read from it, as `specdec generate` would.
void gguf_one(const uint8_t* data, size_t size);

// The first byte picks a real tokenizer (SentencePiece-style from shared/'s stories260K,
// byte-level BPE from the default SmolLM2 model when it is in the cache) and a mode: encode the
// rest as text, or decode it as token ids (whole and through the incremental detokenizer).
void tokenizer_one(const uint8_t* data, size_t size);

// The bytes up to the first NUL as a model's Jinja chat template (detected, its details read),
// the rest as messages (records separated by 0x01, each "role 0x02 content"), rendered with and
// without the generation prompt: an unknown template or a conversation the template refuses is
// an Error; a ChatML rendering holds every message's content as given.
void chat_template_one(const uint8_t* data, size_t size);

// The bytes as an HTTP request body of the server's completions and chat routes: JSON parsing
// and request checking answer with an error value, never an exception, and what they accept is
// within the documented bounds (choices, prompts, stop strings and ids, logprobs).
void request_one(const uint8_t* data, size_t size);

// Where tokenizer_one finds its models: $SPECDEC_SHARED_DIR or the configured shared/, and
// $SPECDEC_CACHE or ~/.cache/specdec.
std::string fuzz_shared_dir();
std::string fuzz_cache_dir();

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "fuzz invariant broken at %s:%d: %s\n", file, line, cond);
  std::abort();
}

}  // namespace specdec::fuzz

#define FUZZ_CHECK(cond) \
  ((cond) ? (void)0 : ::specdec::fuzz::check_failed(__FILE__, __LINE__, #cond))
