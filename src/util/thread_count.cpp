#include "util/thread_count.h"

#include <cstdio>
#include <thread>

#include <fmt/format.h>
#include <sched.h>

namespace specdec {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadCount cap_threads(int requested, int cores) {
  if (cores < 1) cores = 1;
  if (requested <= 0) return {cores, {}};
  if (requested <= cores) return {requested, {}};
  return {cores, fmt::format("warning: {} threads requested, but this machine has {} cores; "
                             "using {} (threads beyond the cores only wait for one)",
                             requested, cores, cores)};
}

int compute_threads(int requested) {
  const ThreadCount t = cap_threads(requested, available_cores());
  if (!t.warning.empty()) std::fprintf(stderr, "specdec: %s\n", t.warning.c_str());
  return t.threads;
}

}  // namespace specdec
