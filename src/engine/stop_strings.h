// Stop strings over streamed text: text that could still be the start of a stop string is held
// back, and nothing from a stop string on is ever released (as vLLM and llama-server do).
#pragma once

#include <string>
#include <vector>

namespace specdec {

class StopStrings {
 public:
  StopStrings() = default;
  explicit StopStrings(std::vector<std::string> stops);

  // Appends new text; returns the text that is now safe to send. Sets *stopped when a stop
  // string appeared (the returned text ends right before it; later calls return nothing).
  std::string push(const std::string& text, bool* stopped);
  // The text held back (at the end of generation, when no stop string can complete any more).
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that appeared (empty before).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;  // non-empty strings
  std::string held_;                // could be the start of a stop string
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace specdec
