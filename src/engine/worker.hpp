// src/engine/worker.hpp (private): a worker, its loop, and the slots its
// fields are grouped in, each owned by a unit:
//   Worker         identity (id, thread), state, the stop flags, the pop
//                  state, and the slots below;
//   WakeSlot       WakePolicy's (wake_policy.hpp): the sleeper stack's word
//                  and the deferred wake-up bookkeeping;
//   RunSlot        the run the Supervisor and a hard shutdown watch, under
//                  run.mu (run.cpp writes it);
//   WorkerCounters the outcomes this worker counted (its thread alone
//                  writes them; stats() reads);
//   WorkerLoop     the thread's body (worker.cpp): start and stop hooks, the
//                  loop that pops cells, attention (pause, resize, stop
//                  requests) and handling a popped cell.
// The worker books (which workers are live, exited, written off) are the
// WorkerRegistry's (worker_registry.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/pool_core.hpp"
#include "crew/detail/queues.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "os_thread.hpp"
#include "stopper.hpp"

namespace crew::detail {

// A counter with a single writer: an increment is a load and a store, no
// locked instruction; any thread may read it. Release/acquire, so that a
// reader that sees a task counted also sees everything the task did (this
// is what makes wait_idle() a synchronization point); free on x86.
class OwnedCounter {
 public:
  void inc() noexcept {
    v_.store(v_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  [[nodiscard]] std::uint64_t get() const noexcept { return v_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::uint64_t> v_{0};
};

struct WorkerCounters {
  OwnedCounter succeeded, failed, cancelled, timed_out, rejected, shed;
  OwnedCounter helped;  // cells this thread took in run_pending()

  void add(TaskStatus outcome) noexcept;
  [[nodiscard]] OutcomeCounts read() const noexcept;
};

inline void add_to(OutcomeCounts& sum, const OutcomeCounts& more) noexcept { sum += more; }

// steady_clock time of a nanosecond count (0: no deadline).
inline std::chrono::steady_clock::time_point time_point_of(std::int64_t ns) noexcept {
  return ns == 0 ? TaskStateBase::kNoDeadline
                 : std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

// A task as reports, snapshots and handlers name it.
inline TaskRef ref_of(const TaskStateBase& s) {
  return TaskRef{s.id, s.name(), s.correlation_id()};
}

// Retires one worker if more than `floor` are live.
inline bool try_retire(std::atomic<std::size_t>& live, std::size_t floor) noexcept {
  std::size_t n = live.load(std::memory_order_relaxed);
  while (n > floor) {
    if (live.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

// A worker's state change made under a lock, announced after it.
struct WorkerStateChange {
  WorkerState from = WorkerState::starting;
  WorkerState to = WorkerState::starting;
  bool changed = false;
};

struct Worker;

// A worker's wake-up bookkeeping, WakePolicy's (wake_policy.hpp): its
// sleeper stack's mutex guards in_idle_stack, the stack's links and
// waker_cpu; everything else is the worker thread's own.
struct WakeSlot {
  // Futex word of the idle stack: bumped by the waker that pops this worker.
  std::atomic<std::uint32_t> word{0};
  bool in_idle_stack = false;  // guarded by the pool's WakePolicy
  // Its neighbours while it is on the stack (the stack is a list through
  // the workers, so that going to sleep never allocates): `above` is
  // nearer the top, which is woken first.
  Worker* above = nullptr;
  Worker* below = nullptr;
  // The CPU the thread that woke this worker ran on (-1 from
  // WakePolicy::wake_all: not a wake-up for work). Written by every waker
  // that takes this worker off the idle stack, under WakePolicy's mutex,
  // before it bumps `word`; read by the worker only after such a wake-up.
  int waker_cpu = -1;
  // When this worker first deferred help for a backlog (wake_due), since it
  // last saw the queue empty; 0: not deferring.
  std::int64_t backlog_since_ns = 0;
  std::uint32_t drained = 0;  // pops since, for sampling the backlog
  // Since when this worker has kept its CPU: its first look at empty
  // queues after it last slept or yielded (0: none yet). See
  // kSpinYieldNs.
  std::int64_t on_cpu_since_ns = 0;
  // Woken onto the CPU of the thread that woke it (the kernel found no idle
  // CPU for it): it has preempted its waker, so it runs what is queued
  // without spinning, and sleeps at the bottom of the idle stack, so that
  // the next wake-up tries another worker. Cleared when it sleeps.
  bool crowded = false;
};

// A worker's top-level run, which the supervisor, a hard shutdown and
// workers() watch: a long task (task state or inline) or a task-state short
// task (for snapshots). The fields under `mu` are written by the worker
// thread when a run starts and ends, and read (or decided, by a write-off)
// by the others; the rest is the worker thread's own.
struct RunSlot {
  mutable SpinLock mu;
  TaskStateBase* task CREW_GUARDED_BY(mu) = nullptr;
  bool is_long CREW_GUARDED_BY(mu) = false;
  std::int64_t started_ns CREW_GUARDED_BY(mu) = 0;
  std::int64_t deadline_ns CREW_GUARDED_BY(mu) = 0;          // 0 = none
  StopReason reason CREW_GUARDED_BY(mu) = StopReason::none;  // inline runs

  RunFrame frame;  // stop source of its top-level long tasks
  // Tasks started so far (worker-written).
  std::atomic<std::uint64_t> seq{0};
  // The end time of the last long run and the `seq` it ended: a run that
  // starts right after it (no other task, no wait in between) reuses it as
  // its start time instead of reading the clock again.
  std::int64_t clock_ns = 0;
  std::uint64_t clock_seq = 0;
};

struct Worker final : Runner {
  Worker(std::uint64_t id_in, PoolCore* core) : id(id_in) {
    run.frame.core = core;
    pop.hint = id_in;
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs an inline long task, or an observed plain task, at this worker's
  // top level (see Runner in pool_core.hpp).
  void run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                void* fn) noexcept override;
  void run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept override;
  void run_admitted(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept override;
  void run_counted(CountedCall call, void* fn) noexcept override { call(fn, *this); }
  void count_outcome(TaskStatus outcome) noexcept override { counts.add(outcome); }

  // A written-off thread starts no more user code (handlers, observers,
  // hooks): its pool may be gone. A call it was already making when it was
  // written off may still be running then.
  [[nodiscard]] bool may_call_user() const noexcept {
    return !abandoned.load(std::memory_order_acquire);
  }

  const std::uint64_t id;
  OsThread thread;  // guarded by WorkerRegistry::mu
  std::atomic<WorkerState> state{WorkerState::starting};
  // The change to `abandoned` made by write_off_locked (under WorkerRegistry::mu),
  // announced by the thread that wrote the worker off once it released the
  // lock (announce_state).
  WorkerStateChange write_off_change;
  std::atomic<bool> exit_requested{false};  // stop_worker
  // Why it leaves: written by its thread when it decides to (or by a
  // write-off); read by snapshots and its stopped event.
  std::atomic<WorkerStopReason> stop_reason{WorkerStopReason::none};
  // Set under run.mu (and WorkerRegistry::mu) when the worker is written off; the
  // worker reads it under run.mu when its run ends, so exactly one of them
  // counts the outcome.
  std::atomic<bool> abandoned{false};
  // Worker-thread only.
  std::uint32_t seen_attention = 0;
  PopState pop;

  WakeSlot wake;
  RunSlot run;
  alignas(kCacheLine) WorkerCounters counts;
};

// The one place a worker's state changes, without its event. The worker
// thread writes its own state; a write-off (supervisor or shutdown) writes
// `abandoned`, after which the thread's own updates are ignored.
// A compare-exchange, not a load then a store: a write-off's `abandoned`
// stored between the two would be overwritten, and the written-off thread
// would look busy or idle again (abandon_busy deciding from it, observers
// hearing of a state after the abandonment).
// A thread that holds WorkerRegistry::mu or the worker's run.mu announces the
// change once it has released them (announce_state), so that observers
// never run under the pool's locks; any other thread calls
// set_worker_state, which does both.
inline WorkerStateChange change_worker_state(Worker& w, WorkerState to) noexcept {
  WorkerState from = w.state.load(std::memory_order_relaxed);
  do {
    if (from == to || from == WorkerState::abandoned) return {};
    CREW_ASSERT(is_legal_transition(from, to), "illegal worker state transition");
  } while (!w.state.compare_exchange_weak(from, to, std::memory_order_relaxed));
  return {from, to, true};
}
// Prepares a stop of the worker's current top-level long run (run.cpp).
// False if there is none.
bool prepare_stop_locked(Worker& w, StopReason why, StopTarget& out) noexcept
    CREW_REQUIRES(w.run.mu);

// A worker thread's body (worker.cpp). One per thread, on its stack, for
// the thread's life; only that thread calls it.
class WorkerLoop {
 public:
  // The thread's entry: hooks, the loop, leaving the books. `spinning`: it
  // was started with a spinning token (for queued work); `replacement`: it
  // replaces a worker that died or was written off.
  static void run(std::shared_ptr<PoolCore> core, std::shared_ptr<Worker> w, bool spinning,
                  bool replacement);

 private:
  // How the loop ended: `counted` if the worker already took itself out of
  // the live count (idle timeout, resize), `leave` if exited() must,
  // `abandoned` if it was written off while running a task.
  enum class Exit : std::uint8_t { counted, leave, abandoned };

  WorkerLoop(PoolCore& core, Worker& w) noexcept : core_(core), w_(w) {}
  Exit loop(bool spinning);
  // Something besides the queue changed. True if the worker must exit,
  // with `how` saying whether it already left the live count.
  // What a worker does before a pop under PoolOptions::max_start_rate:
  // pop (a token taken, or none needed), look again (it waited for a
  // token), or go idle (none due, and nothing queued or another worker
  // waits for it).
  enum class Gate : std::uint8_t { pop, look, idle };
  Gate pace_start() noexcept;
  bool attend(Exit& how);
  // Runs a popped cell; false if the worker was written off meanwhile.
  bool handle_cell(Cell& cell);
  bool handle_state(TaskStateBase* s);
  // Leaves the books (WorkerRegistry::leave_locked) and tells observers.
  void exited(const std::shared_ptr<Worker>& w, Exit how, bool died) noexcept;

  PoolCore& core_;
  Worker& w_;
};

}  // namespace crew::detail
