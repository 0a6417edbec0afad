// src/coro/coro_hub.hpp (private): a pool's coroutine tasks: the registry
// of those alive, their timer, and their part of the pool's shutdown.
//
// One hub per pool, made on its first spawn and owned by the pool's core
// (PoolCore::install_suspended), destroyed first of the core's parts.
//
// Who touches what:
//   registry           spawning threads enroll; the thread that ends a task
//                       leaves; a shutdown and the snapshot read it. Lists
//                       in kShards shards (by spawning thread) under a
//                       spin lock each, with a count each (one mutex's
//                       lock and unlock were 8% of fib(30)'s samples as
//                       coroutines, one shared count 4%). A task spawned
//                       from a coroutine task of the same pool is not
//                       listed: it is found in its parent's children
//                       (CoroStop), and listed here only if its parent
//                       ends first (hand_off). So no listed task means no
//                       live task.
//   timer (timer_mu_)   a task's own thread arms its sleeps and polls; the
//                       task's start arms its deadline; a thread whose step
//                       push found the queue full arms a retry; an idle
//                       worker (fire_due) and the timer thread pop what is
//                       due and act outside the lock. While a worker sleeps
//                       until the earliest timer, the timer thread waits
//                       kBackstopNs past it, for the case where that worker
//                       was woken for other work meanwhile.
// The timer thread starts on the first timer armed and is joined by the
// destructor. It (or the idle worker that fires a timer) runs no user code
// but the stop callbacks of a task whose deadline it fires
// (std::stop_source::request_stop runs them there).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "crew/coro.hpp"
#include "crew/detail/coro_task.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/suspended_tasks.hpp"

namespace crew::detail {

class CoroHub final : public SuspendedTasks {
 public:
  // The hub of `core`, made and installed on first use.
  static CoroHub& of(PoolCore& core);

  CoroHub() noexcept = default;
  ~CoroHub() override;

  // A new task (or one whose parent ended, CoroStop::hand_off): false
  // (refuse it, Admission::closed) while a shutdown runs this hub's part
  // and the task is not spawned from a coroutine task. Else it holds the
  // reference the task took for it until leave().
  bool enroll(CoroTaskBase* t, bool from_coroutine);
  void leave(CoroTaskBase* t) noexcept;
  // Around a task's hand-off of its children to the registry (their
  // enroll): a walk of the registry that overlaps one starts again.
  void begin_hand_off() noexcept { hand_offs_begun_.fetch_add(1, std::memory_order_seq_cst); }
  void end_hand_off() noexcept { hand_offs_ended_.fetch_add(1, std::memory_order_seq_cst); }

  // Timers. Each holds a reference to the task (and to `awaited`). May
  // throw (out of memory, the timer thread cannot start), arming nothing.
  void arm_wake(CoroTaskBase* t, std::uint64_t gen, std::int64_t at_ns);
  void arm_deadline(CoroTaskBase* t, std::int64_t at_ns);
  void arm_poll(CoroTaskBase* t, std::uint64_t gen, TaskStateBase* awaited);
  // A claimed task whose step found the queue full: queued again shortly.
  // Never throws: out of memory, the frame is abandoned here instead.
  void retry(CoroTaskBase* t, bool abandon) noexcept;

  bool shut_down(ShutdownMode mode, std::chrono::steady_clock::time_point deadline,
                 std::chrono::nanoseconds grace, ShutdownReport& report) noexcept override;
  // Whether the calling thread is this hub's timer thread.
  [[nodiscard]] bool on_timer_thread() const noexcept;
  // An idle worker's turn at the timers (SuspendedTasks): fires those due
  // by `now` on it, one at a time, outside the timer lock.
  void fire_due(std::int64_t now) noexcept override;

  // The live tasks and the suspended ones (crew::coroutine_tasks).
  CoroutineTasks report();

  // Listed coroutine tasks (their children not counted): 0 when no
  // coroutine task is alive.
  [[nodiscard]] std::size_t live() const noexcept;

 private:
  enum class Kind : std::uint8_t { wake, deadline, poll, retry, retry_abandon };
  struct Entry {
    std::int64_t at_ns;
    Kind kind;
    CoroTaskBase* task;
    std::uint64_t gen;
    TaskStateBase* awaited;  // poll: the task waited for
    std::int64_t backoff_ns;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const noexcept { return a.at_ns > b.at_ns; }
  };
  void push(Entry e);
  // Under timer_mu_, after any change of the heap: its earliest deadline,
  // for the workers (SuspendedTasks::next_due_ns).
  void publish_next() noexcept;
  void timer_loop() noexcept;
  void fire(Entry& e) noexcept;
  // Whether no task is alive, each shard's count read under its lock (a
  // leave() that a waiter does not see in the count sees the waiter).
  bool none_live() noexcept;
  // Waits until no task is alive or `deadline`; true if none is.
  bool wait_all(std::chrono::steady_clock::time_point deadline);
  // The tasks alive now (the listed ones and, through them, their
  // children), each with a reference; parents before their children.
  std::vector<CoroTaskBase*> snapshot();

  static constexpr std::size_t kShards = 16;
  // A task is listed in the shard of the thread that spawned it (its
  // reg_shard): a worker's spawns and ends touch its own shard's line.
  struct alignas(64) Shard {
    SpinLock mu;
    CoroTaskBase* head CREW_GUARDED_BY(mu) = nullptr;
    // Written under mu, read by live() without it.
    std::atomic<std::size_t> count{0};
  };
  static std::size_t this_thread_shard() noexcept;
  std::array<Shard, kShards> shards_;
  // Shutdowns waiting for the live count to reach 0 (wait_all): the last
  // task to leave tells them.
  std::atomic<int> idle_waiters_{0};
  // Hand-offs begun and ended: a snapshot that saw as many ended before its
  // walk as begun after it missed no task moving from a list to a shard.
  std::atomic<std::uint64_t> hand_offs_begun_{0};
  std::atomic<std::uint64_t> hand_offs_ended_{0};
  // A shutdown runs this hub's part: set before it reads the shards, read
  // by enroll under a shard's lock.
  std::atomic<bool> closing_{false};
  // The last task to leave tells a waiting shutdown.
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;

  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  std::vector<Entry> heap_;  // guarded by timer_mu_ (a min-heap by Later)
  bool timer_stop_ = false;  // guarded by timer_mu_
  // Guarded by timer_mu_: when the waiting timer thread wakes next
  // (INT64_MAX: no timer; 0: it is awake). An armed timer wakes it only if
  // that is more than kBackstopNs too late: an idle worker fires it before
  // (SuspendedTasks), and while every worker is busy its resumption would
  // wait for one anyway.
  std::int64_t timer_wakes_at_ = 0;
  // The timer thread's own: the due entries it fires after letting go of
  // timer_mu_, at most kDueBatch a round. Reserved before the thread
  // starts, so that its noexcept loop never allocates.
  static constexpr std::size_t kDueBatch = 256;
  std::vector<Entry> due_;
  std::thread timer_;  // started under timer_mu_
};

}  // namespace crew::detail
