// crew/group.hpp: a group of tasks on one pool, waited for and cancelled
// together.
//
// A Group submits tasks into a Pool and keeps track of them:
//   submit(f[, opts])   a short or long task (see task.hpp), named or not
//   wait(), wait_for()  until every task of the group has ended
//   cancel()            every task that has not ended
//   stats()             counts per outcome, pending tasks
//   first_exception()   the first exception a task threw
// GroupOptions add Go errgroup's rule (cancel the rest when one task fails)
// and one deadline for all of the group's tasks together.
//
//   crew::Group g(pool, {.name = "fanout", .cancel_on_failure = true, .timeout = 2s});
//   for (Shard& s : shards) g.submit([&s] { s.refresh(); });
//   g.wait();
//   g.rethrow_if_failed();
//
// The group's tasks are ordinary tasks of the pool: each ends in exactly one
// outcome, counted by the pool (stats, observers, shutdown reports) and by
// the group. A wait from inside a task of the same pool never deadlocks: it
// runs queued tasks of the pool while the group's tasks are not done.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>

#include "crew/detail/assert.hpp"
#include "crew/detail/deadline.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew {

struct GroupOptions {
  // The name of the group's tasks that are submitted without one (reports,
  // logs, metrics).
  std::string name{};
  // When a task fails (throws), cancel every other task of the group, like
  // Go's errgroup.WithContext. Only a task that ends `failed` counts: a long
  // task that throws after its token was stopped ends cancelled or timed_out.
  bool cancel_on_failure = false;
  // One deadline for all of the group's tasks: construction time plus this;
  // 0 means none. At the deadline, tasks still queued never start (they end
  // rejected with Errc::expired) and later submissions are refused. A long
  // task's execution timeout is the time left until the deadline when it was
  // submitted (or its own timeout if shorter). The pool counts a timeout
  // from the task's start, so a long task that waited in the queue can run
  // past the group's deadline by as long as it waited.
  std::chrono::nanoseconds timeout{0};
};

struct GroupStats {
  std::uint64_t submitted = 0;  // submit() calls, refused ones included
  std::uint64_t pending = 0;    // submitted, not ended yet
  OutcomeCounts outcomes;       // tasks that ended
  bool cancelled = false;       // cancel() ran, or a failure cancelled the group
};

namespace detail {

// The part of a group's state that the inline submission path reads: fixed
// at construction but for `cancelled`, which is set once (GroupState::cancel)
// and read by any thread.
class GroupHead {
 public:
  GroupHead(const GroupHead&) = delete;
  GroupHead& operator=(const GroupHead&) = delete;

  [[nodiscard]] bool cancelled() const noexcept {
    return cancelled_flag_.load(std::memory_order_acquire);
  }
  // No deadline and no name: a submission has nothing to fill in.
  [[nodiscard]] bool plain() const noexcept { return plain_; }
  [[nodiscard]] Pool& pool() const noexcept { return *pool_; }

 protected:
  GroupHead(Pool& pool, bool plain) noexcept : pool_(&pool), plain_(plain) {}
  ~GroupHead() = default;

  std::atomic<bool> cancelled_flag_{false};

 private:
  Pool* const pool_;
  const bool plain_;
};

// The pool whose task (a group's, a batch's or a parallel loop's helper)
// runs on this thread. A wait on that pool's work from this thread then
// runs queued tasks instead of idling one of its workers.
inline thread_local const Pool* t_running_pool = nullptr;

class RunningOn {
 public:
  explicit RunningOn(const Pool* pool) noexcept : saved_(std::exchange(t_running_pool, pool)) {}
  ~RunningOn() { t_running_pool = saved_; }
  RunningOn(const RunningOn&) = delete;
  RunningOn& operator=(const RunningOn&) = delete;

 private:
  const Pool* saved_;
};

// Waits until `task` has an outcome or `deadline` passes; true if it ended.
// With `help`, runs queued tasks of `pool` on this thread while waiting (for
// a thread that runs one of the pool's tasks: blocking it could leave the
// group's own tasks queued with no worker to run them). Without, a worker of
// the pool still runs `task` itself if it is queued (Task::wait's rule).
template <class T>
bool await_task(Pool& pool, const Task<T>& task, std::chrono::steady_clock::time_point deadline,
                bool help) {
  using Clock = std::chrono::steady_clock;
  if (task.ready()) return true;
  // A worker of the pool helps in Task::wait itself (own tasks first).
  if (!help || is_worker_of(task.state())) {
    if (deadline == Clock::time_point::max()) {
      task.wait();
      return true;
    }
    return task.wait_until(deadline);
  }
  // Nothing to help with: sleep on the task in short slices, then look at
  // the queue again (new tasks may arrive that only this thread can run).
  Clock::duration slice = std::chrono::microseconds(50);
  while (!task.ready()) {
    if (pool.run_pending_task()) {
      slice = std::chrono::microseconds(50);
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    (void)task.wait_until(deadline - now > slice ? now + slice : deadline);
    slice = std::min<Clock::duration>(slice * 2, std::chrono::milliseconds(1));
  }
  return true;
}

// A task the pool wrote off has its outcome while its callable may still
// run: waits until the callable returned or the deadline passes, logging a
// warning that `who` ("group", "run_batch") named `name` waits for the
// task. True if it returned (at once when it was not written off). Defined
// in src/pool/group.cpp; used by groups and batches, which promise that no
// callable of theirs outlives their wait.
bool await_returned(const Pool& pool, const TaskStateBase* s, std::string_view who,
                    std::string_view name, std::chrono::steady_clock::time_point deadline) noexcept;

// Group internals (src/pool/group.cpp), called from the inline submission path.
void group_retain(GroupHead* g) noexcept;
void group_release(GroupHead* g) noexcept;
void group_task_failed(GroupHead* g, std::exception_ptr e) noexcept;
// Refuses (and counts) a submission into a cancelled or expired group;
// otherwise fills in the group's name and deadline.
Admission group_prepare(GroupHead* g, TaskOptions& opts, bool is_long);
// Takes the pool's handle into the group; returns the pool's admission.
Admission group_adopt(GroupHead* g, Task<void>&& task);
// A short task submitted without a handle (GroupCell): counted as pending
// from begin to end; `end` records its outcome. It holds no reference to
// the state: the group waits for every pending one before it can go.
void group_counted_begin(GroupHead* g) noexcept;
void group_counted_end(GroupHead* g, TaskStatus outcome) noexcept;

// One reference to a group's state, held by each of its tasks so that a
// task the pool abandoned (it outlives its handle) never touches freed
// memory. Declared first in GroupTask: released even if copying the
// callable throws.
class GroupRef {
 public:
  explicit GroupRef(GroupHead* g) noexcept : g_(g) { group_retain(g); }
  GroupRef(GroupRef&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
  GroupRef(const GroupRef&) = delete;
  GroupRef& operator=(const GroupRef&) = delete;
  GroupRef& operator=(GroupRef&&) = delete;
  ~GroupRef() {
    if (g_ != nullptr) group_release(g_);
  }
  [[nodiscard]] GroupHead* get() const noexcept { return g_; }

 private:
  GroupHead* g_;
};

// What the pool runs for a group's task: the callable, the group's
// failure rule and the running-pool mark. Results are discarded.
template <class F>
class GroupTask {
 public:
  template <class G>
  GroupTask(GroupHead* g, const Pool* pool, G&& f) : ref_(g), pool_(pool), f_(std::forward<G>(f)) {}

  void operator()() requires(!is_long_task_v<F>) {
    const RunningOn mark(pool_);
    try {
      (void)f_();
    } catch (...) {
      group_task_failed(ref_.get(), std::current_exception());
      throw;  // the pool records it on the task's handle
    }
  }

  void operator()(const TaskContext& ctx) requires is_long_task_v<F> {
    const RunningOn mark(pool_);
    try {
      if constexpr (std::is_invocable_v<F&, const TaskContext&>) {
        (void)f_(ctx);
      } else {
        (void)f_(ctx.stop_token);
      }
    } catch (...) {
      // The pool's rule: a long task that was told to stop, or ran past its
      // deadline, ends cancelled or timed_out however it returns.
      if (!ctx.stop_requested() && std::chrono::steady_clock::now() <= ctx.deadline) {
        group_task_failed(ref_.get(), std::current_exception());
      }
      throw;
    }
  }

 private:
  GroupRef ref_;
  const Pool* pool_;
  F f_;
};

// A short task of a group that has no name and no deadline, in a pool
// without task observers: queued as a plain cell (no task state, no
// allocation when it fits) that reports its own outcome to the pool and to
// the group. Queued when the group is cancelled, it ends cancelled without
// running; destroyed without running (refused, dropped by a shutdown), it
// ends rejected. An exception is the group's (first_exception), as with a
// handle.
//
// kHoldsPool: the cell keeps the pool's address for RunningOn beside the
// group's state. A callable that would fit a queue cell only without it
// (Group::add decides) gets it from the state instead, one call per run, so
// that it is not boxed.
template <class F, bool kHoldsPool = true>
class GroupCell {
 public:
  template <class G>
  GroupCell(GroupHead* g, const Pool* pool, G&& f) : g_(g), pool_(pool) {
    ::new (static_cast<void*>(&f_)) F(std::forward<G>(f));
    group_counted_begin(g_);
  }
  // The callable lives while g_ is set: a move ends it in the source.
  GroupCell(GroupCell&& o) noexcept : g_(std::exchange(o.g_, nullptr)), pool_(o.pool_) {
    CREW_ASSERT(g_ != nullptr, "moving a group cell that already ran");
    ::new (static_cast<void*>(&f_)) F(std::move(o.f_));
    o.f_.~F();
  }
  GroupCell(const GroupCell&) = delete;
  GroupCell& operator=(const GroupCell&) = delete;
  GroupCell& operator=(GroupCell&&) = delete;
  // Never run (a shutdown dropped it): the callable goes first, then the
  // group counts the task, so that a wait that returns saw it destroyed.
  ~GroupCell() {
    if (g_ != nullptr) {
      f_.~F();
      group_counted_end(g_, TaskStatus::rejected);
    }
  }

  void run_counted(Runner& runner) noexcept {
    GroupHead* g = std::exchange(g_, nullptr);
    TaskStatus outcome = TaskStatus::succeeded;
    if (g->cancelled()) {
      outcome = TaskStatus::cancelled;
    } else {
      const RunningOn mark(pool_.get(g));
      try {
        (void)f_();
      } catch (...) {
        group_task_failed(g, std::current_exception());
        outcome = TaskStatus::failed;
      }
    }
    // The callable and its captures are destroyed, and the pool counts the
    // task, before the group does: nothing of it runs after Group::wait()
    // returned, and the pool's stats already show it then.
    f_.~F();
    runner.count_outcome(outcome);
    group_counted_end(g, outcome);
  }

 private:
  struct HeldPool {
    explicit HeldPool(const Pool* p) noexcept : pool(p) {}
    const Pool* get(const GroupHead*) const noexcept { return pool; }
    const Pool* pool;
  };
  struct PoolOfState {
    explicit PoolOfState(const Pool*) noexcept {}
    static const Pool* get(const GroupHead* g) noexcept { return &g->pool(); }
  };

  GroupHead* g_;
  [[no_unique_address]] std::conditional_t<kHoldsPool, HeldPool, PoolOfState> pool_;
  union {  // alive while g_ is set; ended by hand, before the group counts the task
    F f_;
  };
};

// A GroupCell for F: with the pool's address unless only its absence lets
// the cell fit a queue slot.
template <class F>
using GroupCellFor =
    std::conditional_t<!Cell::fits_inline<CountedFn<GroupCell<F>>> &&
                           Cell::fits_inline<CountedFn<GroupCell<F, /*kHoldsPool=*/false>>>,
                       GroupCell<F, false>, GroupCell<F>>;

}  // namespace detail

// Thread safety: all member functions are thread-safe; tasks of the group
// may submit into it, wait on other groups, and cancel it.
//
// Lifetime: the pool must outlive the group. Destroying a group cancels its
// tasks that have not ended (queued ones never run, running long ones have
// their token stopped) and waits until every one has ended, so tasks may
// refer to objects that outlive the group. A task the pool wrote off (it
// ignored its stop for abandon_grace) has its outcome at once, but wait()
// and the destructor also wait until its callable has returned (logged as a
// warning naming the task): no callable of the group runs after either
// returns. After wait() the destructor has nothing left to do. Do not
// destroy a group from one of its own tasks (it would wait for itself).
class Group {
 public:
  // Throws crew::Error(Errc::invalid_options) naming the bad field.
  explicit Group(Pool& pool, GroupOptions options = {});
  ~Group();

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  Group(Group&&) = delete;
  Group& operator=(Group&&) = delete;

  // Submits a short or long task (see task.hpp); its result is discarded.
  // Blocks like Pool::submit when the pool's queue is full. Returns the
  // pool's admission (a refused task is counted as rejected), or
  // Admission::closed without submitting when the group was cancelled
  // (counted as cancelled) or its deadline has passed (counted as rejected).
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  Admission submit(F&& f, TaskOptions opts = {}) {
    return add(std::forward<F>(f), std::move(opts), /*may_block=*/true);
  }
  // Never blocks: a full queue refuses the task (Admission::full).
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  Admission try_submit(F&& f, TaskOptions opts = {}) {
    return add(std::forward<F>(f), std::move(opts), /*may_block=*/false);
  }

  // Blocks until every task submitted so far (and any submitted while it
  // waits, by any of them: with a handle or without) has ended, each
  // callable and its captures destroyed and counted by the pool's stats(). Called from a task of
  // the group's pool, it runs queued tasks of the pool meanwhile; otherwise it blocks on the tasks'
  // handles (a worker of the pool still runs a queued task of the group itself). A task must not
  // wait for its own group: it would wait for itself. On a worker with less than its stack's
  // reserve left (a chain of nested waits thousands deep), it runs none of them: it cancels the
  // group, waits until its tasks have settled, then throws Error(Errc::stack_exhausted).
  void wait();
  // As wait(), giving up at the timeout; true if every task has ended. A
  // timeout too large to add to the clock means no deadline. On a worker of
  // the pool the deadline is looked at between the tasks it runs meanwhile:
  // the call returns late by as long as such a task runs.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) {
    return wait_until(detail::saturating_deadline(std::chrono::steady_clock::now(), timeout));
  }
  bool wait_until(std::chrono::steady_clock::time_point deadline);

  // Cancels every task that has not ended: queued ones never run (cancelled),
  // running long ones have their stop token stopped (cancelled); running
  // short ones cannot be interrupted and finish. Later submissions are
  // refused. Queued tasks are taken out before any stop is requested, so a
  // long task that returns at its stop frees no worker for a sibling that
  // was queued when cancel() began. Does not wait.
  void cancel();

  // Counts per outcome and pending tasks; O(pending tasks).
  [[nodiscard]] GroupStats stats() const;
  [[nodiscard]] bool cancelled() const noexcept;
  // The exception of the first task that failed, or null.
  [[nodiscard]] std::exception_ptr first_exception() const;
  // The group's result: rethrows first_exception() if there is one; else
  // throws Error(Errc::rejected) if any of its tasks did not run because
  // the pool refused it (full, or closed: a shutdown refuses nested
  // submissions too), a shutdown dropped it from the queue, or it expired
  // there (stats().outcomes.rejected). Tasks the group's own cancel() ended
  // are not failures. Call it after wait(): a fork-join that skips it may
  // return a partial answer.
  void rethrow_if_failed() const;
  // The group's deadline, if it has one.
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> deadline() const noexcept;
  [[nodiscard]] Pool& pool() const noexcept { return *pool_; }

 private:
  template <class F>
  Admission add(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    if (!state_->plain() || state_->cancelled()) {
      const Admission pre = detail::group_prepare(state_, opts, is_long_task_v<D>);
      if (pre != Admission::accepted) return pre;
    }
    if constexpr (!is_long_task_v<D> && std::is_nothrow_move_constructible_v<D>) {
      detail::Submission submission(detail::PoolAccess::core(*pool_));
      if (!detail::Submission::needs_state(opts) && submission.counted_ok()) {
        const std::size_t level = submission.level_of(opts);
        detail::GroupCellFor<D> cell(state_, pool_, std::forward<F>(f));
        return submission.post_counted(std::move(cell), level, may_block);
      }
    }
    detail::GroupTask<D> task(state_, pool_, std::forward<F>(f));
    Task<void> handle = may_block ? pool_->submit(std::move(task), std::move(opts))
                                  : pool_->try_submit(std::move(task), std::move(opts));
    return detail::group_adopt(state_, std::move(handle));
  }

  Pool* pool_;
  detail::GroupHead* state_;
};

}  // namespace crew
