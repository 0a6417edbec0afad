// service/http/scheduling.hpp: how Linux schedules crewd's threads.
//
// A thread's time slice under the EEVDF scheduler (http.io_slice_us,
// jobs.worker_slice_us). A thread woken with a shorter slice than the
// running thread's preempts it at once; with an equal or longer one it
// waits up to the end of the running thread's slice (1.4 ms on a 2-CPU
// machine, more with more CPUs). A thread started by another inherits its
// slice: crewd's pool workers, which an I/O thread may start, set theirs
// back to the system's.
//
// The real-time policy of the I/O threads (http.io_policy = fifo). EEVDF
// lets a woken thread preempt only if it is owed CPU time, and jobs workers
// that sleep and wake with lag of their own can keep a woken I/O thread
// waiting for a whole job (docs/bench/overload.md, "W3 with real-time I/O
// threads"). A SCHED_FIFO thread preempts every normal one.
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

// Puts the calling thread under SCHED_FIFO at `priority` (1-99), with
// SCHED_RESET_ON_FORK: a thread it starts later (a pool worker that grows
// the pool on a submission) starts under SCHED_OTHER, not real-time.
// Returns "" on success, else why not (EPERM without CAP_SYS_NICE or an
// RLIMIT_RTPRIO of at least `priority`).
[[nodiscard]] std::string set_real_time(int priority);

}  // namespace crewd
