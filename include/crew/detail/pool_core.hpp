// crew/detail/pool_core.hpp: detail::PoolCore, the part of a pool that the
// inline submission path needs: the options, the queues, the pool's
// lifecycle, the idle counts, the id and refusal counters, and post /
// submit / route / admit_state / after_push. Every slower step (a full
// queue, a wake-up, a sweep after close, an event, the workers, the
// supervisor, shutdown) is an out-of-line call into the engine
// (src/engine/pool_runtime.hpp: PoolRuntime and its units, reached
// through a std::unique_ptr). docs/design/architecture.md maps the units.
//
// Who touches what on the hot path:
//   submitter: queue_ tail and slot; reads life_ (the pool's state) and
//              idle_ (its counts)
//   worker:    queue_ head and slot; its own Worker counters
// All of PoolCore's state is private; the engine's units are its friends.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "crew/detail/cell.hpp"
#include "crew/detail/clock.hpp"
#include "crew/detail/deadline.hpp"
#include "crew/detail/idle_workers.hpp"
#include "crew/detail/pool_lifecycle.hpp"
#include "crew/detail/task_queue.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/error.hpp"
#include "crew/log.hpp"
#include "crew/observer.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew::detail {

class PoolCore;
struct PoolRuntime;

// Whether `m` is one of the three modes (a value cast from an integer may
// not be).
constexpr bool valid_shutdown_mode(ShutdownMode m) noexcept {
  return m == ShutdownMode::drain || m == ShutdownMode::soft || m == ShutdownMode::hard;
}

struct Worker;
class Supervisor;

// Whether the calling thread may nest a task that is not its own (taken
// from the shared queue or another worker) in a wait: while at most a
// sixteenth of its stack is in use.
bool stack_allows_help() noexcept;
// Whether the calling thread's stack has its reserve left below the current
// frame (a sixteenth of the stack, at least 32 KiB and at most a quarter;
// where waits cannot throw, half the reserve): a wait nests a queued task
// only then, and otherwise cancels the task it waits for and throws
// Error(stack_exhausted) (see waits_may_throw_for_stack), or, where it
// cannot throw, returns with the task settled as cancelled. On a stack that
// is not the thread's own (a fiber's, a stackful coroutine's) or one of
// unknown size: only while no task runs nested on it yet; past that such a
// wait sleeps instead.
bool stack_allows_nesting() noexcept;
// Whether the calling frame is on a stack other than the thread's own, or
// on a thread whose stack is unknown.
bool on_foreign_stack() noexcept;
// The text of that Error, naming `what` was not run.
std::string stack_exhausted_message(std::string_view what);
// False while the calling thread waits where it cannot throw (~Group, or
// while an exception unwinds): there a wait stops nesting the task it waits
// for at half the reserve (it cancels it without throwing), and runs the
// caller's own queued tasks down to a quarter of it.
bool waits_may_throw_for_stack() noexcept;
// Marks the calling thread's scope as one whose waits cannot throw.
struct NoStackThrowScope {
  NoStackThrowScope() noexcept;
  ~NoStackThrowScope();
  NoStackThrowScope(const NoStackThrowScope&) = delete;
  NoStackThrowScope& operator=(const NoStackThrowScope&) = delete;
};

// The worker running on this thread, if any (set for the life of its loop).
struct CurrentWorker {
  PoolCore* core = nullptr;
  Worker* worker = nullptr;
  // The worker's local queue slot (LocalQueues::kNone: it has none).
  std::size_t worker_local = static_cast<std::size_t>(-1);
  // Task ids reserved by this worker: [next_id, end_id). Forked tasks take
  // their ids here instead of from the pool's shared counter.
  std::uint64_t next_id = 0;
  std::uint64_t end_id = 0;
};
inline thread_local CurrentWorker t_current{};

// Marks a task of `core` running on a thread that may not be one of its
// workers (caller_runs, run_pending_task, a wait running a queued task), for
// the length of the run; nested runs chain through `outer`.
struct InlineRun;
inline thread_local const InlineRun* t_inline_run = nullptr;
struct InlineRun {
  explicit InlineRun(const PoolCore* c) noexcept : core(c), outer(t_inline_run) {
    t_inline_run = this;
  }
  ~InlineRun() { t_inline_run = outer; }
  InlineRun(const InlineRun&) = delete;
  InlineRun& operator=(const InlineRun&) = delete;
  const PoolCore* core;
  const InlineRun* outer;
};

// Runs what a cell cannot run by itself, given as a type-erased call: a
// long task posted without a task state (it needs a stop token and a
// deadline watch), and a plain task in a pool with task observers (it is
// timed and reported). Both count the task's outcome. A worker does this for
// its top-level tasks; the pool itself (PoolCore) for any other thread.
using LongCall = void (*)(void* fn, const TaskContext& ctx);
using PlainCall = void (*)(void* fn);
// Runs a task that decides its own outcome (a group's short task: it may end
// cancelled without running, or failed with the exception kept by its
// group); it has the runner count it (count_outcome) before it tells its
// group, so that whoever saw it end sees it in the pool's stats too.
class Runner;
using CountedCall = void (*)(void* fn, Runner& runner) noexcept;
class Runner {
 public:
  virtual void count_outcome(TaskStatus outcome) noexcept = 0;
  virtual void run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                        void* fn) noexcept = 0;
  virtual void run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept = 0;
  virtual void run_counted(CountedCall call, void* fn) noexcept = 0;

 protected:
  Runner() = default;
  Runner(const Runner&) = default;
  Runner& operator=(const Runner&) = default;
  ~Runner() = default;
};

template <class D>
void call_long(void* fn, const TaskContext& ctx) {
  D& f = *static_cast<D*>(fn);
  if constexpr (std::is_invocable_v<D&, const TaskContext&>) {
    (void)f(ctx);
  } else {
    (void)f(ctx.stop_token);
  }
}

template <class D>
void call_plain(void* fn) {
  (void)(*static_cast<D*>(fn))();
}

// A callable with `void run_counted(Runner&) noexcept`, which runs it and
// has the runner count how it ended. Destroyed without having run (refused,
// or dropped by a shutdown), it must record that itself.
template <class D>
concept CountedTask = requires(D& d, Runner& r) {
  { d.run_counted(r) }
  noexcept;
};

template <class D>
void call_counted(void* fn, Runner& runner) noexcept {
  static_cast<D*>(fn)->run_counted(runner);
}

// The cell content of a counted task.
template <class D>
struct CountedFn {
  D fn;
  void run_with(void* runner) { static_cast<Runner*>(runner)->run_counted(&call_counted<D>, &fn); }
};

// The cell content of an unnamed long task posted fire-and-forget.
template <class D>
struct LongFn {
  std::chrono::nanoseconds timeout;
  std::int64_t enqueued_ns;  // 0 unless task observers want timings
  D fn;
  void run_with(void* runner) {
    static_cast<Runner*>(runner)->run_long(timeout, enqueued_ns, &call_long<D>, &fn);
  }
};

// The cell content of a plain task in a pool with task observers.
template <class D>
struct ObservedFn {
  std::int64_t enqueued_ns;
  D fn;
  void run_with(void* runner) {
    static_cast<Runner*>(runner)->run_observed(enqueued_ns, &call_plain<D>, &fn);
  }
};

// Outcomes decided off the workers: refusals, caller-thread runs, shutdown
// drops, abandonments. Rare paths, so shared atomics are fine.
struct SharedCounters {
  std::atomic<std::uint64_t> succeeded{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> timed_out{0};
  std::atomic<std::uint64_t> rejected{0};

  void add(TaskStatus outcome) noexcept;
  [[nodiscard]] OutcomeCounts read() const noexcept;
};

class PoolCore final : public std::enable_shared_from_this<PoolCore>, public Runner {
 public:
  enum class Route : std::uint8_t { queued, run_here, refused };

  // Validates the options (throws Error(invalid_options) naming the field).
  explicit PoolCore(PoolOptions options);
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  // Starts min_workers and the supervisor; the pool is then running.
  void start();
  // Stops and joins the supervisor (after the final shutdown).
  void stop_supervisor() noexcept;

  template <class F>
  Admission post(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    const std::size_t level = level_of(opts);
    if constexpr (is_long_task_v<D>) {
      if (needs_state(opts)) {
        return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
      }
      return post_long_inline(std::forward<F>(f), std::move(opts), may_block);
    } else {
      if (needs_state(opts)) [[unlikely]] {
        return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
      }
      if (observes(kTaskEvents)) [[unlikely]] {
        return post_observed(std::forward<F>(f), level, may_block);
      }
      return post_plain(std::forward<F>(f), level, may_block);
    }
  }

  // Submits a counted task (see CountedTask) without a task state: no
  // allocation when it fits a cell. For a pool without task observers only
  // (observers need the task's own events); see counted_ok().
  template <CountedTask F>
  Admission post_counted(F&& f, std::size_t level, bool may_block) {
    using D = std::decay_t<F>;
    static_assert(std::is_nothrow_move_constructible_v<D>);
    Admission why = Admission::accepted;
    if constexpr (Cell::fits_inline<CountedFn<D>>) {
      auto fill = [&f](Cell& c) noexcept { c.emplace(CountedFn<D>{std::move(f)}); };
      switch (route(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here: {
          const InlineRun here(this);
          f.run_counted(*this);
          return Admission::accepted;
        }
        case Route::refused:
          break;  // f records its refusal when the caller destroys it
      }
    } else {
      // Boxed before a slot is claimed: boxing allocates and may throw,
      // and the fill must not (the slot is claimed by then).
      Cell tmp;
      tmp.emplace(CountedFn<D>{std::move(f)});
      auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
      switch (route(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here: {
          const InlineRun here(this);
          (void)tmp.invoke_and_destroy(static_cast<Runner*>(this));
          return Admission::accepted;
        }
        case Route::refused:
          tmp.destroy();  // the task records its refusal
          break;
      }
    }
    return why;
  }
  [[nodiscard]] bool counted_ok() const noexcept { return !observes(kTaskEvents); }

  // What a plain post carries only in a task state (its Extras).
  static bool needs_state(const TaskOptions& o) noexcept {
    return !o.name.empty() || o.queue_timeout.count() != 0 || !o.correlation_id.empty();
  }

  // The queue level of a submission; throws for a priority the pool lacks,
  // a negative timeout and a correlation id too long (the options' one
  // validation).
  std::size_t level_of(const TaskOptions& o) const {
    if (o.priority >= queue_.levels()) [[unlikely]]
      throw_bad_priority(o.priority);
    if (o.timeout.count() < 0 || o.queue_timeout.count() < 0) [[unlikely]]
      throw_negative_timeout(o);
    if (o.correlation_id.size() > kMaxCorrelationId) [[unlikely]]
      throw_long_correlation_id(o);
    return o.priority;
  }
  [[noreturn]] void throw_bad_priority(unsigned priority) const;
  [[noreturn]] static void throw_negative_timeout(const TaskOptions& o);
  [[noreturn]] static void throw_long_correlation_id(const TaskOptions& o);

  static constexpr std::uint32_t kTaskEvents = Observer::task_enqueued | Observer::task_started |
                                               Observer::task_finished | Observer::task_rejected;

  template <class F>
  Task<task_result_t<std::decay_t<F>>> submit(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    (void)level_of(opts);  // validated before anything is allocated
    TaskStateBase* s = make_state<D>(std::forward<F>(f), std::move(opts));
    (void)admit_state(s, may_block);
    return Task<task_result_t<D>>(s);  // adopts the creator's reference
  }

  // ---- control (src/) ----
  ShutdownReport shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout);
  bool restart();
  void pause();
  void resume();
  void resize(std::size_t max_workers);
  bool stop_worker(std::uint64_t id, WorkerStop how);
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  [[nodiscard]] PoolStats stats() const;
  [[nodiscard]] std::vector<WorkerInfo> workers() const;
  [[nodiscard]] PoolState state() const noexcept { return life_.state(); }
  [[nodiscard]] const PoolOptions& options() const noexcept { return opts_; }
  // True on a thread inside one of this pool's tasks (on a worker, or run
  // inline elsewhere): a wait for the pool's tasks would wait for itself.
  [[nodiscard]] bool in_own_task() const noexcept;
  // True in a child of fork() for a pool created before the fork: its
  // workers and supervisor are threads of the parent, so nothing would run
  // its tasks or end its shutdown there.
  [[nodiscard]] bool inherited_by_fork() const noexcept;

  // Runs (or, while dropping, rejects) one queued cell on this thread. On a
  // worker of this pool: its own local queue first, newest first; then, if
  // the stack has room (stack_allows_help), the shared queue and the other
  // workers' queues. That order bounds the nesting of waits by the depth of
  // the program's recursion. False if there was nothing (or the pool is
  // paused).
  bool run_pending();
  // Waits for `s` (a task of this pool) until `deadline` on a worker of this
  // pool, running queued tasks meanwhile (run_pending's order, and `s`
  // itself if it is still queued). Returns whether `s` ended.
  bool help_until(TaskStateBase* s, std::chrono::steady_clock::time_point deadline);
  // One step of run_pending: from the caller's own local queue (`own`), from
  // anywhere else (`foreign`, only while the stack has room).
  bool help_once(bool own, bool foreign);
  // Runs a task state on the calling thread (nested waits, caller_runs).
  // The caller has already moved it from queued to running. `drop_ref`:
  // the caller's reference (the queue cell's) is dropped here, and the
  // caller must not touch `s` afterwards (see run_claimed).
  void run_claimed_here(TaskStateBase* s, bool drop_ref) noexcept;
  // Reports an exception nobody else will see (handler, else the logger).
  void report_exception(const TaskRef& task, std::exception_ptr e) const noexcept;
  // Logs through opts_.logger if `level` passes its threshold.
  void log(LogLevel level, const LogContext& context, std::string_view message) const noexcept;
  [[nodiscard]] bool logs(LogLevel level) const noexcept { return level >= log_level_; }
  void log_hook_failure(std::string_view hook, std::uint64_t worker,
                        std::exception_ptr e) const noexcept;
  // Runner for threads other than a worker's top level. run_long wraps the
  // call in a task state (one allocation) and runs it with run_claimed_here.
  void run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                void* fn) noexcept override;
  void run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept override;
  void run_counted(CountedCall call, void* fn) noexcept override { call(fn, *this); }
  void count_outcome(TaskStatus outcome) noexcept override { count_here(outcome); }

  // ---- observers (src/engine/observer_hub.hpp) ----
  [[nodiscard]] bool observes(std::uint32_t events) const noexcept {
    return (observed_ & events) != 0;
  }
  // The submission path's events (src/engine/observer_hub.cpp has the
  // rest): a task state `s`, or a plain task if null.
  void emit_enqueued(const TaskStateBase* s, bool is_long) noexcept;
  void emit_refused(const TaskStateBase* s, bool is_long, Admission why) noexcept;
  // A task past its queue deadline that was to run on the submitting
  // thread (Route::run_here): ends it expired, reports it, and drops the
  // reference its cell would have held.
  void expire_unqueued(TaskStateBase* s) noexcept;
  // ~Pool is done with the core (abandoned threads may still co-own it);
  // PoolStatsHandle reads nothing after that.
  void mark_released() noexcept { released_.store(true, std::memory_order_release); }
  [[nodiscard]] bool released() const noexcept { return released_.load(std::memory_order_acquire); }
  // The engine's parts (src/engine/pool_runtime.hpp), for the engine's own files.
  [[nodiscard]] PoolRuntime& runtime() const noexcept { return *rt_; }

  // Removes a task's queue deadline from the timer heap (it left the queue);
  // for a task without one, a flag test and nothing else: the heap's mutex
  // stays off the common path.
  void disarm_queue_deadline(TaskStateBase* s) noexcept {
    if (s->has_queue_deadline()) disarm_timer(s);
  }
  // For settle_in_queue (any thread that decided a queued task's outcome,
  // holding a reference): disarms its queue deadline and counts it.
  void settled_in_queue(TaskStateBase* s, bool count) noexcept;

 private:
  // The engine's shared state (src/engine/pool_runtime.hpp), whose members that
  // need its mutex (the worker books: spawning, write-offs, totals) read
  // and update PoolCore's counters too.
  friend struct PoolRuntime;
  friend class Supervisor;
  friend class ShutdownSequence;

  // ---- state (the pool's parts; docs/design/architecture.md says which thread touches what) ----
  const PoolOptions opts_;
  // Task-state runs counted and published whose handlers and observers have
  // not yet returned (run_claimed); wait_idle() waits for them too.
  std::atomic<std::uint64_t> epilogues_{0};
  // The events some observer wants (the observers are in PoolRuntime's
  // ObserverHub), and whether any wants task timings.
  const LogLevel log_level_;  // opts_.logger->level(), read once
  const std::uint32_t observed_;
  const bool timed_;
  const bool time_handles_;  // opts_.time_tasks
  Queues queue_;
  // The pool's state, the shutdown's drop switch (popped tasks are
  // rejected, not run) and the attention counter workers poll.
  PoolLifecycle life_;
  std::atomic<std::size_t> max_workers_;
  std::atomic<std::size_t> live_workers_{0};  // started, not exited, not abandoned
  // Spinning tokens and sleeping workers. A submitter wakes a sleeper only
  // when nobody holds a token; the woken worker starts out with one, so one
  // burst costs one wake-up per worker.
  IdleWorkers idle_;
  alignas(kCacheLine) std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> refused_{0};     // refused at submission
  std::atomic<std::uint64_t> ran_inline_{0};  // accepted and run on the submitting thread
  std::atomic<std::uint64_t> helped_{0};      // taken by run_pending()
  SharedCounters shared_;
  std::unique_ptr<PoolRuntime> rt_;
  // Set by ~Pool: the core may outlive it (abandoned threads co-own it).
  std::atomic<bool> released_{false};
  // How many forks this process descends from when the pool was created
  // (inherited_by_fork).
  const std::uint32_t forks_at_start_;

  template <class D, class F>
  Admission post_state(F&& f, TaskOptions&& opts, bool may_block) {
    TaskStateBase* s = make_state<D>(std::forward<F>(f), std::move(opts));
    s->detached = true;
    const Admission a = admit_state(s, may_block);
    s->release();
    return a;
  }

  // An unnamed long task without a queue deadline: inline in its cell like a
  // short one (no allocation) when it fits, else through a task state.
  template <class F>
  Admission post_long_inline(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    if constexpr (Cell::fits_inline<LongFn<D>> && std::is_nothrow_constructible_v<D, F&&>) {
      const std::chrono::nanoseconds timeout =
          opts.timeout.count() != 0 ? opts.timeout : opts_.task_timeout;
      const std::int64_t enqueued = timed_ ? now_ns() : 0;
      Admission why = Admission::accepted;
      auto fill = [&](Cell& c) noexcept {
        c.emplace(LongFn<D>{timeout, enqueued, std::forward<F>(f)});
      };
      const Route r = route(fill, level_of(opts), may_block, why);
      if (r == Route::run_here) {
        D local(std::forward<F>(f));
        run_long(timeout, enqueued, &call_long<D>, &local);
        return Admission::accepted;
      }
      if (observed_ != 0) [[unlikely]]
        note_plain_submission(r, why, /*is_long=*/true);
      return r == Route::queued ? Admission::accepted : why;
    } else {
      return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
    }
  }

  // A plain task in a pool whose observers want task events: stored with
  // its enqueue time and run through the Runner, which times and reports it.
  template <class F>
  Admission post_observed(F&& f, std::size_t level, bool may_block) {
    using D = std::decay_t<F>;
    const std::int64_t enqueued = timed_ ? now_ns() : 0;
    Cell tmp;  // boxed if the wrapper does not fit inline
    tmp.emplace(ObservedFn<D>{enqueued, std::forward<F>(f)});
    Admission why = Admission::accepted;
    auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
    const Route r = route(fill, level, may_block, why);
    if (r == Route::run_here) {
      (void)tmp.invoke_and_destroy(static_cast<Runner*>(this));
      return Admission::accepted;
    }
    if (r == Route::refused) tmp.destroy();
    note_plain_submission(r, why, /*is_long=*/false);
    return r == Route::queued ? Admission::accepted : why;
  }

  template <class F>
  Admission post_plain(F&& f, std::size_t level, bool may_block) {
    using D = std::decay_t<F>;
    Admission why = Admission::accepted;
    if constexpr (Cell::fits_inline<D> && std::is_nothrow_constructible_v<D, F&&>) {
      auto fill = [&f](Cell& c) noexcept { c.emplace(std::forward<F>(f)); };
      switch (route(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here:
          run_plain_here([&f] { f(); });
          return Admission::accepted;
        case Route::refused:
          return why;
      }
    } else {
      Cell tmp;  // box (or copy) before claiming a slot: this may throw
      tmp.emplace(std::forward<F>(f));
      auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
      switch (route(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here:
          run_plain_here([&tmp] { tmp.invoke_and_destroy(); });
          return Admission::accepted;
        case Route::refused:
          tmp.destroy();
          return why;
      }
    }
    return why;
  }

  template <class D, class F>
  TaskStateBase* make_state(F&& f, TaskOptions&& o) {
    // Most tasks have no Extras (TaskStateBase::Extras).
    std::unique_ptr<TaskStateBase::Extras> x;
    if (is_long_task_v<D> || needs_state(o)) {
      x = std::make_unique<TaskStateBase::Extras>();
      x->name = std::move(o.name);
      x->correlation_id = std::move(o.correlation_id);
      if (is_long_task_v<D>) x->timeout = o.timeout.count() != 0 ? o.timeout : opts_.task_timeout;
      if (o.queue_timeout.count() != 0) {
        x->queue_deadline = saturating_deadline(std::chrono::steady_clock::now(), o.queue_timeout);
      }
    }
    auto* s = new TaskState<task_result_t<D>, D>(std::forward<F>(f));
    s->adopt_extras(std::move(x));
    s->id = new_task_id();
    s->owner = this;
    s->is_long = is_long_task_v<D>;
    s->level = o.priority;
    return s;
  }

  // Unique per pool; a worker takes them from a block it reserved, so that
  // tasks forked on different workers do not contend on one counter.
  std::uint64_t new_task_id() noexcept {
    static constexpr std::uint64_t kIdBlock = 256;
    if (t_current.core != this) return next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
    CurrentWorker& cur = t_current;
    if (cur.next_id == cur.end_id) {
      cur.next_id = next_id_.fetch_add(kIdBlock, std::memory_order_relaxed) + 1;
      cur.end_id = cur.next_id + kIdBlock;
    }
    return cur.next_id++;
  }

  // Hands `s` to the queue; the creator keeps its own reference.
  Admission admit_state(TaskStateBase* s, bool may_block) {
    // A handle shows the task's queue wait and run time (TaskClock), in a
    // pool that times them.
    if (timed_ || (time_handles_ && !s->detached)) [[unlikely]]
      s->clock.set_enqueued(now_ns());
    // The cell's reference. A queue deadline is armed first: arming may
    // throw (out of memory), and then the caller's reference alone frees
    // the state; once armed, the state is shared with the supervisor,
    // which leaves the deadline to this thread until the submission is
    // counted (begin_admission).
    const bool deadline = s->has_queue_deadline();
    if (deadline) {
      s->begin_admission();
      arm_queue_deadline(s);
      s->add_ref();
    } else {
      s->add_ref_unshared();  // `s` is not shared yet
    }
    auto fill = [s](Cell& c) noexcept { c.emplace_state(s); };
    Admission why = Admission::accepted;
    switch (route(fill, s->level, may_block, why)) {
      case Route::queued:
        if (observes(Observer::task_enqueued)) [[unlikely]]
          emit_enqueued(s, s->is_long);
        // Counted (pushed): a deadline that passed while this call routed
        // it is fired here; whoever pops the cell reports it, as for the
        // supervisor's.
        if (deadline && s->end_admission()) [[unlikely]]
          (void)s->expire();
        return Admission::accepted;
      case Route::run_here:
        disarm_queue_deadline(s);
        if (deadline && (s->end_admission() || s->queue_deadline_passed())) [[unlikely]] {
          expire_unqueued(s);  // drops the cell's reference
          return Admission::accepted;
        }
        if (s->leave_queue(TaskStatus::running)) {
          run_claimed_here(s, /*drop_ref=*/true);
        } else {
          s->release();
        }
        return Admission::accepted;
      case Route::refused:
        break;
    }
    // A refusal decides, even if the queue deadline passed meanwhile.
    if (deadline) (void)s->end_admission();
    disarm_queue_deadline(s);
    s->refused_as = why;
    // Counted as a refusal already (refused_).
    if (s->claim_in_queue(TaskStatus::rejected, Errc::rejected)) settle_in_queue(s, false);
    if (observes(Observer::task_rejected)) [[unlikely]]
      emit_refused(s, s->is_long, why);
    s->release();
    return why;
  }

  // Events of a plain submission that was queued, refused or swept.
  void note_plain_submission(Route r, Admission why, bool is_long) noexcept {
    if (r == Route::queued) {
      if (observes(Observer::task_enqueued)) emit_enqueued(nullptr, is_long);
    } else if (r == Route::refused && observes(Observer::task_rejected)) {
      emit_refused(nullptr, is_long, why);
    }
  }

  template <class Fill>
  Route route(Fill& fill, std::size_t level, bool may_block, Admission& why) {
    if (life_.closed()) [[unlikely]] {
      return refuse(Admission::closed, why);
    }
    // From a worker of this pool: its own queue, where a wait of this
    // worker finds it first (see local_queue.hpp).
    if (t_current.core == this) {
      const std::size_t local = t_current.worker_local;
      if (local != LocalQueues::kNone && queue_.try_push_local(fill, local)) [[likely]] {
        after_push(/*own_queue=*/true);
        return Route::queued;
      }
    }
    if (queue_.try_push(fill, level)) [[likely]] {
      after_push();
      return Route::queued;
    }
    return route_full(fill_ref(fill), level, may_block, why);
  }

  Route refuse(Admission a, Admission& why) noexcept {
    why = a;
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Route::refused;
  }

  // A fill passed out of line: the slow paths after a failed push.
  struct FillRef {
    void (*fill)(void* ctx, Cell& c) noexcept;
    void* ctx;
    void operator()(Cell& c) const noexcept { fill(ctx, c); }
  };
  template <class Fill>
  static FillRef fill_ref(Fill& f) noexcept {
    return {[](void* ctx, Cell& c) noexcept { (*static_cast<Fill*>(ctx))(c); }, &f};
  }
  // The shared queue of `level` is full (src/engine/pool_core.cpp): runs
  // the task here (a worker of this pool, or caller_runs), refuses it, or
  // blocks the caller until the level drains (BlockedSubmitters).
  Route route_full(FillRef fill, std::size_t level, bool may_block, Admission& why);

  // A cell left the queue: blocked submitters may be due for release
  // (inline in src/engine/pool_runtime.hpp, for the workers' pops).
  void on_slot_freed() noexcept;

  // `own_queue`: the push went to the calling worker's own queue. That
  // worker runs the task itself unless a thief takes it first, so any
  // spinning token is enough there, running or not (and fork-join pushes,
  // tens of nanoseconds apart, skip the heartbeat's clock read); a task in
  // the shared queue is left only to a spinner that is running.
  void after_push(bool own_queue = false) noexcept {
    // A shared-queue push claimed its slot with a seq_cst read-modify-write,
    // so these loads see any worker that went to sleep before it (it
    // re-checks the claimed size after announcing itself), and any shutdown
    // that began before it. A local push is ordered against a shutdown by
    // its light_fence and the shutdown's heavy_fence (barrier.hpp).
    const PoolState st = life_.state(std::memory_order_seq_cst);
    if (st != PoolState::running) [[unlikely]] {
      if (st >= PoolState::stopping) on_push_after_close();
      return;
    }
    if (own_queue ? idle_.spinning() != 0 : idle_.spinner_running()) return;
    wake_for_push();
  }

  // After a worker's pop: the cells a batch pop moved into its local queue
  // wait there for it, or for a thief, and it is about to run a task that
  // may be long. So some worker must hold a spinning token (it steals
  // them), or help is brought in as for a spinner's backlog (wake_due: at
  // once, or after kBacklogNs while a sleeper watches the queues). Without
  // this, a pool whose workers all ran long tasks kept such a cell queued
  // with a worker slot free (PoolWorkers.WorkersStartOnDemandUpToMax, about
  // once in 300 to 21,000 runs under TSan with other tests loading the
  // machine). Help at once after every batch, as a submitter's push brings
  // it, doubled crew's sched p99 at 500k and 1M tasks/s: under a steady
  // load the one spinner pops a batch whenever two tasks are queued.
  void after_batch(Worker& w) noexcept;

  template <class G>
  void run_plain_here(G&& g) noexcept {
    const InlineRun here(this);
    try {
      g();
      count_here(TaskStatus::succeeded);
    } catch (...) {
      report_exception(TaskRef{}, std::current_exception());
      count_here(TaskStatus::failed);
    }
  }

  // Runs a popped plain cell on this thread (shutdown sweeps); long and
  // observed cells go through this pool's Runner side.
  void run_cell_here(Cell& cell) noexcept {
    const InlineRun here(this);
    try {
      if (!cell.invoke_and_destroy(static_cast<Runner*>(this))) count_here(TaskStatus::succeeded);
    } catch (...) {
      report_exception(TaskRef{}, std::current_exception());
      count_here(TaskStatus::failed);
    }
  }

  // ---- implementation (src/) ----
  // How a worker's loop ended: `counted` if it already took itself out of
  // live_workers_ (idle timeout, resize), `leave` if worker_exited must.
  enum class Exit : std::uint8_t { counted, leave, abandoned };
  // How a worker's sleep ended: woken by a waker (`woken_spinning`: it was
  // handed a spinning token), told to look (`woken`: state or attention
  // changed), or left on its own look because work was queued that no
  // running spinner would take (`saw_work`: it then looks as a spinner
  // does, so that it brings in help for what it leaves queued).
  enum class Slept : std::uint8_t { woken, woken_spinning, saw_work, retired };

  // pool.cpp
  // The one place the pool's state changes (asserts the edge is legal).
  void set_state(PoolState to) noexcept;
  bool transition(PoolState from, PoolState to) noexcept;  // compare-exchange
  void grow() noexcept;
  // grow() once per queued task, up to max_workers.
  void grow_for_queued() noexcept;
  // worker.cpp
  static void worker_thread(std::shared_ptr<PoolCore> self, std::shared_ptr<Worker> w,
                            bool spinning, bool replacement);
  void worker_exited(const std::shared_ptr<Worker>& w, Exit how, bool died) noexcept;
  Exit work_loop(Worker& w, bool spinning);
  bool attend(Worker& w, Exit& how);
  bool handle_cell(Worker& w, Cell& cell);
  bool handle_state(Worker& w, TaskStateBase* s);
  // Counts an outcome decided on this thread (a worker's own counters, or
  // the shared ones on any other thread).
  void count_here(TaskStatus outcome) noexcept;
  // wake.cpp
  bool spin_for_work(Worker& w, Cell& cell, bool already_spinning) noexcept;
  // The wake policy's constants are in src/engine/wake_policy.hpp.
  bool wake_due(Worker& w, std::size_t queued) noexcept;
  void wake_for_backlog(Worker& w) noexcept;
  // Wakes a sleeper, else starts a worker if every worker is busy and
  // there is room for another (submitters, and the last spinner to see work).
  void wake_or_grow() noexcept;
  void wake_for_push() noexcept;
  Slept sleep_for_work(Worker& w) noexcept;
  void wait_out_pause(Worker& w);
  // run.cpp
  bool run_claimed(Worker* w, TaskStateBase* s, bool top_level, bool drop_ref) noexcept;
  // supervisor.cpp: the submission path's calls into the Supervisor (a
  // queue deadline armed, or disarmed when its task left the queue).
  void arm_queue_deadline(TaskStateBase* s);
  void disarm_timer(TaskStateBase* s) noexcept;
  // shutdown.cpp: a push that saw the pool stopping, handed to the
  // ShutdownSequence (a running shutdown sweeps the cell; after one has
  // finished, the submitter runs or rejects it here).
  void on_push_after_close() noexcept;
};

}  // namespace crew::detail
