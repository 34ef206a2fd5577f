// Where the shared test data is, and one clear failure when it is missing. Every test binary that
// asks for a path under shared/ links this file, and with it a global gtest environment that
// checks for the folder before any test runs: without it, a fresh clone with no ../shared would
// fail dozens of tests with "cannot open file" errors that never say what is missing.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "common/test_paths.h"

namespace specdec::test {

std::string shared_dir() {
  if (const char* env = std::getenv("SPECDEC_SHARED_DIR"); env && *env) return env;
  return SPECDEC_SHARED_DIR;
}
std::string tiny_model(const char* name) { return shared_dir() + "/models/tiny/" + name; }
std::string golden_file(const char* name) { return shared_dir() + "/golden/" + name; }
std::string fixture_dir() { return shared_dir() + "/tokenizer-fixtures"; }

std::string shared_data_missing_message() {
  const std::string dir = shared_dir();
  struct stat st;
  const std::string probe = dir + "/models/tiny";
  if (::stat(probe.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return {};
  return "shared test data not found at " + dir +
         " (see README): put shared/ beside the repository or set SPECDEC_SHARED_DIR";
}

namespace {

// A fatal failure in a global environment's SetUp makes gtest skip every test of the binary and
// exit non-zero, so the message is said once and the run still fails.
class SharedDataCheck : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::string missing = shared_data_missing_message();
    if (missing.empty()) return;
    std::fprintf(stderr, "%s\n", missing.c_str());
    GTEST_FAIL() << missing;
  }
  // Said again after the list of skipped tests, where a reader of the log looks first.
  void TearDown() override {
    const std::string missing = shared_data_missing_message();
    if (!missing.empty()) std::fprintf(stderr, "%s\n", missing.c_str());
  }
};

// Registered before main (gtest_main) calls RUN_ALL_TESTS; gtest owns the object.
[[maybe_unused]] ::testing::Environment* const kSharedDataCheck =
    ::testing::AddGlobalTestEnvironment(new SharedDataCheck);

}  // namespace
}  // namespace specdec::test
