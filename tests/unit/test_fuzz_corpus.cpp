// Replays every input kept in fuzz/corpus/<target>/ (the hand-made seeds and each crash a fuzzer
// found, once fixed) through the same function the libFuzzer target calls (fuzz/fuzz_entries.h),
// so that a fixed finding stays fixed in every build, sanitized or not, without clang. A
// finding aborts the test; the file being replayed is named on stderr first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/test_paths.h"
#include "fuzz/fuzz_entries.h"

namespace specdec {
namespace {

std::vector<std::string> corpus(const char* target) {
  const std::filesystem::path dir = std::filesystem::path(SPECDEC_SOURCE_DIR) / "fuzz/corpus" / target;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void replay(const char* target, void (*entry)(const uint8_t*, size_t)) {
  const std::vector<std::string> files = corpus(target);
  ASSERT_GE(files.size(), 3u) << "fuzz/corpus/" << target << " lost its seeds";
  for (const std::string& file : files) {
    std::fprintf(stderr, "replaying %s\n", file.c_str());
    const std::string bytes = test::read_file(file);
    entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
}

TEST(FuzzCorpus, Gguf) { replay("gguf", fuzz::gguf_one); }

TEST(FuzzCorpus, Tokenizer) {
  ASSERT_TRUE(test::file_exists(test::tiny_model("stories260K.gguf")));
  replay("tokenizer", fuzz::tokenizer_one);
}

TEST(FuzzCorpus, ChatTemplate) { replay("chat_template", fuzz::chat_template_one); }

TEST(FuzzCorpus, Request) { replay("request", fuzz::request_one); }

}  // namespace
}  // namespace specdec
