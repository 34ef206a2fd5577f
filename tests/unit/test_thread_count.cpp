// The compute-thread count: a request above the machine's cores is capped with a warning (it
// used to start them all: -t 1000 took 25 s for 4 tokens), 0 means all cores, and a request
// within the cores is obeyed as is.
#include <gtest/gtest.h>

#include <thread>

#include "util/thread_count.h"

namespace specdec {
namespace {

TEST(ThreadCount, AboveTheCoresIsCappedWithAWarning) {
  const ThreadCount t = cap_threads(1000, 2);
  EXPECT_EQ(t.threads, 2);
  EXPECT_NE(t.warning.find("1000 threads requested"), std::string::npos) << t.warning;
  EXPECT_NE(t.warning.find("2 cores"), std::string::npos) << t.warning;
}

TEST(ThreadCount, WithinTheCoresIsObeyedSilently) {
  for (int n = 1; n <= 8; ++n) {
    const ThreadCount t = cap_threads(n, 8);
    EXPECT_EQ(t.threads, n);
    EXPECT_TRUE(t.warning.empty()) << t.warning;
  }
}

TEST(ThreadCount, ZeroOrLessMeansAllCores) {
  EXPECT_EQ(cap_threads(0, 6).threads, 6);
  EXPECT_EQ(cap_threads(-3, 6).threads, 6);
  EXPECT_TRUE(cap_threads(0, 6).warning.empty());
}

TEST(ThreadCount, AnUnknownCoreCountCountsAsOne) {
  EXPECT_EQ(cap_threads(0, 0).threads, 1);
  EXPECT_EQ(cap_threads(4, 0).threads, 1);
}

TEST(ThreadCount, AvailableCoresIsWithinTheMachine) {
  const int cores = available_cores();
  EXPECT_GE(cores, 1);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0) EXPECT_LE(cores, static_cast<int>(hw));
  EXPECT_EQ(compute_threads(cores + 1000), cores);
  EXPECT_EQ(compute_threads(0), cores);
}

}  // namespace
}  // namespace specdec
