// tests/support/affinity.hpp: the CPUs a test may run on, for the tests that
// pin themselves or a child process (taskset) to one of them.
#pragma once

#include <sched.h>

#include <cstddef>

namespace crew::test {

// The lowest CPU in this process's affinity mask, or -1 if it cannot be read.
inline int first_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(static_cast<std::size_t>(cpu), &set)) return cpu;
  }
  return -1;
}

}  // namespace crew::test
