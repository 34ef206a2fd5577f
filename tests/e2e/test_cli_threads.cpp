// `-t` above the machine's cores, through the built binary: the command runs with as many
// threads as there are cores (bench reports the pool it started) and says so on stderr, instead
// of starting every thread asked for.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "common/test_paths.h"
#include "util/thread_count.h"

namespace specdec {
namespace {

TEST(CliThreads, MoreThreadsThanCoresAreCappedWithAWarning) {
  const std::string err = std::string(SPECDEC_BINARY_DIR) + "/cli_threads.stderr";
  const std::string cmd = std::string(SPECDEC_BINARY_DIR) + "/specdec bench -m " +
                          test::tiny_model("stories260K.gguf") +
                          " -p 16 -n 4 -r 1 -t 1000 --output-format json 2>" + err;
  int status = 0;
  const std::string out = test::run_stdout(cmd, &status);
  ASSERT_EQ(status, 0) << cmd << "\n" << test::read_file(err);
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("threads").get<int>(), available_cores());
  const std::string log = test::read_file(err);
  EXPECT_NE(log.find("warning: 1000 threads requested"), std::string::npos) << log;
}

TEST(CliThreads, ThreadsWithinTheCoresAreObeyedWithoutAWarning) {
  const std::string err = std::string(SPECDEC_BINARY_DIR) + "/cli_threads_one.stderr";
  const std::string cmd = std::string(SPECDEC_BINARY_DIR) + "/specdec bench -m " +
                          test::tiny_model("stories260K.gguf") +
                          " -p 16 -n 4 -r 1 -t 1 --output-format json 2>" + err;
  int status = 0;
  const std::string out = test::run_stdout(cmd, &status);
  ASSERT_EQ(status, 0) << cmd << "\n" << test::read_file(err);
  EXPECT_EQ(nlohmann::json::parse(out).at("threads").get<int>(), 1);
  EXPECT_EQ(test::read_file(err).find("warning"), std::string::npos);
}

}  // namespace
}  // namespace specdec
