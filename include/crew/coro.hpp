// crew/coro.hpp: coroutine tasks, tasks that wait without holding a thread.
//
//   crew::Co<int> fetch(int id) {
//     co_await crew::sleep_for(10ms);        // the worker runs other tasks meanwhile
//     int a = co_await child(id);            // another coroutine, same task
//     crew::Task<int> t = pool.submit(work);
//     co_return a + co_await t;              // a task handle
//   }
//   crew::Task<int> t = crew::spawn(pool, fetch(7), {.name = "fetch", .timeout = 2s});
//
// A Co<R> is a lazy coroutine: it runs only once spawned onto a pool, or
// awaited by a coroutine that runs on one. spawn() gives the same Task<R>
// handle as Pool::submit (get, wait, cancel, status, reason, id, name), with
// the same TaskOptions and the same admission (the pool's overflow policy;
// try_spawn never blocks; a refused task's handle is rejected with
// Error::admission() saying why). Each spawned coroutine is one *coroutine
// task*: the root coroutine and every Co it awaits, with one stop token and
// one outcome.
//
// Where it runs: each step (the start, and each resumption after a
// suspension) is a short task of the task's pool at the task's priority, so
// a coroutine task always resumes on a worker of its own pool; when the
// coroutine task it awaits ends on a worker of the same pool, that worker
// goes on with it at once (symmetric transfer, no queued step). (The start
// runs on the spawning thread only when the pool's admission says so:
// Overflow::caller_runs on a full queue, or a worker of the pool whose
// queues are full.) Consecutive steps may run on different workers.
//
// What a coroutine task can co_await (each suspension holds no thread):
//   Co<T>                  runs it in the same task, by symmetric transfer (no
//                          stack growth however long the chain); returns its
//                          value or rethrows its exception
//   Task<T>& / Task<T>&&   a handle of this or another pool; returns get():
//                          the value, the task's exception, or crew::Error for
//                          a task that ended without a value. A coroutine
//                          task's handle resumes the waiter when it ends; any
//                          other task is polled (every 50 us doubling to 1 ms)
//   sleep_for / sleep_until   the pool's coroutine timer
//   yield()                lets the pool's other tasks run first
//   when_all / when_any    over a vector of handles (below)
//   wait_all(group)        every task of a crew::Group (below)
//   schedule(pool)         yield() on the task's own pool
//   on_callback<T>(start)  an operation outside crew that reports through a
//                          callback (Asio, client libraries): crew/on_callback.hpp
//   spawn_when_room(pool, co)  spawn() that suspends, instead of blocking
//                          the worker, while `pool`'s queue is full; returns
//                          the new task's handle (below)
//   Forked<T>              the join of a child forked with crew::fork(co):
//                          fine-grained fork-join inside one task (below)
//
// Stop and deadline: every coroutine task has a std::stop_token
// (current_stop_token()); Task::cancel(), the task's timeout (TaskOptions::
// timeout, else PoolOptions::task_timeout, counted from its start) and a
// shutdown stop it, and a coroutine task spawned from another one is
// stopped with it. A stop ends the current suspension at once: the co_await
// throws crew::Error(Errc::timed_out) if the task's deadline passed, else
// crew::Error(Errc::cancelled); every later suspension throws the same at
// once. The task ends cancelled or timed_out however its coroutine returns
// (as a long task does); an exception is failed, never std::terminate.
// Once the pool accepted it, the task's status is running even while its
// start is still queued: a cancel() then returns stop_requested, and the
// start, when it comes up stopped or past the task's queue_timeout,
// destroys the frame unrun and ends the task cancelled (Errc::cancelled,
// Errc::expired). Task::wait() and get() on a worker of the task's pool run
// the pool's queued tasks meanwhile, the coroutine's steps among them, as
// for any task: such a wait never deadlocks the pool.
//
// Shutdown (crew/detail/suspended_tasks.hpp): before the pool stops taking
// tasks, drain waits for its coroutine tasks to end; soft and hard (and a drain
// past its timeout, which then reports escalated) stop them and wait
// PoolOptions::abandon_grace; a frame still suspended then is destroyed on a
// worker of the pool and its task ends cancelled with Errc::abandoned, listed
// in the report's `abandoned`; coroutine tasks not started yet end cancelled
// (Errc::shutdown_dropped) unrun in soft and hard, listed in `rejected`. A
// resumption left in the queue when a soft or hard shutdown drops it destroys
// its frame there (Errc::shutdown_dropped). New coroutine tasks spawned from
// outside the pool's coroutines are refused (Admission::closed) while this
// runs. No frame outlives its pool's shutdown unless its coroutine is running
// on a thread at that moment and never returns.
//
// Frames come from crew's per-thread block cache when they are at most
// detail::kMaxCachedFrame (512) bytes (no global operator new per coroutine
// in steady state); larger frames use the global operator new. A task's
// std::stop_source is made only when current_stop_token() asks for it.
//
// Traps (docs/coroutines.md): do not keep the address of a thread_local,
// nor std::this_thread::get_id(), across a co_await (the coroutine may
// resume on another worker; read it again, through a function that is not
// inlined); under g++ 12 do not put a co_await and a lambda with
// captures, or a task handle made there (co_await spawn(...)), in one full
// expression (name the lambda or the handle first).
//
// Thread safety: spawn and try_spawn as Pool::submit. A Co<R> is move-only
// and belongs to one thread until it is spawned or awaited.
#pragma once

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <stop_token>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "crew/detail/clock.hpp"
#include "crew/detail/coro_fork.hpp"
#include "crew/detail/coro_task.hpp"
#include "crew/detail/deadline.hpp"
#include "crew/error.hpp"
#include "crew/group.hpp"
#include "crew/on_callback.hpp"
#include "crew/pool.hpp"
#include "crew/task.hpp"

namespace crew {

// A lazy coroutine returning R (void by default). Move-only; destroying a
// Co that never ran destroys its frame.
template <class R = void>
class [[nodiscard]] Co {
 public:
  using promise_type = detail::CoroPromise<R>;
  using Handle = std::coroutine_handle<promise_type>;

  Co() noexcept = default;
  Co(Co&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Co& operator=(Co&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Co(const Co&) = delete;
  Co& operator=(const Co&) = delete;
  ~Co() { reset(); }

  [[nodiscard]] bool valid() const noexcept { return static_cast<bool>(h_); }

  // Awaiting a Co from a coroutine of a task runs it in that task.
  struct Awaiter {
    Handle child;
    bool await_ready() const noexcept { return false; }
    template <detail::CrewPromise P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> parent) noexcept {
      child.promise().task = parent.promise().task;
      child.promise().continuation = parent;
      return child;
    }
    R await_resume() {
      promise_type& p = child.promise();
      if (p.error) std::rethrow_exception(p.error);
      if constexpr (!std::is_void_v<R>) return p.take();
    }
  };
  Awaiter operator co_await() && noexcept {
    CREW_ASSERT(h_, "co_await on an empty Co");
    return Awaiter{h_};
  }

  // For spawn: the frame, owned by the caller from now on.
  Handle release() noexcept { return std::exchange(h_, nullptr); }

 private:
  friend struct detail::CoroPromise<R>;
  explicit Co(Handle h) noexcept : h_(h) {}
  void reset() noexcept {
    if (h_) std::exchange(h_, nullptr).destroy();
  }
  Handle h_;
};

namespace detail {

template <class R>
Co<R> CoroPromise<R>::get_return_object() noexcept {
  return Co<R>(std::coroutine_handle<CoroPromise<R>>::from_promise(*this));
}
inline Co<void> CoroPromise<void>::get_return_object() noexcept {
  return Co<void>(std::coroutine_handle<CoroPromise<void>>::from_promise(*this));
}

template <class R>
CoroState<R>* make_coro_state(PoolCore& core, Co<R>&& co, TaskOptions&& opts, bool detached) {
  (void)detail::Submission(core).level_of(opts);  // validated before anything is allocated
  CREW_ASSERT(co.valid(), "spawn of an empty Co");
  auto* s = new CoroState<R>(co.release());
  try {
    s->setup(core, std::move(opts), detached, current_coro_task());
  } catch (...) {
    s->release();  // destroys the frame
    throw;
  }
  return s;
}

template <class R>
Task<R> spawn_with(Pool& pool, Co<R>&& co, TaskOptions&& opts, bool may_block) {
  CoroState<R>* s = make_coro_state(PoolAccess::core(pool), std::move(co), std::move(opts), false);
  (void)s->launch(may_block);
  return Task<R>(s);  // the creator's reference
}

template <class R>
Admission spawn_detached_with(Pool& pool, Co<R>&& co, TaskOptions&& opts, bool may_block) {
  CoroState<R>* s = make_coro_state(PoolAccess::core(pool), std::move(co), std::move(opts), true);
  const Admission a = s->launch(may_block);
  s->release();
  return a;
}

// A coroutine task's wait for a task handle.
template <class T>
struct TaskAwaiter {
  Task<T>& task;
  CoroTaskBase* self = nullptr;
  bool await_ready() const noexcept { return task.ready() || !task.valid(); }
  template <CrewPromise P>
  bool await_suspend(std::coroutine_handle<P> h) {
    self = waiting_task(h, "co_await of a task handle");
    // A coroutine task's state is a CoroState<T> (a type_info comparison:
    // cheaper than a cross-cast, which compares names up the hierarchy).
    TaskStateBase* st = task.state();
    CoroTaskBase* target =
        typeid(*st) == typeid(CoroState<T>) ? static_cast<CoroState<T>*>(st) : nullptr;
    return self->suspend_on(h, st, target);
  }
  T await_resume() {
    if (self != nullptr && self->end_wait()) throw self->stop_error();
    return task.get();
  }
};

struct SleepAwaiter {
  std::int64_t at_ns;
  bool stoppable = true;
  CoroTaskBase* self = nullptr;
  bool await_ready() const noexcept { return false; }
  template <CrewPromise P>
  bool await_suspend(std::coroutine_handle<P> h) {
    self = waiting_task(h, "crew::sleep_for / sleep_until");
    return self->suspend_until(h, at_ns, stoppable);
  }
  void await_resume() {
    if (self->end_wait()) throw self->stop_error();
  }
};

struct YieldAwaiter {
  CoroTaskBase* self = nullptr;
  bool await_ready() const noexcept { return false; }
  template <CrewPromise P>
  bool await_suspend(std::coroutine_handle<P> h) {
    self = waiting_task(h, "crew::yield / schedule");
    return self->suspend_yield(h);
  }
  void await_resume() {
    if (self->end_wait()) throw self->stop_error();
  }
};

}  // namespace detail

// Spawns `co` as a coroutine task of `pool`. Admission as Pool::submit: if
// the queue is full and the overflow policy is block, waits for room (never
// on a worker of the pool: the start then runs on the caller); a refused
// task's handle is already rejected. Spawned from inside a coroutine task,
// the new task is stopped when that one is. Throws Error(invalid_options)
// for bad options and std::bad_alloc, spawning nothing.
template <class R>
Task<R> spawn(Pool& pool, Co<R> co, TaskOptions opts = {}) {
  return detail::spawn_with(pool, std::move(co), std::move(opts), /*may_block=*/true);
}
// Never blocks: a full queue gives a rejected handle (Admission::full), or
// runs the start on the caller under Overflow::caller_runs.
template <class R>
Task<R> try_spawn(Pool& pool, Co<R> co, TaskOptions opts = {}) {
  return detail::spawn_with(pool, std::move(co), std::move(opts), /*may_block=*/false);
}
// Without a handle: the task's exception goes to the pool's exception
// handler (else its log), as for Pool::post. Returns the admission.
template <class R>
[[nodiscard]] Admission spawn_detached(Pool& pool, Co<R> co, TaskOptions opts = {}) {
  return detail::spawn_detached_with(pool, std::move(co), std::move(opts), /*may_block=*/true);
}

// co_await task: suspends until the task ends, then returns task.get().
// Only from a coroutine of a coroutine task (a Co). Not thread-safe on the
// handle: do not use it elsewhere meanwhile.
template <class T>
detail::TaskAwaiter<T> operator co_await(Task<T>& task) noexcept {
  return {task};
}
template <class T>
detail::TaskAwaiter<T> operator co_await(Task<T>&& task) noexcept {
  return {task};
}

// ---- fork-join inside one coroutine task ----
//
//   crew::Co<long> fib(int n) {
//     if (n < 2) co_return n;
//     crew::Forked<long> a = crew::fork(fib(n - 1));  // another worker may take it
//     const long b = co_await fib(n - 2);             // runs here
//     co_return co_await a + b;                       // the join
//   }
//
// fork(co) starts `co` as a forked child of the calling coroutine task: it
// runs inside that task (its stop token, its priority, its pool), not as a
// task of its own, so it has no handle, id, outcome, deadline or entry in
// the shutdown report, and costs about what a Group's task does. It is
// queued on the calling worker's own queue, where an idle worker may take
// it; the join, `co_await forked`, runs it on the joiner's thread if no
// worker started it, else suspends the joiner (holding no thread) until it
// ends, and returns its value or rethrows its exception. Neither way grows
// the stack: a recursion thousands of levels deep is fine.
//
// What a forked child may do: compute, co_await other Co coroutines, fork
// and join children of its own, spawn tasks and read current_stop_token()
// (its task's). What it may not: a co_await that would suspend the task
// throws Error(Errc::wait_in_fork) there (a sleep, yield, schedule and
// on_callback always; a task handle, wait_all, when_all/when_any unless
// what they wait for has ended; spawn_when_room when it would wait for
// room). Spawn a coroutine task for work that waits.
//
// Stop: a child that has not started when its task is stopped never runs:
// its join throws the task's stop error (Error(Errc::cancelled), or
// Errc::timed_out past the task's deadline). A running child runs on; it
// may check current_stop_token(). A soft or hard shutdown stops the task,
// so its joins of children not started throw; a drain runs them.
//
// Join every Forked. One destroyed unjoined (a scope left by an exception)
// discards its child's result and exception: a child not started never
// runs, and a running one is waited for first, the destructor blocking its
// thread until the child ends (its frame may refer to the parent's).
//
// fork() throws Error(Errc::invalid_options) outside a coroutine task, and
// std::bad_alloc (forking nothing). A Forked is move-only and belongs to
// the coroutine that forked it; join it from that coroutine only.
template <class R = void>
class [[nodiscard]] Forked {
 public:
  using Handle = std::coroutine_handle<detail::CoroPromise<R>>;

  Forked() noexcept = default;
  Forked(Forked&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Forked& operator=(Forked&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Forked(const Forked&) = delete;
  Forked& operator=(const Forked&) = delete;
  ~Forked() { reset(); }

  // Forked and not joined yet.
  [[nodiscard]] bool joinable() const noexcept { return static_cast<bool>(h_); }

  struct Awaiter {
    Forked& f;
    bool stopped = false;
    bool await_ready() const noexcept {
      const std::uint32_t w = f.h_.promise().fork_word.load(std::memory_order_acquire);
      return detail::fork_word::state(w) == detail::fork_word::kDone;
    }
    template <detail::CrewPromise P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> joiner) {
      return detail::fork_join(f.frame(), joiner, stopped);
    }
    R await_resume() {
      const detail::ForkedFrame frame = f.frame();
      f.h_ = nullptr;
      if (stopped) detail::fork_throw_stopped(frame);
      // Ended after its cell started it, the frame is the joiner's alone;
      // run inline, its cell may still hold it.
      struct Release {
        detail::ForkedFrame frame;
        ~Release() { detail::fork_release(frame, detail::fork_word::kOwner); }
      } release{frame};
      detail::CoroPromise<R>& p = static_cast<detail::CoroPromise<R>&>(*frame.promise);
      if (p.error) std::rethrow_exception(p.error);
      if constexpr (!std::is_void_v<R>) return p.take();
    }
  };
  // The join (see above). Throws Error(Errc::invalid_options) on a Forked
  // that is empty or joined already.
  Awaiter operator co_await() & {
    if (!h_) throw Error(Errc::invalid_options, "co_await on an empty or joined crew::Forked");
    return Awaiter{*this};
  }
  Awaiter operator co_await() && { return operator co_await(); }

 private:
  template <class T>
  friend Forked<T> fork(Co<T> co);
  explicit Forked(Handle h) noexcept : h_(h) {}
  [[nodiscard]] detail::ForkedFrame frame() const noexcept { return {h_, &h_.promise()}; }
  void reset() noexcept {
    if (!h_) return;
    const detail::ForkedFrame f = frame();
    h_ = nullptr;
    detail::fork_abandon(f);
  }
  Handle h_;
};

// Forks `co` (see Forked).
template <class T>
Forked<T> fork(Co<T> co) {
  CREW_ASSERT(co.valid(), "crew::fork of an empty Co");
  typename Co<T>::Handle h = co.release();
  detail::fork_start(detail::ForkedFrame{h, &h.promise()});
  return Forked<T>(h);
}

// Whether a stop of the task ends a sleep.
enum class StopMode : std::uint8_t {
  interrupt,  // the co_await throws at once (the default)
  ignore,     // it sleeps on (a shutdown destroys its frame past the grace)
};

// co_await sleep_for(d) / sleep_until(t): suspends until then, or until
// the task is stopped (throws, see the top). An idle worker of the pool
// sleeps until the earliest timer and resumes it itself (one wake-up);
// while every worker is busy, the pool's coroutine timer thread queues the
// resumption at the time. A time already passed does not suspend.
[[nodiscard]] inline detail::SleepAwaiter sleep_until(
    std::chrono::steady_clock::time_point t, StopMode mode = StopMode::interrupt) noexcept {
  return detail::SleepAwaiter{t.time_since_epoch().count(), mode == StopMode::interrupt};
}
template <class Rep, class Period>
[[nodiscard]] detail::SleepAwaiter sleep_for(std::chrono::duration<Rep, Period> d,
                                             StopMode mode = StopMode::interrupt) noexcept {
  return sleep_until(detail::saturating_deadline(std::chrono::steady_clock::now(), d), mode);
}

// co_await yield(): queues the rest of the coroutine behind the pool's
// queued tasks (on a worker, in its own queue, newest first).
[[nodiscard]] inline detail::YieldAwaiter yield() noexcept { return {}; }

namespace detail {
struct ScheduleAwaiter : YieldAwaiter {
  const PoolCore* pool;
  template <CrewPromise P>
  bool await_suspend(std::coroutine_handle<P> h) {
    if (&waiting_task(h, "crew::schedule")->core() != pool) {
      throw Error(Errc::invalid_options,
                  "crew::schedule: a coroutine task runs on the pool it was spawned onto");
    }
    return YieldAwaiter::await_suspend(h);
  }
};
}  // namespace detail

// co_await schedule(pool): as yield(), on `pool`, which must be the task's
// own pool (a coroutine task stays on the pool it was spawned onto: its
// stop, deadline, counts and shutdown are that pool's); another pool
// throws Error(Errc::invalid_options) at the co_await, not suspended. To
// run work on another pool, co_await a task spawned or submitted there.
[[nodiscard]] inline detail::ScheduleAwaiter schedule(const Pool& pool) noexcept {
  return detail::ScheduleAwaiter{{}, &detail::PoolAccess::core(pool)};
}

// co_await spawn_when_room(pool, co, opts): spawn() for a coroutine task,
// which suspends where spawn() would block its thread: while `pool` (this
// task's own or another) blocks on a full queue (Overflow::block), the
// calling coroutine sleeps and tries again (20 us, doubling to 1 ms), its
// worker free for other tasks meanwhile, and then returns the new task's
// handle. Otherwise as spawn(): a pool that refuses or runs the start on
// the caller does so at once, and a closed one refuses. The new task is
// admitted (its queue wait, its overload ticket) when the wait begins; its
// queue_timeout bounds the wait (then it ends unrun, cancelled /
// Errc::expired). A stop of the calling task ends the wait: the co_await
// throws its stop error, and the new task, refused (rejected,
// Admission::full) unless room came just then, is stopped with its parent
// either way. Room is not reserved: a thread that blocks on the same queue
// may take it first. Only from a coroutine task's coroutine. With g++ 12,
// initialize a handle with it (Task<int> t = co_await spawn_when_room(...))
// or name the Co first; assigning its result to an existing handle, or
// using it inside a larger expression, frees the Co twice
// (docs/coroutines.md, "Traps").
template <class R>
Co<Task<R>> spawn_when_room(Pool& pool, Co<R> co, TaskOptions opts = {}) {
  detail::CoroState<R>* s = detail::make_coro_state(detail::PoolAccess::core(pool), std::move(co),
                                                    std::move(opts), false);
  Task<R> handle(s);  // the creator's reference
  auto wait = std::chrono::microseconds(20);
  // Admission::full with the handle not ready: no room yet, nothing decided.
  while (s->launch(/*may_block=*/true, /*wait_for_room=*/true) == Admission::full &&
         !handle.ready()) {
    try {
      co_await sleep_for(wait);
    } catch (...) {
      (void)s->launch(/*may_block=*/false);  // queued if there is room now, else refused
      throw;
    }
    wait = std::min(wait * 2, std::chrono::microseconds(1000));
  }
  co_return handle;
}

// co_await wait_all(group): suspends until every task submitted to `group`
// so far has ended (Group::stats().pending is 0; it looks every 50 us,
// doubling to 1 ms), then rethrows the group's first exception
// (Group::rethrow_if_failed). A stop of the awaiting task cancels the group
// and throws at once (its tasks may still be ending: ~Group waits for
// them). Unlike Group::wait() it does not wait for a written-off callable
// to return.
inline Co<void> wait_all(Group& group) {
  std::chrono::microseconds pause{50};
  while (group.stats().pending != 0) {
    try {
      co_await sleep_for(pause);
    } catch (...) {
      group.cancel();
      throw;
    }
    pause = std::min(pause * 2, std::chrono::microseconds{1000});
  }
  group.rethrow_if_failed();
}

// co_await when_all(tasks): waits for every task (handles of any pools) and
// returns their values in the vector's order (nothing for Task<void>). The
// first exception met in that order cancels the tasks that have not ended,
// and is rethrown once the others have ended too; if the awaiting task is
// stopped meanwhile, it cancels them and throws at once. `tasks` must
// outlive the co_await; its handles are used up (get()).
template <class T>
Co<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> when_all(
    std::vector<Task<T>>& tasks) {
  std::exception_ptr first;
  [[maybe_unused]] std::conditional_t<std::is_void_v<T>, int, std::vector<T>> out{};
  if constexpr (!std::is_void_v<T>) out.reserve(tasks.size());
  for (Task<T>& t : tasks) {
    try {
      if constexpr (std::is_void_v<T>) {
        co_await t;
      } else {
        out.push_back(co_await t);
      }
    } catch (...) {
      if (!first) {
        first = std::current_exception();
        for (Task<T>& other : tasks) (void)other.cancel();
      }
    }
  }
  if (first) std::rethrow_exception(first);
  if constexpr (!std::is_void_v<T>) co_return out;
}

// co_await when_any(tasks): suspends until one of the tasks has ended and
// returns its index (the first ended one in the vector's order). It takes no
// value out of the handles and cancels nothing. It looks every 50 us, doubling
// to 1 ms while none has ended (sleep_for: a stop of the awaiting task throws
// as for a sleep). An empty vector throws Error(invalid_options).
template <class T>
Co<std::size_t> when_any(std::vector<Task<T>>& tasks) {
  if (tasks.empty()) throw Error(Errc::invalid_options, "crew::when_any: no task");
  std::chrono::microseconds pause{50};
  for (;;) {
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      if (!tasks[i].valid() || tasks[i].ready()) co_return i;
    }
    co_await sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds{1000});
  }
}

// A coroutine task suspended now: what it waits for ("sleep", "task",
// "yield", "callback") and for how long (never less than it was; up to one
// kernel clock tick, 1-10 ms, more: the stamp is the coarse clock's).
struct SuspendedCoroutine {
  TaskRef task;
  std::string_view waits_on;
  std::chrono::nanoseconds suspended_for{0};
};
struct CoroutineTasks {
  std::size_t live = 0;  // spawned and not ended (queued, running or suspended)
  std::vector<SuspendedCoroutine> suspended;
};
// A snapshot of the pool's coroutine tasks. Thread-safe; blocks on the
// pool's coroutine registry (a short lock), never on a task.
[[nodiscard]] CoroutineTasks coroutine_tasks(const Pool& pool);

// The stop token of the coroutine task running on this thread (a stop
// token that is never stopped outside one). Inside a coroutine it reads the
// task of the current step: call it again after each co_await rather than
// keeping a reference to thread-local state.
[[nodiscard]] std::stop_token current_stop_token() noexcept;

}  // namespace crew
