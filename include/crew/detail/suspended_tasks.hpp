// crew/detail/suspended_tasks.hpp: the pool's view of its tasks that wait
// without a thread (coroutine tasks, crew/coro.hpp).
//
// A coroutine task that is suspended is in no queue and on no worker, so
// the shutdown sequence cannot find it by itself. The coroutine layer
// installs one SuspendedTasks per pool (PoolCore::install_suspended, on the
// first spawn); the pool owns it from then on and destroys it with its
// core. A shutdown calls shut_down() first, on the shutdown's thread, while
// the pool still runs tasks, so that the coroutines' resumptions and the
// destruction of their frames happen on the pool's workers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "crew/pool_types.hpp"

namespace crew::detail {

class SuspendedTasks {
 public:
  SuspendedTasks() = default;
  SuspendedTasks(const SuspendedTasks&) = delete;
  SuspendedTasks& operator=(const SuspendedTasks&) = delete;
  virtual ~SuspendedTasks() = default;

  // The coroutine tasks' part of a shutdown in `mode`: drain waits for them
  // to end until `deadline`; soft and hard (and a drain past its deadline)
  // stop them and wait `grace` more; the frames still alive then are
  // destroyed and listed in `report`. Returns true if it had to go past
  // the drain (the shutdown then reports escalated). Blocks the calling
  // (shutdown) thread, never a worker.
  virtual bool shut_down(ShutdownMode mode, std::chrono::steady_clock::time_point deadline,
                         std::chrono::nanoseconds grace, ShutdownReport& report) noexcept = 0;

  // ---- timers fired by idle workers (src/engine/wake.cpp) ----
  // A worker about to sleep sleeps no longer than the earliest timer and
  // fires what is due itself, its steps into its own queue: a sleep's end
  // then costs one wake-up (the worker's), not the timer thread's and a
  // worker's in a row. The timer thread stays, for the timers due while
  // every worker is busy or asleep past them.
  //
  // The earliest timer armed (steady_clock ns), 0 if none. Any thread;
  // relaxed: a timer armed after a worker read this is the timer thread's
  // (or the next idle worker's).
  [[nodiscard]] std::int64_t next_due_ns() const noexcept {
    return next_due_ns_.load(std::memory_order_relaxed);
  }
  // Fires the timers due by `now` on the calling thread, an idle worker of
  // the pool that holds a spinning token (its pushes wake nobody).
  virtual void fire_due(std::int64_t now) noexcept = 0;
  // A worker sleeps until `due` (begin) and woke (end). While one does, the
  // timer thread looks at that timer only as a backstop, later.
  void begin_timer_watch(std::int64_t due) noexcept {
    watched_ns_.store(due, std::memory_order_relaxed);
    watchers_.fetch_add(1, std::memory_order_relaxed);
  }
  void end_timer_watch() noexcept { watchers_.fetch_sub(1, std::memory_order_relaxed); }

 protected:
  // Whether some worker sleeps until `due` or earlier (approximate: the
  // deadline is the last watcher's).
  [[nodiscard]] bool timer_watched(std::int64_t due) const noexcept {
    return watchers_.load(std::memory_order_relaxed) > 0 &&
           watched_ns_.load(std::memory_order_relaxed) <= due;
  }
  // Written by the implementation whenever its earliest timer changes.
  std::atomic<std::int64_t> next_due_ns_{0};

 private:
  std::atomic<int> watchers_{0};
  std::atomic<std::int64_t> watched_ns_{0};
};

}  // namespace crew::detail
