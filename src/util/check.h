// Three tiers of errors (DESIGN §7):
//   SPECDEC_CHECK(cond, msg)   always on; an internal invariant broke: print file:line and abort.
//   SPECDEC_DCHECK(cond, msg)  the same, compiled only in debug builds (hot loops).
//   specdec::Error             expected bad input (malformed file, bad option, prompt too long):
//                              thrown inside the library, turned into a status at the public API.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace specdec {

// An expected, user-facing failure. The message must name what was wrong and where
// (file, tensor, option), so that it can be shown to the user as is.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  std::fprintf(stderr, "specdec: internal check failed at %s:%d: %s: %s\n", file, line, cond,
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace specdec

#define SPECDEC_CHECK(cond, msg)                                         \
  do {                                                                   \
    if (!(cond)) ::specdec::check_failed(__FILE__, __LINE__, #cond, msg); \
  } while (0)

#ifdef NDEBUG
#define SPECDEC_DCHECK(cond, msg) \
  do {                            \
  } while (0)
#else
#define SPECDEC_DCHECK(cond, msg) SPECDEC_CHECK(cond, msg)
#endif
