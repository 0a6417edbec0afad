// crew/observer.hpp: observers, the pool's extension point for metrics,
// tracing and logging.
//
// An Observer is told about tasks (enqueued, started, finished, rejected),
// workers (started, stopped, replaced, abandoned) and the pool's state
// changes. Install any number with PoolOptions::observers. Each observer says
// which events it wants (events()); the pool does the work for an event
// (reading the clock, say) only if some observer wants it, so a pool without
// observers pays one predictable branch per task.
//
// Callbacks run on the thread where the event happens (a submitter, a
// worker, the supervisor, a thread calling shutdown() or cancel()),
// concurrently with each other: they must be thread-safe, fast and
// noexcept, and must not call member functions of the pool that calls them
// (read stats() from another thread, e.g. at scrape time). on_pool_state
// may run under a lock of the pool, so that observers hear the state
// changes in the order they happened; the others run with none held.
//
// Until when: callbacks can run until the pool's destructor returns, with
// one exception. A worker written off by a hard shutdown (its task went on
// past its stop for abandon_grace) makes no callback after the write-off,
// except one it was already making, and one for the task it was just
// starting or ending when its thread was preempted for about abandon_grace
// in the few steps between the write-off's check and that callback. Such a
// call can come after the destructor returned. The pool holds its observers
// (shared_ptr) until its last thread has ended, so the observer itself is
// alive then; what it refers to may not be.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "crew/error.hpp"
#include "crew/pool_types.hpp"
#include "crew/task_status.hpp"

namespace crew {

// A task as observers see it. Valid for the duration of the call.
struct TaskEvent {
  std::string_view pool{};
  std::uint64_t id = 0;     // 0 for plain fire-and-forget tasks
  std::string_view name{};  // empty for unnamed tasks
  bool is_long = false;
};

class Observer {
 public:
  enum Events : std::uint32_t {
    task_enqueued = 1u << 0,
    task_started = 1u << 1,
    task_finished = 1u << 2,
    task_rejected = 1u << 3,
    worker_events = 1u << 4,  // started, stopped, replaced, abandoned
    pool_state = 1u << 5,
    worker_state = 1u << 6,  // every worker state change (one call per busy/idle flip)
    all_events = (1u << 7) - 1,
  };

  Observer() = default;
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;
  virtual ~Observer() = default;

  // Read once, when the pool is constructed.
  [[nodiscard]] virtual std::uint32_t events() const noexcept { return all_events; }

  // A task entered the queue (on the submitting thread, after the push:
  // until then the submission may still be refused, and a refusal is
  // reported as on_task_rejected instead). A worker may take the task in
  // between, so on_task_started and even on_task_finished of the same task
  // can come first, on another thread: a gauge kept as "enqueued minus
  // started" can dip below zero for that long.
  virtual void on_task_enqueued(const TaskEvent& /*task*/) noexcept {}
  // A task started; queue_wait is the time since it was enqueued.
  virtual void on_task_started(const TaskEvent& /*task*/,
                               std::chrono::nanoseconds /*queue_wait*/) noexcept {}
  // A task that ran ended with `outcome` (succeeded, failed, cancelled or
  // timed_out).
  virtual void on_task_finished(const TaskEvent& /*task*/, TaskStatus /*outcome*/,
                                std::chrono::nanoseconds /*queue_wait*/,
                                std::chrono::nanoseconds /*run_time*/) noexcept {}
  // A task ended without running: refused at submission (`reason` rejected,
  // see `admission`), expired in the queue, dropped by a shutdown, or
  // cancelled while queued. Plain tasks dropped by a shutdown are reported
  // with id 0.
  virtual void on_task_rejected(const TaskEvent& /*task*/, TaskStatus /*outcome*/, Errc /*reason*/,
                                Admission /*admission*/) noexcept {}

  virtual void on_worker_started(std::string_view /*pool*/, std::uint64_t /*worker*/) noexcept {}
  // A worker left the pool, for `reason`: also one whose start hook threw
  // (start_hook_failed: it never reported started), and one written off
  // (written_off: after on_worker_abandoned, while its thread may still run
  // the hung task).
  virtual void on_worker_stopped(std::string_view /*pool*/, std::uint64_t /*worker*/,
                                 WorkerStopReason /*reason*/) noexcept {}
  // A worker that died or was abandoned has been replaced by a new one.
  virtual void on_worker_replaced(std::string_view /*pool*/, std::uint64_t /*worker*/) noexcept {}
  // A worker was written off with a hung task still running on it.
  virtual void on_worker_abandoned(std::string_view /*pool*/, std::uint64_t /*worker*/,
                                   const TaskEvent& /*task*/) noexcept {}

  virtual void on_pool_state(std::string_view /*pool*/, PoolState /*from*/,
                             PoolState /*to*/) noexcept {}
  virtual void on_worker_state(std::string_view /*pool*/, std::uint64_t /*worker*/,
                               WorkerState /*from*/, WorkerState /*to*/) noexcept {}
};

}  // namespace crew
