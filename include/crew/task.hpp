// crew/task.hpp: task options, the context a long task receives, and the
// Task<T> handle returned by Pool::submit.
//
// A *short* task is a callable taking no arguments: it runs to completion and
// cannot be interrupted. A *long* task takes a `std::stop_token` or a
// `const crew::TaskContext&`: it has an execution deadline, and its token is
// stopped at that deadline, on cancel() and on a hard shutdown.
//
// A std::stop_callback registered on the token runs on the thread that
// stops it: the pool's stopper thread for a deadline (so a slow callback
// delays only other callbacks, never deadlines or write-offs), the caller's
// thread for cancel(), Pool::stop_worker and a hard shutdown. The pool
// stops no token after its destructor returned.
#pragma once

#include <chrono>
#include <cstdint>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "crew/detail/deadline.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/error.hpp"
#include "crew/task_status.hpp"

namespace crew {

// Per-task settings, used with designated initializers:
//   pool.submit(f, {.name = "resize", .timeout = 2s});
struct TaskOptions {
  // Shown in reports, worker snapshots, logs and metrics.
  std::string name{};
  // Execution deadline of a long task; 0 uses the pool's task_timeout.
  // Negative: submitting throws Error(invalid_options), as for queue_timeout.
  std::chrono::nanoseconds timeout{0};
  // A task still queued this long after submission is never started; it ends
  // rejected with Errc::expired. 0 means no queue deadline. A deadline is
  // armed in the pool's timer at submission and disarmed at start: crew_bench's
  // queue_deadline workload measures the cost against short_detached's.
  // The time a submitter waits for room (Overflow::block) counts: the task
  // is queued when there is room and ends expired at once. A submission
  // refused (the pool closed, the queue full) ends rejected with
  // Errc::rejected, even if its deadline passed while it was refused.
  std::chrono::nanoseconds queue_timeout{0};
  // 0 (lowest) .. PoolOptions::priority_levels - 1 (highest). Submitting a
  // higher one throws Error(invalid_options).
  std::uint8_t priority = 0;
  // The caller's id for this task (a request id), at most
  // kMaxCorrelationId bytes: longer, submitting throws
  // Error(invalid_options); it is never cut. Shown in worker snapshots,
  // shutdown reports, on_exception's TaskRef, log lines and the task's
  // TaskContext; never a metric label (one series per request would grow
  // without bound). Like a name, it gives the task a state (one allocation).
  std::string correlation_id{};
};

inline constexpr std::size_t kMaxCorrelationId = 64;

// What a long task may take instead of a bare stop token. Valid for the
// duration of the call.
struct TaskContext {
  std::stop_token stop_token;
  std::uint64_t id = 0;
  std::string_view name;
  std::string_view correlation_id;  // TaskOptions::correlation_id
  // time_point::max() when the task has no execution deadline.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  [[nodiscard]] bool stop_requested() const noexcept { return stop_token.stop_requested(); }
};

template <class F>
inline constexpr bool is_long_task_v =
    std::is_invocable_v<F&, const TaskContext&> || std::is_invocable_v<F&, std::stop_token>;

template <class F>
inline constexpr bool is_task_v = is_long_task_v<F> || std::is_invocable_v<F&>;

namespace detail {
template <class F, class = void>
struct TaskResult {
  using type = std::invoke_result_t<F&>;
};
template <class F>
struct TaskResult<F, std::enable_if_t<std::is_invocable_v<F&, const TaskContext&>>> {
  using type = std::invoke_result_t<F&, const TaskContext&>;
};
template <class F>
struct TaskResult<F, std::enable_if_t<!std::is_invocable_v<F&, const TaskContext&> &&
                                      std::is_invocable_v<F&, std::stop_token>>> {
  using type = std::invoke_result_t<F&, std::stop_token>;
};
}  // namespace detail

// What a task returns: the callable's result for its calling convention.
template <class F>
using task_result_t = typename detail::TaskResult<F>::type;

// What cancel() did.
enum class CancelResult : std::uint8_t {
  cancelled,          // it was queued and will never run
  stop_requested,     // it is a running long task; its token is now stopped
  not_interruptible,  // it is a running short task; it will finish normally
  already_finished,   // it had an outcome already
};

[[nodiscard]] std::string_view to_string(CancelResult r) noexcept;

// A handle to a submitted task. Move-only; destroying it does not cancel the
// task. All member functions may be called from any thread, but one handle
// must not be used by two threads at once (like std::future).
//
// When a wait for the task returns (wait(), get(), ready() turning true),
// the task's callable and its captures have been destroyed, and the pool's
// stats() already count its outcome; the pool's observers and handlers of
// the task may still be running (Pool::wait_idle() waits for them). A task
// that ends without running (cancelled or dropped while queued, expired in
// the queue) is settled by the thread that decides it, before the outcome
// shows: its callable is destroyed there (the caller of cancel(), a
// shutdown, or for an expiry the pool's supervisor) and the pool counts it.
template <class T>
class [[nodiscard]] Task {
 public:
  Task() noexcept = default;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  Task(Task&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      reset();
      state_ = std::exchange(o.state_, nullptr);
    }
    return *this;
  }
  ~Task() { reset(); }

  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  [[nodiscard]] std::uint64_t id() const noexcept { return state_ ? state_->id : 0; }
  [[nodiscard]] std::string_view name() const noexcept {
    return state_ ? std::string_view(state_->name()) : std::string_view{};
  }
  [[nodiscard]] std::string_view correlation_id() const noexcept {
    return state_ ? std::string_view(state_->correlation_id()) : std::string_view{};
  }
  [[nodiscard]] TaskStatus status() const noexcept {
    return state_ ? state_->status() : TaskStatus::rejected;
  }
  // For a task that ended without a value of its own: why (Errc::rejected,
  // shutdown_dropped, expired, cancelled, timed_out, abandoned).
  [[nodiscard]] Errc reason() const noexcept {
    return state_ ? state_->reason() : Errc::empty_handle;
  }
  [[nodiscard]] bool ready() const noexcept { return state_ && state_->done(); }
  // How long the task waited in the queue (from its submission until it
  // started, or until its outcome if it never ran) and how long it ran
  // (until its callable returned, or until it was written off). Known
  // once the task has an outcome: 0 before, for an empty handle, and in a
  // pool that does not time its tasks (PoolOptions::time_tasks, or an
  // observer that wants timings). Such a pool reads the clock at the
  // submission and at the end of the run (a run that directly follows
  // another on the same worker takes that one's end as its start). Exact
  // below 67 ms, within 2^-26 of the value above.
  [[nodiscard]] std::chrono::nanoseconds queue_wait() const noexcept {
    return state_ && state_->done() ? state_->clock.queue_wait() : std::chrono::nanoseconds{0};
  }
  [[nodiscard]] std::chrono::nanoseconds run_time() const noexcept {
    return state_ && state_->done() ? state_->clock.run_time() : std::chrono::nanoseconds{0};
  }

  // Blocks until the task has an outcome. Called from a worker of the same
  // pool, it does not idle: it runs queued tasks of the pool meanwhile (the
  // worker's own newest tasks first, then this task if it is still queued,
  // then others while the stack has room), so a worker waiting for a
  // subtask never deadlocks its pool, and nested waits use stack in
  // proportion to the depth of the recursion, not to the number of tasks
  // (docs/api.md, "Fork-join"). From any other thread it sleeps. On a worker
  // with less than its stack's reserve left (a chain of nested waits
  // thousands deep) it nests nothing: a task still queued is cancelled
  // (reason Errc::stack_exhausted) and the call throws
  // Error(Errc::stack_exhausted); one running elsewhere is slept on.
  void wait() const { (void)wait_until(std::chrono::steady_clock::time_point::max()); }
  // Any duration: one too large to add to the clock (nanoseconds::max(),
  // hours::max()) means no deadline.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    return wait_until(detail::saturating_deadline(std::chrono::steady_clock::now(), d));
  }
  // As wait(), giving up at the deadline; true if the task has ended. On a
  // worker of the task's pool the deadline is looked at between the tasks
  // it runs meanwhile: the call returns late by as long as such a task
  // runs.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const {
    check();
    if (state_->done()) return true;
    const int helped = detail::wait_as_worker(state_, deadline);
    if (helped >= 0) return helped == 1;
    return state_->wait_until(deadline);
  }

  // Waits, then returns the value, rethrows the task's exception, or throws
  // crew::Error for a task that was rejected, cancelled or timed out. A value
  // is moved out: call get() once.
  T get() {
    wait();
    switch (state_->status()) {
      case TaskStatus::succeeded:
        if constexpr (std::is_void_v<T>) {
          return;
        } else {
          return std::move(static_cast<detail::ResultStateBase<T>*>(state_)->value());
        }
      case TaskStatus::failed:
        std::rethrow_exception(state_->error);
      default:
        throw Error(
            state_->reason(),
            std::string("task ") + describe() + ": " + std::string(to_string(state_->reason())),
            state_->refused_as, state_->overload_reason());
    }
  }

  // Cancels a queued task (it never runs), or stops the token of a running
  // long task (it then ends `cancelled` however it returns). A running short
  // task cannot be interrupted and finishes normally.
  //
  // `cancelled`: the callable is destroyed on the calling thread before
  // cancel() returns. `already_finished` also when a long task's callable
  // had returned and its outcome was decided but not yet published: cancel()
  // then waits for the publication, which runs no user code (a few
  // bookkeeping steps on the task's thread), so that status() reads the
  // outcome afterwards. May be called from any thread, a worker of the
  // task's pool included.
  CancelResult cancel() noexcept {
    if (!state_) return CancelResult::already_finished;
    if (state_->leave_queue(TaskStatus::cancelled, Errc::cancelled)) return CancelResult::cancelled;
    if (state_->done()) return CancelResult::already_finished;
    if (!state_->is_long) return CancelResult::not_interruptible;
    if (state_->request_stop(detail::StopReason::cancelled) != detail::StopRequest::too_late) {
      return CancelResult::stop_requested;
    }
    (void)state_->wait_until(std::chrono::steady_clock::time_point::max());
    return CancelResult::already_finished;
  }

  // For crew internals and adapters: the shared state (may be null).
  [[nodiscard]] detail::TaskStateBase* state() const noexcept { return state_; }
  explicit Task(detail::TaskStateBase* adopted) noexcept : state_(adopted) {}

 private:
  void check() const {
    if (!state_) throw Error(Errc::empty_handle, "crew::Task: empty handle");
  }
  std::string describe() const {
    const std::string& name = state_->name();
    return name.empty() ? "#" + std::to_string(state_->id)
                        : "'" + name + "' #" + std::to_string(state_->id);
  }
  void reset() noexcept {
    if (state_) std::exchange(state_, nullptr)->release();
  }

  detail::TaskStateBase* state_ = nullptr;
};

namespace detail {
template <class R, class F>
std::stop_token TaskState<R, F>::stop_token_of(const TaskContext& ctx) {
  return ctx.stop_token;
}
}  // namespace detail

}  // namespace crew
