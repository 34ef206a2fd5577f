// Builds with a sanitizer (-DSPECDEC_SANITIZE=address|thread, scripts/test.sh --sanitize) run
// the code 5-40x slower. The slowest tests scale their inputs with sanitizer_scaled(): the same
// checks over fewer steps or requests, so that the sanitized suite fits CI's budget. A test is
// never skipped this way, and a normal build runs the full inputs.
#pragma once

#include <algorithm>

namespace specdec::test {

#ifdef SPECDEC_SANITIZER_BUILD
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// n in a normal build; n / divisor (at least `floor`) in a sanitizer build.
constexpr int sanitizer_scaled(int n, int divisor, int floor = 1) {
  return kSanitizerBuild ? std::max(floor, n / divisor) : n;
}

}  // namespace specdec::test
