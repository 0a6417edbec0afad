// src/engine/pool_runtime.hpp (private): PoolRuntime, the part of a pool
// that is not on the submission path, which PoolCore reaches through a
// std::unique_ptr. It owns the units, each with its own header saying who
// touches what: ObserverHub (observer_hub.hpp), BlockedSubmitters
// (blocked_submitters.hpp), Supervisor (supervisor.hpp: its thread, the
// timer heap, the stopper, foreign runs) and ShutdownSequence
// (shutdown_sequence.hpp). Its own fields are the worker books, under
// PoolRuntime::mu, with the calls that need it (*_locked, CREW_REQUIRES).
// Also Worker, whose fields are grouped by the unit that owns them.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "blocked_submitters.hpp"
#include "crew/detail/assert.hpp"
#include "crew/detail/mutex.hpp"
#include "crew/detail/pool_core.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "observer_hub.hpp"
#include "os_thread.hpp"
#include "shutdown_book.hpp"
#include "shutdown_sequence.hpp"
#include "stopper.hpp"
#include "supervisor.hpp"
#include "timer_heap.hpp"

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
  OwnedCounter succeeded, failed, cancelled, timed_out, rejected;
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

// What a write-off tells observers and the logger, kept while the pool's
// locks are held and announced after they are released
// (Supervisor::announce).
//
// The rule: user code never runs under a worker's run.mu, and under
// PoolRuntime::mu only Observer::on_pool_state does. start, resume, shutdown and
// restart change the pool's state under PoolRuntime::mu (with the shutdown book
// and the worker list), and emit the edge there, so that observers hear the
// edges in the order they happened. Everything else (worker events, task
// events, the logger, handlers, stop callbacks) runs after the locks.
struct WriteOffNote {
  TaskStateBase* task = nullptr;  // holds a reference; null for a plain run
  TaskStatus outcome = TaskStatus::cancelled;
  std::uint64_t worker = 0;
  std::int64_t enqueued_ns = 0;
  std::int64_t started_ns = 0;
  std::int64_t ended_ns = 0;
};

// Worker threads that could not be started (pthread_create failed: EAGAIN
// at a container's pids.max, ENOMEM). Nothing else would try again for a
// task already queued, so the supervisor does, with a backoff (1 ms doubling
// to 1 s), while tasks are queued and the pool may start workers; it also
// logs the failures, outside the pool's locks. Guarded by PoolRuntime::mu.
class SpawnRetry {
 public:
  void failed(const char* what, std::int64_t now) noexcept {
    backoff_ = std::clamp<std::chrono::nanoseconds>(backoff_ * 2, std::chrono::milliseconds(1),
                                                    std::chrono::seconds(1));
    retry_at_ns_ = now + backoff_.count();
    due_ = true;
    ++unlogged_;
    try {
      error_ = what;
    } catch (...) {  // out of memory for the message: the count still tells
    }
  }
  void succeeded() noexcept {
    due_ = false;
    backoff_ = std::chrono::nanoseconds(0);
  }
  void forget() noexcept { due_ = false; }  // nothing queued needs it any more
  [[nodiscard]] bool due() const noexcept { return due_; }
  [[nodiscard]] std::int64_t retry_at_ns() const noexcept { return retry_at_ns_; }
  [[nodiscard]] std::chrono::nanoseconds backoff() const noexcept { return backoff_; }
  // Failures since the last call, and the last one's message.
  std::uint64_t take_unlogged(std::string& error) {
    error = error_;
    return std::exchange(unlogged_, 0);
  }

 private:
  bool due_ = false;
  std::chrono::nanoseconds backoff_{0};
  std::int64_t retry_at_ns_ = 0;
  std::uint64_t unlogged_ = 0;
  std::string error_;
};

// A worker's state change made under a lock, announced after it.
struct WorkerStateChange {
  WorkerState from = WorkerState::starting;
  WorkerState to = WorkerState::starting;
  bool changed = false;
};

// A worker's wake-up bookkeeping: the wake-up policy's (wake.cpp) and the
// idle stack's (IdleWorkers, whose mutex guards in_idle_stack and
// waker_cpu). Everything else is the worker thread's own.
struct WakeSlot {
  // Futex word of the idle stack: bumped by the waker that pops this worker.
  std::atomic<std::uint32_t> word{0};
  bool in_idle_stack = false;  // guarded by the pool's IdleWorkers
  // The CPU the thread that woke this worker ran on (-1 from
  // IdleWorkers::wake_all: not a wake-up for work). Written by every waker
  // that takes this worker off the idle stack, under IdleWorkers' mutex,
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
  void run_counted(CountedCall call, void* fn) noexcept override { call(fn, *this); }
  void count_outcome(TaskStatus outcome) noexcept override { counts.add(outcome); }

  // A written-off thread starts no more user code (handlers, observers,
  // hooks): its pool may be gone. A call it was already making when it was
  // written off may still be running then.
  [[nodiscard]] bool may_call_user() const noexcept {
    return !abandoned.load(std::memory_order_acquire);
  }

  const std::uint64_t id;
  OsThread thread;  // guarded by PoolRuntime::mu
  std::atomic<WorkerState> state{WorkerState::starting};
  // The change to `abandoned` made by write_off_locked (under PoolRuntime::mu),
  // announced by the thread that wrote the worker off once it released the
  // lock (announce_state).
  WorkerStateChange write_off_change;
  std::atomic<bool> exit_requested{false};  // stop_worker
  // Why it leaves: written by its thread when it decides to (or by a
  // write-off); read by snapshots and its stopped event.
  std::atomic<WorkerStopReason> stop_reason{WorkerStopReason::none};
  // Set under run.mu (and PoolRuntime::mu) when the worker is written off; the
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
// A thread that holds PoolRuntime::mu or the worker's run.mu announces the
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
struct PoolRuntime {
  PoolRuntime(PoolCore& core, const PoolOptions& options)
      : observers(options),
        blocked(options.queue_capacity, options.priority_levels),
        supervisor(core),
        shutdown(core, *this) {}

  // The observers and the events they hear (user code: never called under
  // a worker's run.mu; under `mu` only for pool-state edges, see
  // WriteOffNote).
  const ObserverHub observers;

  mutable Mutex mu;
  std::vector<std::shared_ptr<Worker>> workers CREW_GUARDED_BY(mu);    // live
  std::vector<std::shared_ptr<Worker>> exited CREW_GUARDED_BY(mu);     // to join
  std::vector<std::shared_ptr<Worker>> abandoned CREW_GUARDED_BY(mu);  // detached
  OutcomeCounts retired CREW_GUARDED_BY(mu);                           // counters of joined workers
  std::uint64_t retired_helped CREW_GUARDED_BY(mu) = 0;
  std::uint64_t next_worker_id CREW_GUARDED_BY(mu) = 0;
  std::uint64_t workers_replaced CREW_GUARDED_BY(mu) = 0;
  std::uint64_t tasks_abandoned CREW_GUARDED_BY(mu) = 0;
  // Workers that died (a start hook threw) or were abandoned, to start again.
  std::size_t replacements_due CREW_GUARDED_BY(mu) = 0;
  std::chrono::nanoseconds replace_backoff CREW_GUARDED_BY(mu){0};
  std::int64_t next_replace_ns CREW_GUARDED_BY(mu) = 0;
  SpawnRetry spawns CREW_GUARDED_BY(mu);
  // A worker exited or was written off; pause ended.
  std::condition_variable workers_changed;
  // A worker found PoolOptions::worker_policy refused (warned once).
  std::atomic<bool> policy_refused{false};

  // Shutdowns: one runs at a time (ShutdownSequence); the others wait for
  // its report. Under `mu`: the sequence, write-offs and drops add to it.
  ShutdownBook shutdowns CREW_GUARDED_BY(mu);

  // Submitters blocked on a full shared queue; released in batches once it
  // is down to half its capacity.
  BlockedSubmitters blocked;

  // Deadlines, write-offs, replacements (src/engine/supervisor.hpp).
  Supervisor supervisor;
  // Shutdown and restart (src/engine/shutdown_sequence.hpp).
  ShutdownSequence shutdown;

  // ---- the worker books: calls that need `mu` (and a worker's run.mu
  // where named), checked by clang's -Wthread-safety. Each takes the pool's
  // PoolCore for the counters it shares with the submission path. None calls
  // user code (observers and the logger hear of what they did after the
  // locks are released).

  // Starts a worker thread (pool_core.cpp). The caller has already counted
  // it in live_workers_. `spinning`: the new worker starts with a spinning
  // token (it was started for queued work, so it must bring in help if it
  // finds more). A failure is kept for the supervisor, which logs it and
  // tries again while tasks are queued. Returns the new worker's id, 0 if
  // its thread could not start.
  std::uint64_t spawn_worker_locked(PoolCore& core, bool replacement,
                                    bool spinning = false) noexcept CREW_REQUIRES(mu);
  // Tries again to start a worker whose thread could not be started
  // (supervisor.cpp). Returns when to look again.
  std::int64_t retry_spawn_locked(PoolCore& core, std::int64_t now) noexcept CREW_REQUIRES(mu);
  // Every outcome counted so far (pool_core.cpp).
  [[nodiscard]] OutcomeCounts totals_locked(const PoolCore& core) const CREW_REQUIRES(mu);
  // Writes a worker off (supervisor.cpp): it leaves the books and its thread
  // is detached. Its state change is kept in w->write_off_change for the
  // caller to announce after releasing `mu`.
  void write_off_locked(PoolCore& core, const std::shared_ptr<Worker>& w) noexcept
      CREW_REQUIRES(mu);
  // Decides the outcome of the worker's current run as abandoned
  // (supervisor.cpp); `notes` must have room for one more note (reserved by
  // the caller), which Supervisor::announce delivers after the locks.
  void write_off_run_locked(PoolCore& core, Worker& w, ShutdownReport* report,
                            std::vector<WriteOffNote>& notes) noexcept CREW_REQUIRES(mu, w.run.mu);
};

// Tells observers of a change made by change_worker_state; no lock held.
inline void announce_state(const Worker& w, const WorkerStateChange& change) noexcept {
  if (!change.changed) return;
  PoolCore& c = *w.run.frame.core;
  if (c.observes(Observer::worker_state)) [[unlikely]]
    c.runtime().observers.worker_state(w.id, change.from, change.to);
}
// A state change and its event, on a thread that holds none of the pool's
// locks.
inline void set_worker_state(Worker& w, WorkerState to) noexcept {
  announce_state(w, change_worker_state(w, to));
}

// Prepares a stop of the worker's current top-level long run (run.cpp).
// False if there is none.
bool prepare_stop_locked(Worker& w, StopReason why, StopTarget& out) noexcept
    CREW_REQUIRES(w.run.mu);

// PoolCore's calls into its PoolRuntime that the engine makes on hot paths (a
// worker's pop), inline here where PoolRuntime is complete.
inline void PoolCore::on_slot_freed() noexcept { rt_->blocked.slot_freed(queue_); }

}  // namespace crew::detail
