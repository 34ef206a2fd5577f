// Timing program for the tokenizer (it replaced a wall-clock unit test, which could flake on a
// busy machine): encodes a prompt of about --tokens tokens (the text file repeated) with the
// tokenizer of a GGUF model, --rounds times, and prints the best and median times and tokens/ms.
// Not part of ctest.
//
// Build: cmake --build <build dir> --target bench_tokenizer
// Run: <build dir>/bench_tokenizer [-m MODEL.gguf] [--text FILE] [--tokens N] [--rounds R]
//   defaults: the default model (SmolLM2-135M-Instruct in the cache), ../shared/text/
//   plain-english.txt, 512 tokens, 20 rounds. For reference: a 512-token prompt encodes in
//   well under 10 ms (the old test's bound).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"
#include "util/paths.h"

int main(int argc, char** argv) {
  using namespace specdec;
  std::string model = default_model_path();
  std::string text_path = "../shared/text/plain-english.txt";
  size_t want_tokens = 512;
  int rounds = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-m") {
      model = next();
    } else if (a == "--text") {
      text_path = next();
    } else if (a == "--tokens") {
      want_tokens = static_cast<size_t>(std::max(1, std::atoi(next().c_str())));
    } else if (a == "--rounds") {
      rounds = std::max(1, std::atoi(next().c_str()));
    } else {
      std::fprintf(stderr, "unknown option %s (see the header of bench/micro/bench_tokenizer.cpp)\n",
                   a.c_str());
      return 2;
    }
  }
  try {
    std::ifstream f(text_path);
    if (!f) throw Error("cannot read the text file " + text_path);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string paragraph = ss.str();
    if (paragraph.empty()) throw Error("the text file " + text_path + " is empty");
    const std::unique_ptr<GgufFile> gguf = GgufFile::open(model);
    const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*gguf);
    std::string text;
    while (tok->encode(text, false, false).size() < want_tokens) text += paragraph;
    std::vector<double> ms;
    size_t n_tokens = 0;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      n_tokens = tok->encode(text, false, false).size();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double best = ms.front(), median = ms[ms.size() / 2];
    std::printf("encode %zu tokens (%zu bytes): best %.3f ms, median %.3f ms, %.1f tokens/ms (best)\n",
                n_tokens, text.size(), best, median, static_cast<double>(n_tokens) / best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
