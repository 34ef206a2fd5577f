// Pre-tokenization of byte-level BPE: the text is cut into words by the regular expressions of
// the model's tokenizer.ggml.pre type (the lists of llama.cpp's llm_tokenizer_bpe), applied one
// after the other: each regex cuts every piece of the previous step into its matches and the
// unmatched stretches between them. PCRE2 with UTF and UCP (\p{L}, \p{N}, Unicode \s), JIT
// compiled; invalid UTF-8 never matches and is left in the unmatched stretches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace specdec {

class PreTokenizer {
 public:
  // `pre_name` as in tokenizer.ggml.pre; "" means "default". Throws specdec::Error naming an
  // unknown type.
  explicit PreTokenizer(std::string_view pre_name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` (views into it, in order, covering all of it) to `words`.
  // Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>* words) const;

  // Whether a word that is itself a vocabulary token skips the merges (llama3 models).
  bool ignore_merges() const { return ignore_merges_; }
  const std::string& name() const { return name_; }
  // The regex sources in the order they apply.
  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  struct Regex;

  std::string name_;
  bool ignore_merges_ = false;
  std::vector<std::string> patterns_;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace specdec
