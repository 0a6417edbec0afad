// service/http/time_slice.hpp: a thread's time slice under Linux's EEVDF
// scheduler (http.io_slice_us). A thread woken with a shorter slice than
// the running thread's preempts it at once; with an equal or longer one it
// waits up to the end of the running thread's slice (1.4 ms on a 2-CPU
// machine, more with more CPUs). A thread started by another inherits its
// slice: crewd's pool workers, which an I/O thread may start, set theirs
// back to the system's.
#pragma once

#include <chrono>
#include <string>

namespace crewd {

// Asks the kernel for a time slice of `slice` for the calling thread
// (sched_setattr(2): sched_runtime under its current policy and nice; Linux
// 6.12 and later read it as the slice, within 100 us - 100 ms; older ones
// ignore it). 0 gives it the system's slice back. Returns "" on success,
// else why not (also under a real-time policy, which has no slice).
[[nodiscard]] std::string set_time_slice(std::chrono::microseconds slice);

}  // namespace crewd
