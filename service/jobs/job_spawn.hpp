// service/jobs/job_spawn.hpp: a job as a coroutine task whose outcome is
// delivered on an I/O thread, as crew::asio::async_try_submit delivers a
// thread task's: the route hands the job to the pool and returns, and the
// connection answers once the task has ended. No thread waits meanwhile.
//
// Exactly one delivery per spawn, always posted to `io` (never run inside
// async_try_spawn), which is kept busy (outstanding work) until then:
//   the task ended         null for succeeded, else what the handle's get()
//                          throws (the coroutine's exception; crew::Error
//                          for cancelled, timed_out, abandoned,
//                          shutdown_dropped, expired);
//   refused at admission   crew::Error(rejected) with admission() saying why
//                          (posted at once: the frame is destroyed unrun);
//   queue deadline         crew::Error(expired) at `queue_timeout` if the
//                          task's start has not run by then, however busy the
//                          workers are; the task is cancelled, and its start,
//                          when a worker takes it, destroys the frame unrun.
//
// The end of a task is seen from its frame: the frame is destroyed (run to
// its end, dropped unrun, or abandoned at a shutdown) just before the task
// publishes its outcome, so the delivery, posted from there, looks at the
// handle again on a timer (OutcomeBackoff) until it is ready.
//
// Threads: async_try_spawn and the delivery run on `io`'s thread, which
// must be the only one running it (an I/O thread of crewd's server); the
// frame's end posts from whichever thread destroys it, through a
// crew::asio::PostSlot reserved at the spawn (no lock of the io_context).
#pragma once

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <crew/coro.hpp>
#include <crew/pool.hpp>
#include <exception>
#include <functional>
#include <memory>

namespace crewd {

using JobDone = std::function<void(std::exception_ptr)>;

// The waits of an I/O thread that heard of a task's end a moment before
// the task's outcome is published (by the thread that ran it): 20 us,
// doubled each time, at most 1 ms. A timer, not a loop of posts: the
// publishing thread may have been preempted by this very I/O thread, woken
// by the news, and a loop would keep the I/O thread on the CPU the other
// one waits for (under SCHED_IDLE jobs workers, for milliseconds).
class OutcomeBackoff {
 public:
  // The wait before the next look.
  std::chrono::microseconds next() noexcept {
    const std::chrono::microseconds d = wait_;
    wait_ = std::min(2 * wait_, kMost);
    return d;
  }

 private:
  static constexpr std::chrono::microseconds kMost{1000};
  std::chrono::microseconds wait_{20};
};

// Spawns `body` on `pool` (crew::try_spawn: never blocks) with `opts`,
// stores the task's handle in `*handle` before it returns, and delivers the
// outcome to `done` on `io` (above). opts.queue_timeout is the deadline of
// the task's start (0: none). Throws crew::Error(invalid_options) for bad
// options, before anything is spawned or delivered.
void async_try_spawn(crew::Pool& pool, boost::asio::io_context::executor_type io,
                     crew::Co<void> body, crew::TaskOptions opts, JobDone done,
                     const std::shared_ptr<crew::Task<void>>& handle);

}  // namespace crewd
