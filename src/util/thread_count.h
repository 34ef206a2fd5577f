// How many compute threads to start. More threads than cores never helps a data-parallel kernel
// (the extra threads only wait for a core, and a spinning pool makes that wait expensive:
// `-t 1000` once took 25 s for 4 tokens), so a request above the core count is capped with a
// warning instead of obeyed.
#pragma once

#include <string>

namespace specdec {

// The cores this process may run on: its CPU affinity mask (so `taskset` and container limits
// count), or std::thread::hardware_concurrency() where the mask cannot be read; at least 1.
int available_cores();

struct ThreadCount {
  int threads = 1;
  std::string warning;  // empty unless the request was capped
};

// requested <= 0 means "all cores". Pure, for tests: `cores` is the machine's count.
ThreadCount cap_threads(int requested, int cores);

// cap_threads(requested, available_cores()), with the warning (if any) printed on stderr.
int compute_threads(int requested);

}  // namespace specdec
