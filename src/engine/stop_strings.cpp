#include "engine/stop_strings.h"

#include <algorithm>

namespace specdec {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStrings::push(const std::string& text, bool* stopped) {
  *stopped = stopped_;
  if (stopped_) return {};
  std::string buf = held_ + text;
  held_.clear();
  // The earliest stop string in the buffer (held text never contains a whole one).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = buf.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    *stopped = true;
    buf.resize(first);
    return buf;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, buf.size()); len > hold; --len) {
      if (buf.compare(buf.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  held_ = buf.substr(buf.size() - hold);
  buf.resize(buf.size() - hold);
  return buf;
}

std::string StopStrings::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace specdec
