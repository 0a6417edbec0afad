// crew/pool.hpp: the worker pool.
//
// A Pool runs tasks on an elastic set of worker threads (between min_workers
// and max_workers) fed from one bounded queue. Tasks are submitted with
//   post(f)       fire-and-forget; returns an Admission (accepted or why not)
//   try_post(f)   never blocks
//   submit(f)     returns a Task<R> handle
//   try_submit(f) never blocks
//   submit_wait(f) runs f on the pool and returns its result
// A callable taking no arguments is a short task; one taking a
// std::stop_token or a const TaskContext& is a long task (see task.hpp).
//
// Every task ends in exactly one outcome, counted in stats() and visible on
// its handle. shutdown(mode, timeout) stops the pool and reports what did not
// run. The destructor performs the default shutdown (options.shutdown_mode
// and shutdown_timeout: a drain bounded by 10 s unless configured).
//
// Thread safety: all member functions are thread-safe. Do not destroy a pool
// from one of its own workers. wait_idle() and shutdown() throw
// Error(Errc::would_deadlock) when called from one of the pool's own tasks.
//
// fork(): the child has only the thread that forked, so a pool created
// before the fork has no workers there. The child must not submit to such a
// pool (nothing would run the task); its shutdown() and wait_idle() throw
// Error(Errc::would_deadlock), and destroying it (returning from main,
// exit()) returns at once without freeing it (so do ShardedPool's and
// FuncPool's). The child may create pools of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "crew/detail/pool_core.hpp"
#include "crew/detail/submission.hpp"
#include "crew/detail/submit_api.hpp"
#include "crew/error.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew {

// Reads a pool's stats without keeping the pool alive: read() returns
// nothing once the pool is gone. For collectors that outlive pools (a
// metrics registry scraped from another thread). Copyable; thread-safe.
class PoolStatsHandle {
 public:
  PoolStatsHandle() = default;
  [[nodiscard]] std::optional<PoolStats> read() const;
  // Pool::workers(), or nothing once the pool is gone. Blocks on the pool's
  // worker books (a short lock), never on a task.
  [[nodiscard]] std::optional<std::vector<WorkerInfo>> workers() const;
  [[nodiscard]] const std::string& pool_name() const noexcept { return name_; }

 private:
  friend class Pool;
  PoolStatsHandle(std::weak_ptr<const detail::PoolCore> core, std::string name)
      : core_(std::move(core)), name_(std::move(name)) {}
  std::weak_ptr<const detail::PoolCore> core_;
  std::string name_;
};

namespace detail {
class PoolAccess;
}

class Pool : public detail::SubmitApi<Pool> {
 public:
  // Throws crew::Error(Errc::invalid_options) naming the bad field, and
  // std::system_error when the pool's supervisor thread cannot be started;
  // no thread of the pool is left running then. A worker thread that cannot
  // be started (pthread_create: EAGAIN at a container's pids.max, ENOMEM) is
  // logged by the supervisor, which tries again after a backoff (1 ms
  // doubling to 1 s) while tasks are queued: a queued task is never left
  // without a worker because one start failed.
  explicit Pool(PoolOptions options = {});
  // Performs shutdown(options.shutdown_mode, options.shutdown_timeout): by
  // default a drain of at most 10 s, then hard. Blocks until every worker
  // has left or was written off; do not run it on one of the pool's workers.
  ~Pool();

  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  Pool(Pool&&) = delete;
  Pool& operator=(Pool&&) = delete;

  // Submission (post, try_post, submit, try_submit, submit_wait) is
  // inherited from detail::SubmitApi, where each call's contract is stated.
  // post() does not allocate for short callables of up to 48 bytes.

  // Stops the pool (see ShutdownMode and docs/shutdown.md). Idempotent:
  // later and concurrent calls wait for the first one and return its report;
  // a concurrent call with a harder mode (soft over drain, hard over either)
  // makes the running shutdown escalate to hard at once. timeout 0 = no limit
  // before escalating to hard. Blocks until every worker has left (or was
  // written off); so from a task of this pool (on one of its workers, or run
  // by the pool on another thread: caller_runs, run_pending_task, a wait
  // running a queued task) it would wait for itself, or write its own worker
  // off: there it throws Error(Errc::would_deadlock) at once, whatever the
  // mode and timeout, and the pool keeps running. To stop a pool from one of
  // its tasks, stop its PoolOptions::stop_token (the supervisor then shuts it
  // down hard) or call shutdown() from another thread. Out of memory for
  // its report it throws std::bad_alloc with the pool still stopping (it
  // takes no new task); the next call runs the shutdown again. A mode other
  // than drain, soft or hard throws Error(Errc::invalid_options). In a child
  // of fork(), on a pool created before the fork (whose workers are not
  // there), it throws Error(Errc::would_deadlock) too. Called from user code
  // that a shutdown of this pool runs on its own thread (a stop callback of
  // a task it stops, an observer, the logger), it does not wait for that
  // shutdown: it asks it to escalate if the mode is harder and returns at
  // once, with final_state PoolState::stopping.
  ShutdownReport shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout);
  // With the options' default mode and timeout.
  ShutdownReport shutdown();
  // Takes a stopped pool back to running. Returns false if it was not stopped.
  bool restart();

  // Workers finish their current task and start no task submitted after
  // pause() returned until resume(). A task queued before may still start,
  // also after pause() returned, if a worker took it from the queue just
  // before. Submissions are still queued, and a wait on a worker may still
  // run the very task it waits for (a task with a handle, a task of a named
  // Group). The tasks of an unnamed Group carry no handle to find them by,
  // so a Group::wait for them on a worker sleeps until resume() like any
  // other wait on a paused pool. A worker that takes a task once the pool
  // is paused holds it (counted neither busy nor queued, and its slot is
  // free again: a paused pool with a full queue of queue_capacity may hold
  // one more task per worker that was awake) and runs it first after
  // resume(). Neither blocks; both may be called from a worker of the pool.
  void pause();
  void resume();
  // Changes max_workers at run time (0 = 2 x usable CPUs). Workers above
  // the new maximum exit after their current task. Throws
  // Error(invalid_options) if below min_workers.
  void resize(std::size_t max_workers);
  // Stops one worker. graceful: it finishes its current task; hard: its
  // current long task's token is stopped too. The pool starts another worker
  // if it falls below min_workers. Returns false for an unknown id.
  bool stop_worker(std::uint64_t worker_id, WorkerStop how);

  // Throws Error(Errc::invalid_options) naming the field, as a submission
  // with `opts` would (a priority the pool lacks, a negative timeout); else
  // does nothing. For callers that must know before they commit to a
  // submission (crew::asio builds its completion only after this).
  // Thread-safe; never blocks.
  void check_options(const TaskOptions& opts) const {
    (void)detail::Submission(*core_).level_of(opts);
  }

  [[nodiscard]] PoolState state() const noexcept;
  // True in a child of fork() for a pool created before the fork (its
  // workers are the parent's threads; see the top of this file).
  [[nodiscard]] bool inherited_by_fork() const noexcept;
  // One snapshot: every outcome it counts belongs to a submission it counts
  // (outcomes.total() <= submitted), so equality means all of those ended.
  [[nodiscard]] PoolStats stats() const;
  [[nodiscard]] PoolStatsHandle stats_handle() const;
  // The overload controller's answer to a submission from outside the pool
  // if it came now: reason limit while its admission limit is reached, none
  // otherwise (always none when the controller is off), and the queue wait
  // it expects. Takes no ticket, so a submission may still be refused; for
  // an early, cheap refusal (crewd answers from a request's head) and a
  // Retry-After. A few atomic loads; never blocks.
  [[nodiscard]] OverloadHint overload_hint() const noexcept;
  // overload_hint(), and when it says limit the caller's refusal is counted
  // in stats().overload.refused_limit (not in submitted or outcomes: no
  // task was submitted). For a caller that refuses on that answer.
  OverloadHint refuse_if_overloaded() noexcept;
  [[nodiscard]] std::vector<WorkerInfo> workers() const;
  [[nodiscard]] const PoolOptions& options() const noexcept;
  [[nodiscard]] std::string_view name() const noexcept;

  // Runs one queued task on the calling thread, if there is one; returns
  // whether it did. For code that waits on the pool's own work, above all
  // from inside one of its workers (crew::Group::wait uses it), so that a
  // wait never idles a worker while tasks are queued. Does nothing while the
  // pool is paused. During a soft or hard shutdown a popped task is rejected
  // instead of run. The task runs nested on the caller's stack, so only
  // while at most a sixteenth of the calling thread's stack is in use (a
  // worker of this pool runs its own queued tasks deeper, down to its stack
  // reserve): a caller deep in its own recursion gets false. Waits for
  // nothing but the task it runs.
  bool run_pending_task();

  // Blocks until every task submitted so far has an outcome, or the timeout
  // passes; returns true in the first case, and then everything those tasks
  // did happens-before the return (like joining them). Polls stats(); tasks
  // submitted while it waits are waited for too. From a task of this pool
  // (see shutdown()) it would wait for itself: it throws
  // Error(Errc::would_deadlock) at once instead; so it does in a child of
  // fork() on a pool created before the fork.
  bool wait_idle(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());

 private:
  friend class detail::SubmitApi<Pool>;
  friend class detail::PoolAccess;

  // SubmitApi's hook: every submission of this pool, and of a ShardedPool
  // onto its shards, ends here.
  template <bool kHandle, bool kMayBlock, class F>
  decltype(auto) enqueue(F&& f, TaskOptions&& opts) {
    if constexpr (kHandle) {
      return detail::Submission(*core_).submit(std::forward<F>(f), std::move(opts), kMayBlock);
    } else {
      return detail::Submission(*core_).post(std::forward<F>(f), std::move(opts), kMayBlock);
    }
  }

  std::shared_ptr<detail::PoolCore> core_;
};

namespace detail {

// The one door into a pool's engine, for crew's own facades: Group submits
// its short tasks without a task state (Submission::post_counted) and tells the
// pool's workers from other threads; ShardedPool places a task through a
// shard's own enqueue. Not for user code: the core is not a public API.
class PoolAccess {
 public:
  static PoolCore& core(Pool& pool) noexcept { return *pool.core_; }
  static const PoolCore& core(const Pool& pool) noexcept { return *pool.core_; }
  template <bool kHandle, bool kMayBlock, class F>
  static decltype(auto) enqueue(Pool& pool, F&& f, TaskOptions&& opts) {
    return pool.enqueue<kHandle, kMayBlock>(std::forward<F>(f), std::move(opts));
  }
};

}  // namespace detail
}  // namespace crew
