// crew/asio.hpp: crew pools from Boost.Asio. A submission whose completion
// is delivered to an Asio completion token, so that an Asio program (an HTTP
// server on its I/O threads, a coroutine) hands work to a crew::Pool and
// resumes when the task has ended, with no thread parked waiting for it:
//
//   // a callback, run on `ex` (or on the handler's associated executor)
//   crew::asio::async_submit(pool, ex, [] { return 6 * 7; },
//                            [](std::exception_ptr e, int v) { ... });
//   // a C++20 coroutine
//   int v = co_await crew::asio::async_submit(pool, ex, [] { return 6 * 7; },
//                                             boost::asio::use_awaitable);
//
// Optional and header-only: target crew::asio (CMake), which adds Boost's
// headers to crew::crew; the core library needs only the standard library.
// Built on the pool's public API (Pool::submit / try_submit) alone.
//
// The completion signature is void(std::exception_ptr, R) for a task
// returning R, void(std::exception_ptr) for one returning void; with
// use_awaitable the exception is thrown from co_await, as usual in Asio.
// Exactly one completion per submission, never run inside the initiating
// call, always through the handler's associated executor (default: `ex`),
// whose execution context is kept busy (outstanding work) until then:
//
//   the task ran           its value, or the exception it threw. A long task
//                          (taking std::stop_token or const TaskContext&)
//                          whose token was stopped ends as the pool counts
//                          it, however it returned: crew::Error(timed_out)
//                          once its deadline has passed, else
//                          crew::Error(cancelled) (a hard shutdown);
//   refused at admission   crew::Error(Errc::rejected), admission() saying
//                          why (closed, full, too_many_blocked, overloaded,
//                          then overload_reason() too), at once;
//   shed by the overload   crew::Error(Errc::overloaded), overload_reason()
//   controller             codel, on the worker that popped it, which then
//                          destroys f unrun;
//   expired in the queue   crew::Error(Errc::expired), posted by the pool's
//                          supervisor thread at the queue deadline (within
//                          its timer's precision), however long the workers
//                          stay busy; f is destroyed unrun right after, on
//                          that thread;
//   dropped unrun          crew::Error(Errc::shutdown_dropped) (a soft or
//                          hard shutdown took it from the queue), or
//                          Errc::expired if its queue deadline had passed.
//
// In each error case the value argument is R{} (R must be default
// constructible; wrap it in std::optional otherwise). If async_submit
// throws (invalid TaskOptions: Error(invalid_options), checked before the
// handler is taken over; std::bad_alloc), the exception is the one signal:
// there is no completion and the handler is destroyed uncalled. A
// queue_timeout too large to add to the clock (nanoseconds::max()) means
// no queue deadline, as for the pool.
//
// The task is an ordinary pool task: it has an outcome in stats(), metrics
// and shutdown reports like any other (an exception counts as failed).
// async_submit blocks while the queue is full if the pool's overflow policy
// is block; from an event loop use async_try_submit, or a pool whose policy
// is reject. Under caller_runs a refused-for-room task runs on the caller
// (its completion is still posted). Cancellation slots are not supported:
// the pool's own deadlines (TaskOptions::timeout, queue_timeout) bound a task.
//
// Thread safety: as Pool::submit. Completions run on the handler's executor;
// they are posted from the thread that decides them (the one that ran the
// task, the pool's supervisor for expired, the submitting thread for a
// refusal, the thread that drops a task or destroys one unrun), so a handler's
// executor must accept posts from any thread, as Asio's do. When that
// executor's context is an io_context (its own executor, a strand on it,
// an any_io_executor holding either), the post takes none of the
// io_context's locks: it goes through a PostSlot (crew/asio_post_slot.hpp)
// reserved at the submission, and an I/O thread posts it on to the
// executor. A worker preempted by the I/O thread it wakes then holds
// nothing that thread needs.
// Lifetimes: the executor's execution context must outlive every completion
// (the tracked work, or the slot, keeps io_context::run() from returning
// before them).
#pragma once

#include <atomic>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/executor.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "crew/asio_post_slot.hpp"
#include "crew/detail/deadline.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "crew/task.hpp"

namespace crew::asio {

namespace detail {

template <class R>
struct Signature {
  using type = void(std::exception_ptr, R);
};
template <>
struct Signature<void> {
  using type = void(std::exception_ptr);
};

}  // namespace detail

// The completion signature of a submission of F.
template <class F>
using completion_signature_t = typename detail::Signature<task_result_t<std::decay_t<F>>>::type;

namespace detail {

using Clock = std::chrono::steady_clock;

// Outstanding work on an executor, standard (execution::) or Networking TS
// style, until reset().
template <class Executor, class = void>
class TrackedWork {
 public:
  explicit TrackedWork(const Executor& ex)
      : tracked_(boost::asio::prefer(ex, boost::asio::execution::outstanding_work.tracked)) {}
  void reset() noexcept { tracked_.reset(); }

 private:
  using Tracked = std::decay_t<decltype(boost::asio::prefer(
      std::declval<const Executor&>(), boost::asio::execution::outstanding_work.tracked))>;
  std::optional<Tracked> tracked_;
};

template <class Executor>
class TrackedWork<Executor,
                  std::enable_if_t<!boost::asio::execution::is_executor<Executor>::value>> {
 public:
  explicit TrackedWork(const Executor& ex) : guard_(ex) {}
  void reset() noexcept { guard_.reset(); }

 private:
  boost::asio::executor_work_guard<Executor> guard_;
};

// The io_context behind an executor, or null: an io_context's executor
// (any allocator and properties), a strand on one, or a polymorphic
// executor (any_io_executor) holding either; null for the rest (a
// thread_pool's, the system executor).
template <class Executor>
struct IsIoExecutor : std::false_type {};
template <class Allocator, unsigned int Bits>
struct IsIoExecutor<boost::asio::io_context::basic_executor_type<Allocator, Bits>>
    : std::true_type {};
template <class Executor>
struct IsStrand : std::false_type {};
template <class Inner>
struct IsStrand<boost::asio::strand<Inner>> : std::true_type {};

template <class Executor>
boost::asio::io_context* io_context_of(const Executor& ex) noexcept {
  using Io = boost::asio::io_context::executor_type;
  if constexpr (IsIoExecutor<Executor>::value) {
    return &ex.context();
  } else if constexpr (IsStrand<Executor>::value) {
    return io_context_of(ex.get_inner_executor());
  } else if constexpr (requires {
                         ex.target_type();
                         ex.template target<Io>();
                       }) {
    // Asio 1.18's any_executor::target() casts without looking: the type
    // is checked first.
    if (ex.target_type() == typeid(Io)) return &ex.template target<Io>()->context();
    if (ex.target_type() == typeid(boost::asio::strand<Io>)) {
      return &ex.template target<boost::asio::strand<Io>>()->get_inner_executor().context();
    }
    return nullptr;
  } else {
    return nullptr;
  }
}

// A completion's handler in its io_context's Inbox, pushed once the pool
// has published the task's outcome (crew::detail::AfterOutcome): by the
// thread that ran the task, right after the publication.
template <class Fn>
struct CompletionNode final : InboxFn<Fn>, crew::detail::AfterOutcome {
  CompletionNode(Fn&& handler, Inbox* to) : InboxFn<Fn>(std::move(handler)), inbox(to) {
    fire = &push_now;
  }
  static void push_now(crew::detail::AfterOutcome* a) noexcept {
    auto* self = static_cast<CompletionNode*>(a);
    self->inbox->push(self);
  }
  Inbox* inbox;
};

// What a submission shares with its task: the handler and the right to
// complete it. Whoever claims first (the task when it ends, the submission
// when admission refused it or the pool threw, the pool's supervisor at the
// queue deadline, the destructor when the task was destroyed unrun)
// delivers the one completion.
template <class Handler, class IoExecutor, class R>
class Completion {
 public:
  using HandlerExecutor = boost::asio::associated_executor_t<Handler, IoExecutor>;

  Completion(Handler&& handler, const IoExecutor& io_ex, std::string name,
             Clock::duration queue_timeout)
      : handler_(std::move(handler)),
        executor_(boost::asio::get_associated_executor(*handler_, io_ex)),
        slot_(reserve(executor_)),
        work_(track(slot_, executor_)),
        name_(std::move(name)),
        expires_(queue_timeout > Clock::duration::zero()
                     ? crew::detail::saturating_deadline(Clock::now(), queue_timeout)
                     : Clock::time_point::max()) {}
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  // The task was destroyed without having run and nobody completed: the
  // pool dropped it (queue deadline, shutdown).
  ~Completion() {
    if (claim()) {
      fail(Clock::now() >= expires_ ? Errc::expired : Errc::shutdown_dropped, Admission::accepted);
    }
  }

  // True for the one caller that may deliver.
  [[nodiscard]] bool claim() noexcept {
    return !claimed_.exchange(true, std::memory_order_acq_rel);
  }

  // The task's queue deadline passed (on the pool's supervisor thread): the
  // completion is posted now, not when the pool destroys the task. Out of
  // memory before the handler was handed over, the claim is given back and
  // ~Completion delivers instead, when the task is destroyed.
  void expire() noexcept {
    if (!claim()) return;
    try {
      fail(Errc::expired, Admission::accepted);
    } catch (...) {
      if (handler_) claimed_.store(false, std::memory_order_release);
    }
  }

  // `after_outcome`: called from the task's run (Runner), so the push to
  // an io_context waits until the pool has published the outcome (and
  // counted it): the handler then finds the handle ready. Elsewhere, and
  // to other executors, the completion is posted at once.
  template <class... Args>
  void deliver(bool after_outcome, Args&&... args) {
    // The arguments first: if that throws, the handler is still here.
    auto bound = std::make_tuple(std::forward<Args>(args)...);
    auto fn = [h = std::move(*handler_), args = std::move(bound)]() mutable {
      std::apply(std::move(h), std::move(args));
    };
    handler_.reset();
    if (slot_) {
      // Run by the io_context's drain, on one of its threads, which posts
      // it on: an ordinary handler of the executor (any of the context's
      // threads may run it, a strand orders it), and nobody else takes the
      // context's lock there now.
      auto on = [ex = executor_, fn = std::move(fn)]() mutable {
        boost::asio::post(ex, std::move(fn));
      };
      if (after_outcome) {
        using Node = CompletionNode<decltype(on)>;
        auto* node = new Node(std::move(on), nullptr);  // may throw: still reserved
        node->inbox = slot_->take_reservation();
        crew::detail::defer_after_outcome(node);
      } else {
        slot_->post(std::move(on));
      }
    } else {
      boost::asio::post(executor_, std::move(fn));
    }
    work_.reset();  // the posted completion is outstanding work of its own (no-op with a slot)
  }

  // The task was shed (on the worker that popped it): as expire().
  void shed(OverloadReason why) noexcept {
    if (!claim()) return;
    try {
      fail(Errc::overloaded, Admission::accepted, why);
    } catch (...) {
      if (handler_) claimed_.store(false, std::memory_order_release);
    }
  }

  void fail(Errc code, Admission admission, OverloadReason overload = OverloadReason::none,
            bool after_outcome = false) {
    std::string what = "task";
    if (!name_.empty()) what += " '" + name_ + "'";
    what += ": " + std::string(to_string(code));
    if (code == Errc::rejected) what += " (" + std::string(to_string(admission)) + ")";
    if (overload != OverloadReason::none) what += " (" + std::string(to_string(overload)) + ")";
    auto e = std::make_exception_ptr(Error(code, what, admission, overload));
    if constexpr (std::is_void_v<R>) {
      deliver(after_outcome, std::move(e));
    } else {
      deliver(after_outcome, std::move(e), R{});
    }
  }

 private:
  // The way back to an io_context, taking none of its locks (PostSlot).
  static std::optional<PostSlot> reserve(const HandlerExecutor& ex) {
    boost::asio::io_context* io = io_context_of(ex);
    if (io == nullptr) return std::nullopt;
    return std::optional<PostSlot>(std::in_place, *io);
  }

  // Outstanding work of the executor's context until the post, where no
  // slot keeps it: a reserved slot does already (its Inbox waits while any
  // slot is outstanding).
  static std::optional<TrackedWork<HandlerExecutor>> track(const std::optional<PostSlot>& slot,
                                                           const HandlerExecutor& ex) {
    if (slot) return std::nullopt;
    return std::optional<TrackedWork<HandlerExecutor>>(std::in_place, ex);
  }

  std::optional<Handler> handler_;
  HandlerExecutor executor_;
  std::optional<PostSlot> slot_;                      // empty: posted through executor_
  std::optional<TrackedWork<HandlerExecutor>> work_;  // empty with a slot
  std::string name_;
  Clock::time_point expires_;
  std::atomic<bool> claimed_{false};
};

// The callable the pool runs: the user's function, then the completion.
// It returns void and rethrows the function's exception, so that the pool
// counts the task as it would count the function itself. At the queue
// deadline the pool's supervisor completes it with expired
// (QueueExpiryListener), then destroys it unrun.
template <class F, class Op>
class Runner : public crew::detail::QueueExpiryListener {
 public:
  using R = task_result_t<F>;

  Runner(F&& f, std::shared_ptr<Op> op) : f_(std::move(f)), op_(std::move(op)) {}
  Runner(Runner&&) noexcept = default;
  Runner& operator=(Runner&&) = delete;
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  ~Runner() = default;

  void operator()() requires(!is_long_task_v<F>) {
    run([this]() -> decltype(auto) { return f_(); }, nullptr);
  }

  // The supervisor's thread, while the pool holds the task (see
  // QueueExpiryListener): op_ is still here, since the task never ran.
  void on_queue_expired() noexcept { op_->expire(); }
  // The worker's thread, as on_queue_expired (the task never ran).
  void on_queue_shed(OverloadReason why) noexcept { op_->shed(why); }

  void operator()(const TaskContext& ctx) requires is_long_task_v<F> {
    run(
        [this, &ctx]() -> decltype(auto) {
          if constexpr (std::is_invocable_v<F&, const TaskContext&>) {
            return f_(ctx);
          } else {
            return f_(ctx.stop_token);
          }
        },
        &ctx);
  }

 private:
  template <class Call>
  void run(Call&& call, const TaskContext* ctx) {
    std::exception_ptr error;
    std::optional<std::conditional_t<std::is_void_v<R>, char, R>> value;
    try {
      if constexpr (std::is_void_v<R>) {
        call();
        value.emplace();
      } else {
        value.emplace(call());
      }
    } catch (...) {
      error = std::current_exception();
    }
    // The pool's rule for a long task whose token was stopped: timed out
    // past its deadline, cancelled otherwise, whatever it returned.
    const bool stopped = ctx != nullptr && ctx->stop_token.stop_requested();
    std::shared_ptr<Op> op = std::move(op_);
    // Delivered once the pool has published the outcome (this is the
    // task's run: the pool's run of it goes on to publish).
    constexpr bool kAfterOutcome = true;
    if (op->claim()) {
      if (stopped) {
        op->fail(Clock::now() >= ctx->deadline ? Errc::timed_out : Errc::cancelled,
                 Admission::accepted, OverloadReason::none, kAfterOutcome);
      } else if (error) {
        if constexpr (std::is_void_v<R>) {
          op->deliver(kAfterOutcome, error);
        } else {
          op->deliver(kAfterOutcome, error, R{});
        }
      } else if constexpr (std::is_void_v<R>) {
        op->deliver(kAfterOutcome, std::exception_ptr());
      } else {
        op->deliver(kAfterOutcome, std::exception_ptr(), std::move(*value));
      }
    }
    if (error && !stopped) std::rethrow_exception(error);
  }

  // Destroyed after op_: a completion delivered from op_'s destructor may
  // still rely on what the function holds (an owner of the executor's
  // execution context, say).
  F f_;
  std::shared_ptr<Op> op_;
};

template <class F>
constexpr void check_result() {
  using R = task_result_t<F>;
  static_assert(std::is_void_v<R> || std::is_default_constructible_v<R>,
                "crew::asio: the task's result must be default constructible (it is the value "
                "argument of an error completion); wrap it in std::optional");
  static_assert(std::is_void_v<R> || std::is_move_constructible_v<R>,
                "crew::asio: the task's result must be move constructible");
}

struct Initiate {
  // Not inlined: under use_awaitable this runs inside Asio's initiating
  // coroutine, whose frame the completion destroys (on an I/O thread,
  // possibly before this call returns), and clang places the locals of a
  // callee inlined there in that frame (ThreadSanitizer saw `task` freed
  // under it). Its own stack frame keeps them out of reach.
  template <class Handler, class Executor, class F>
  [[gnu::noinline]] void operator()(Handler&& handler, Pool* pool, const Executor& ex, F&& f,
                                    TaskOptions opts, bool may_block,
                                    Task<void>* keep = nullptr) const {
    using Fn = std::decay_t<F>;
    using R = task_result_t<Fn>;
    using Op = Completion<std::decay_t<Handler>, Executor, R>;
    // Invalid options throw before anything owns the handler: the caller
    // gets the exception and no completion.
    pool->check_options(opts);
    auto op = std::make_shared<Op>(std::forward<Handler>(handler), ex, opts.name,
                                   std::chrono::duration_cast<Clock::duration>(opts.queue_timeout));
    Task<void> task;
    try {
      Runner<Fn, Op> runner(Fn(std::forward<F>(f)), op);
      task = may_block ? pool->submit(std::move(runner), std::move(opts))
                       : pool->try_submit(std::move(runner), std::move(opts));
    } catch (...) {
      // Out of memory, or the function's move threw: the exception is the
      // one signal, so the handler is dropped uncalled. Nothing was queued
      // (the pool throws only before it takes a task), so nobody else
      // claims.
      (void)op->claim();
      throw;
    }
    if (task.status() == TaskStatus::rejected && task.reason() == Errc::rejected) {
      Admission why = Admission::closed;
      OverloadReason overload = OverloadReason::none;
      try {
        task.get();
      } catch (const Error& e) {
        why = e.admission();
        overload = e.overload_reason();
      }
      if (op->claim()) op->fail(Errc::rejected, why, overload);
    }
    // Dropping the handle neither cancels the task nor waits for it.
    if (keep != nullptr) *keep = std::move(task);
  }
};

}  // namespace detail

// Submits f to `pool` (Pool::submit: blocks while the queue is full under
// Overflow::block) and delivers its outcome to `token` through `ex`.
template <class Executor, class F, class CompletionToken>
  requires is_task_v<std::decay_t<F>>
auto async_submit(Pool& pool, const Executor& ex, F&& f, TaskOptions opts,
                  CompletionToken&& token) {
  detail::check_result<std::decay_t<F>>();
  return boost::asio::async_initiate<CompletionToken, completion_signature_t<F>>(
      detail::Initiate{}, token, &pool, ex, std::forward<F>(f), std::move(opts), true);
}

template <class Executor, class F, class CompletionToken>
  requires is_task_v<std::decay_t<F>>
auto async_submit(Pool& pool, const Executor& ex, F&& f, CompletionToken&& token) {
  return async_submit(pool, ex, std::forward<F>(f), TaskOptions{},
                      std::forward<CompletionToken>(token));
}

// As async_submit, but never blocks (Pool::try_submit): a full queue
// completes at once with crew::Error(rejected), admission() == full.
template <class Executor, class F, class CompletionToken>
  requires is_task_v<std::decay_t<F>>
auto async_try_submit(Pool& pool, const Executor& ex, F&& f, TaskOptions opts,
                      CompletionToken&& token) {
  detail::check_result<std::decay_t<F>>();
  return boost::asio::async_initiate<CompletionToken, completion_signature_t<F>>(
      detail::Initiate{}, token, &pool, ex, std::forward<F>(f), std::move(opts), false);
}

// As above, and `handle` receives the task's handle (before the initiating
// call returns; the completion may have run by then), e.g. to cancel() it:
// a queued task cancelled completes with Errc::shutdown_dropped (it is
// destroyed unrun), a running long task with Errc::cancelled. For a task
// that ran, with a handler on an io_context's executor, the completion
// reaches the io_context once the pool has published the outcome: the
// handle is ready when it runs (queue_wait(), run_time() set) and stats()
// counts the task. Posted to other executors, and for a task that ended
// unrun (refused, expired, shed, dropped), it may run before that, the
// handle still showing the task queued or running for some microseconds.
template <class Executor, class F, class CompletionToken>
  requires is_task_v<std::decay_t<F>>
auto async_try_submit(Pool& pool, const Executor& ex, F&& f, TaskOptions opts,
                      CompletionToken&& token, Task<void>& handle) {
  detail::check_result<std::decay_t<F>>();
  return boost::asio::async_initiate<CompletionToken, completion_signature_t<F>>(
      detail::Initiate{}, token, &pool, ex, std::forward<F>(f), std::move(opts), false, &handle);
}

template <class Executor, class F, class CompletionToken>
  requires is_task_v<std::decay_t<F>>
auto async_try_submit(Pool& pool, const Executor& ex, F&& f, CompletionToken&& token) {
  return async_try_submit(pool, ex, std::forward<F>(f), TaskOptions{},
                          std::forward<CompletionToken>(token));
}

}  // namespace crew::asio
