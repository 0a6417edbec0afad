// src/engine/worker_registry.hpp (private): WorkerRegistry, the pool's
// books of its worker threads: which are live, which exited and wait to be
// joined, which were written off (detached, their counts still the pool's),
// the totals of those gone, the replacements due and the threads that could
// not be started.
//
// Who touches what: everything under `mu`, which its *_locked calls
// require (checked by clang's -Wthread-safety).
//   a worker thread   leaves the books when its loop ends (leave_locked);
//   the supervisor    writes off hung workers, starts replacements and
//                     min_workers, retries failed starts, joins exited
//                     threads;
//   submitters        start a worker (PoolCore::grow: spawn_locked);
//   a shutdown        walks the live workers, writes off those that hang,
//                     waits for the list to empty (`changed`);
//   stats(), workers() read.
// `mu` also guards PoolRuntime::shutdowns, and the pool's state edges made
// by start, resume, shutdown and restart are made under it (WriteOffNote
// says why). None of the calls here runs user code.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crew/detail/mutex.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "worker.hpp"

namespace crew::detail {

// What a write-off tells observers and the logger, kept while the pool's
// locks are held and announced after they are released
// (Supervisor::announce).
//
// The rule: user code never runs under a worker's run.mu, and under
// WorkerRegistry::mu only Observer::on_pool_state does. start, resume,
// shutdown and restart change the pool's state under WorkerRegistry::mu
// (with the shutdown book and the worker list), and emit the edge there, so
// that observers hear the edges in the order they happened. Everything else (worker events, task
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
// logs the failures, outside the pool's locks. Guarded by WorkerRegistry::mu.
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

class WorkerRegistry {
 public:
  explicit WorkerRegistry(PoolCore& core) noexcept : core_(core) {}
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  mutable Mutex mu;
  // Notified (after `mu` is released, or under it) when a worker leaves the
  // books (exited or written off), a pause ends, or a shutdown is asked to
  // escalate. Waited on with `mu` held: a shutdown waiting for the last
  // worker, a paused worker, Supervisor::stop.
  std::condition_variable changed;

  // ---- the live workers ----
  [[nodiscard]] const std::vector<std::shared_ptr<Worker>>& live_locked() const CREW_REQUIRES(mu) {
    return workers_;
  }
  // The live worker `id`; null if there is none.
  [[nodiscard]] Worker* find_locked(std::uint64_t id) const CREW_REQUIRES(mu);
  // Starts a worker thread. The caller has already counted it in the pool's
  // live count. `spinning`: the new worker starts with a spinning token (it
  // was started for queued work, so it must bring in help if it finds
  // more). A failure is kept for the supervisor, which logs it and tries
  // again while tasks are queued. Returns the new worker's id, 0 if its
  // thread could not start.
  std::uint64_t spawn_locked(bool replacement, bool spinning = false) noexcept CREW_REQUIRES(mu);

  // ---- leaving the books ----
  // What leave_locked did, for its caller to announce after the lock.
  struct Left {
    bool written_off = false;  // written off before it left: nothing to announce
    bool last = false;         // the last live worker left
    WorkerStateChange stopped;
  };
  // A worker's thread leaves the books as its loop ends: its counts join
  // the totals; unless it was written off, it is joined later by the
  // supervisor. `counted`: it already left the live count (idle timeout,
  // resize). `died`: its start hook threw, so a replacement is due (after a
  // backoff of 1 ms doubling to 1 s).
  Left leave_locked(const std::shared_ptr<Worker>& w, bool counted, bool died) noexcept
      CREW_REQUIRES(mu);
  // Decides the outcome of the worker's current run as abandoned; `notes`
  // must have room for one more note (reserved by the caller), which
  // Supervisor::announce delivers after the locks.
  void write_off_run_locked(Worker& w, ShutdownReport* report,
                            std::vector<WriteOffNote>& notes) noexcept CREW_REQUIRES(mu, w.run.mu);
  // Writes a worker off: it leaves the books and its thread is detached.
  // Its state change is kept in w->write_off_change for the caller to
  // announce after releasing `mu`. `replace`: a replacement is due at once.
  void write_off_locked(const std::shared_ptr<Worker>& w, bool replace) noexcept CREW_REQUIRES(mu);
  // Moves the exited workers into `out`, to be joined outside the lock.
  void take_exited_locked(std::vector<std::shared_ptr<Worker>>& out) CREW_REQUIRES(mu) {
    out.swap(exited_);
  }

  // ---- keeping the pool's capacity (the supervisor) ----
  [[nodiscard]] std::size_t replacements_due_locked() const CREW_REQUIRES(mu) {
    return replacements_due_;
  }
  // Starts the replacements that are due, then workers up to min_workers,
  // while the pool runs (a stopped pool forgets them: restart() starts its
  // workers), and retries a thread that could not be started (not once a
  // running shutdown has closed the workers: `workers_closed`, its
  // ShutdownBook's). Notes the replacements' ids in `replaced` while it
  // has room. Returns when to look again (kNever: not for this).
  std::int64_t keep_capacity_locked(std::int64_t now, std::vector<std::uint64_t>& replaced,
                                    bool workers_closed) noexcept CREW_REQUIRES(mu);
  // Failures to start a thread since the last call, the last one's message
  // and the backoff before the next try: for the supervisor to log.
  std::uint64_t take_spawn_failures_locked(std::string& error, std::chrono::nanoseconds& backoff)
      CREW_REQUIRES(mu);

  // ---- reading ----
  // Every outcome counted so far.
  [[nodiscard]] OutcomeCounts totals_locked() const CREW_REQUIRES(mu);
  // Fills stats()'s worker counts, outcomes, write-offs and replacements.
  void add_stats_locked(PoolStats& s) const CREW_REQUIRES(mu);
  // The live workers and their current runs (Pool::workers()).
  [[nodiscard]] std::vector<WorkerInfo> snapshot() const;

  // True the first time a worker found PoolOptions::worker_policy refused
  // (warned once). Any thread.
  bool first_policy_refusal() noexcept {
    return !policy_refused_.exchange(true, std::memory_order_relaxed);
  }

 private:
  std::int64_t retry_spawn_locked(std::int64_t now, bool workers_closed) noexcept CREW_REQUIRES(mu);

  PoolCore& core_;
  std::vector<std::shared_ptr<Worker>> workers_ CREW_GUARDED_BY(mu);    // live
  std::vector<std::shared_ptr<Worker>> exited_ CREW_GUARDED_BY(mu);     // to join
  std::vector<std::shared_ptr<Worker>> abandoned_ CREW_GUARDED_BY(mu);  // detached
  OutcomeCounts retired_ CREW_GUARDED_BY(mu);  // counters of workers that left
  std::uint64_t retired_helped_ CREW_GUARDED_BY(mu) = 0;
  std::uint64_t next_worker_id_ CREW_GUARDED_BY(mu) = 0;
  std::uint64_t workers_replaced_ CREW_GUARDED_BY(mu) = 0;
  std::uint64_t tasks_abandoned_ CREW_GUARDED_BY(mu) = 0;
  // Workers that died (a start hook threw) or were abandoned, to start again.
  std::size_t replacements_due_ CREW_GUARDED_BY(mu) = 0;
  std::chrono::nanoseconds replace_backoff_ CREW_GUARDED_BY(mu){0};
  std::int64_t next_replace_ns_ CREW_GUARDED_BY(mu) = 0;
  SpawnRetry spawns_ CREW_GUARDED_BY(mu);
  std::atomic<bool> policy_refused_{false};
};

}  // namespace crew::detail
