// tests/support/affinity.hpp: the CPUs a test may run on, for the tests that
// pin themselves or a child process (taskset) to one of them; and whether it
// may put a thread under a real-time policy.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <cstddef>
#include <thread>

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

// Whether this process may put a thread under SCHED_FIFO (CAP_SYS_NICE or
// RLIMIT_RTPRIO), asked on a thread of its own; a child process inherits
// the right.
inline bool may_use_fifo() {
  bool allowed = false;
  std::thread([&] {
    sched_param param{};
    param.sched_priority = 1;
    allowed = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &param) == 0;
  }).join();
  return allowed;
}

}  // namespace crew::test
