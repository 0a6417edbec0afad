// src/base/main_scheduling.hpp (private): a helper thread of the pool that
// another thread starts on demand (the coroutine timer, started by the
// first thread to arm a timer, often a worker) inherits that thread's
// scheduling: a worker's policy (SCHED_IDLE, SCHED_BATCH), nice value and
// time slice, set by PoolOptions::worker_policy or on_worker_start. Such a
// thread serves every worker, so it takes the process's main thread's
// instead, as far as the system lets it.
#pragma once

namespace crew::detail {

// Gives the calling thread the scheduling of the process's main thread
// (the thread whose id is the process id): its policy if that is
// SCHED_OTHER, SCHED_BATCH or SCHED_IDLE (a real-time main thread is not
// copied), its nice value and its time slice (Linux 6.12+; 0 elsewhere).
// A nice value below the calling thread's, and leaving SCHED_IDLE, need
// CAP_SYS_NICE (or RLIMIT_NICE): refused, the thread keeps its own nice
// value, then its own policy too, and takes the rest. Linux only;
// elsewhere a no-op.
void adopt_main_thread_scheduling() noexcept;

}  // namespace crew::detail
