// src/engine/supervisor.hpp (private): the one thread per pool that serves
// every deadline (the timer heap and the workers' execution deadlines),
// abandons tasks that ignore a stop request past abandon_grace, replaces
// dead and abandoned workers, keeps min_workers, joins exited threads, and
// turns a stop of PoolOptions::stop_token into a hard shutdown. The worker
// books it reads and writes are the WorkerRegistry's, under WorkerRegistry::mu.
//
// Who touches what:
//   thread_, exit_     start(): PoolControl::start; stop(): PoolControl::stop_supervisor
//                      (~Pool, after the final shutdown)
//   alarm_             the supervisor sleeps on it; any thread wakes it
//                      (wake, need_by: a stop request, a deadline armed)
//   timers_            any thread arms and disarms (under the heap's own
//                      mutex); the supervisor fires what is due
//   foreign_           under foreign_mu_: the thread running a long task
//                      outside a worker's top level registers it; a hard
//                      shutdown stops them all (stop_foreign)
//   stopper_           the supervisor and a shutdown hand stop requests;
//                      its own thread fires them (user stop callbacks)
//   root_stop_*        the thread that stops PoolOptions::stop_token sets
//                      the flag; the supervisor takes it
// User code (observers, the logger, stop callbacks) never runs here under
// PoolRuntime::mu or a worker's run.mu: write-offs are announced after the
// locks (announce), stop requests are fired outside them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <vector>

#include "crew/detail/mutex.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "stopper.hpp"
#include "supervisor_alarm.hpp"
#include "timer_heap.hpp"

namespace crew::detail {

class PoolCore;
struct Worker;
struct WriteOffNote;

// The root stop token's callback. Runs on the thread that stops
// PoolOptions::stop_token (or in Supervisor::watch, if it already was): it
// only hands the hard shutdown to the supervisor.
struct RootStop {
  PoolCore* core;
  void operator()() const noexcept;
};
// Registering it must not be able to throw, or a failed PoolControl::start would
// leave the threads running.
static_assert(std::is_nothrow_constructible_v<std::stop_callback<RootStop>, const std::stop_token&,
                                              RootStop>);

class Supervisor {
 public:
  // `core` owns this supervisor (through its PoolRuntime) and outlives it.
  explicit Supervisor(PoolCore& core) noexcept : core_(core) {}
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor() = default;

  // Starts the supervisor thread; throws if it cannot start (PoolControl::start's
  // only step that can throw, so it comes first).
  void start();
  // Hands a stop of `token` to the supervisor as a hard shutdown (once the
  // threads run: registering may call it at once).
  void watch(const std::stop_token& token) noexcept;
  // Whether that token was stopped (why workers leave: WorkerStopReason).
  [[nodiscard]] bool root_stopped() const noexcept {
    return root_stopped_.load(std::memory_order_acquire);
  }
  // Ends the supervisor and the stopper and joins them, then the workers
  // that exited, and drops what is left armed. Blocks until every worker
  // has left the books (after the final shutdown they all are leaving).
  // Not from a worker of the pool (~Pool's last step).
  void stop() noexcept;

  // Has the supervisor look again at once (a stop was requested, a worker
  // exited) or by `deadline_ns` (a deadline just armed). Any thread.
  void wake() noexcept { alarm_.wake(); }
  void need_by(std::int64_t deadline_ns) noexcept { alarm_.need_by(deadline_ns); }
  // PoolOptions::stop_token was stopped (RootStop, on the stopping thread).
  void on_root_stop() noexcept;

  // Timers: `s`'s queue deadline (extras()->queue_deadline) or an
  // execution deadline at `at_ns` (`exec`). The heap holds a reference;
  // arming throws only if it cannot allocate (then it holds none).
  void arm(TaskStateBase* s, std::int64_t at_ns, bool exec);
  void arm_queue_deadline(TaskStateBase* s);
  void disarm(TaskStateBase* s) noexcept;

  // A long task running outside a worker's top level (nested in a wait,
  // or on a submitting thread), with its execution deadline (0: none), for
  // the length of its run: a hard shutdown stops it too.
  void register_foreign(TaskStateBase* s, std::int64_t deadline_ns) noexcept;
  void unregister_foreign(TaskStateBase* s) noexcept;
  // Requests a stop of every registered foreign run (`why`), outside the
  // lock. Throws only if it cannot allocate (then it stops none).
  void stop_foreign(StopReason why);

  // Fires `targets` on the stopper thread (inline if it cannot start).
  void hand_to_stopper(std::vector<StopTarget>& targets) noexcept;
  // After the locks of a write-off are released: tells observers and the
  // logger about each run in `notes` (and drops the references they hold),
  // and each written-off worker's state change.
  void announce(std::vector<WriteOffNote>& notes,
                const std::vector<std::shared_ptr<Worker>>& written_off) noexcept;

 private:
  void loop() noexcept;
  // Fires due timers; returns the time of the next one.
  std::int64_t fire_timers(std::int64_t now);
  // Deadlines and grace periods of the workers' current tasks, abandonment,
  // replacement, min_workers and joining. Returns the next time to look.
  std::int64_t watch_workers(std::int64_t now);

  PoolCore& core_;
  std::thread thread_;
  SupervisorAlarm alarm_;
  std::atomic<bool> exit_{false};
  Stopper stopper_;
  std::atomic<bool> root_stop_pending_{false};
  std::atomic<bool> root_stopped_{false};
  std::optional<std::stop_callback<RootStop>> root_stop_;
  TimerHeap timers_;
  Mutex foreign_mu_;
  std::vector<TaskStateBase*> foreign_ CREW_GUARDED_BY(foreign_mu_);
};

}  // namespace crew::detail
