// crew/batch.hpp: running a given set of tasks to completion ("batch" or
// "online" mode).
//
//   run_batch(pool, tasks[, opts])          a range of callables
//   run_batch(pool, inputs, fn[, opts])     fn(input) for each input
//   run_batch(pool_options, ...)            the same on a temporary pool
// submit every task, wait for all of them (with an optional total timeout)
// and return a BatchResult: each task's Outcome in input order.
//
// run_batch blocks the calling thread until every task has ended, so tasks
// may refer to the caller's objects: ranges are read in place, not copied
// (a range that yields values rather than references has them moved into
// the tasks). Called from a task of the same pool, it never deadlocks: the
// caller runs queued tasks itself.
//
// parallel_for and parallel_for_blocks live in crew/parallel_for.hpp, which
// this header includes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "crew/detail/batch_tasks.hpp"
#include "crew/error.hpp"
#include "crew/group.hpp"
#include "crew/parallel_for.hpp"
#include "crew/pool.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"
#include "crew/task_status.hpp"

namespace crew {

namespace detail {

struct OutcomeBase {
  std::uint64_t id = 0;  // the pool's task id; 0 if it was never submitted
  TaskStatus status = TaskStatus::rejected;
  // Why a task without a value of its own ended: rejected (see the pool's
  // admission), shutdown_dropped, expired, cancelled, timed_out, abandoned.
  Errc reason{};
  std::exception_ptr error{};  // the exception of a failed task
  // As Task::queue_wait() and Task::run_time() (PoolOptions::time_tasks):
  // 0 for a task never submitted.
  std::chrono::nanoseconds queue_wait{0};
  std::chrono::nanoseconds run_time{0};

  [[nodiscard]] bool ok() const noexcept { return status == TaskStatus::succeeded; }
  // Rethrows the task's exception, or throws crew::Error for a task that
  // produced no value; returns for a task that succeeded.
  void check() const;
};

}  // namespace detail

// How one task of a batch ended, and its value if it succeeded.
template <class R>
struct Outcome : detail::OutcomeBase {
  std::optional<R> value{};

  // The value, or what check() throws.
  R& get() & {
    check();
    return *value;
  }
  const R& get() const& {
    check();
    return *value;
  }
  R&& get() && {
    check();
    return std::move(*value);
  }
};

template <>
struct Outcome<void> : detail::OutcomeBase {
  void get() const { check(); }
};

template <class R>
struct BatchResult {
  std::vector<Outcome<R>> outcomes;  // in input order
  OutcomeCounts counts;
  // The total timeout expired: tasks that had not ended were cancelled then
  // (queued ones never ran; running long ones had their token stopped), and
  // tasks not yet submitted were never submitted (cancelled, id 0).
  bool timed_out = false;

  [[nodiscard]] bool all_succeeded() const noexcept { return counts.succeeded == outcomes.size(); }
  // Throws what the first task (in input order) that did not succeed would
  // throw from get(); returns if all succeeded.
  void check() const {
    for (const Outcome<R>& o : outcomes) o.check();
  }
};

struct BatchOptions {
  // For the whole batch, from the call; 0 means none. When it expires the
  // tasks that have not ended are cancelled (see BatchResult::timed_out);
  // running short tasks cannot be interrupted, and the call returns once
  // they finish.
  std::chrono::nanoseconds timeout{0};
  // The name of every task (reports, logs, metrics).
  std::string name{};
  // The priority of every task (see PoolOptions::priority_levels).
  std::uint8_t priority = 0;
};

namespace detail {

std::chrono::steady_clock::time_point batch_deadline(std::chrono::nanoseconds timeout);

// The outcome of a task that has ended (or an empty handle: never submitted).
template <class R>
Outcome<R> outcome_of(Task<R>& task) {
  Outcome<R> o;
  if (!task.valid()) {
    o.status = TaskStatus::cancelled;
    o.reason = Errc::cancelled;
    return o;
  }
  o.id = task.id();
  o.status = task.status();
  o.queue_wait = task.queue_wait();
  o.run_time = task.run_time();
  switch (o.status) {
    case TaskStatus::succeeded:
      if constexpr (std::is_void_v<R>) {
        task.get();
      } else {
        o.value.emplace(task.get());
      }
      break;
    case TaskStatus::failed:
      try {
        task.get();
      } catch (...) {
        o.error = std::current_exception();
      }
      break;
    default:
      o.reason = task.reason();
      break;
  }
  return o;
}

// Cancels every task of a batch: the queued ones first, then the running
// ones. In the other order a running task that returns at its stop request
// frees its worker, which may start a queued task of the batch before that
// task's cancel() comes.
template <class R>
void cancel_all(std::vector<Task<R>>& tasks) {
  for (Task<R>& t : tasks) {
    if (t.valid() && t.status() == TaskStatus::queued) (void)t.cancel();
  }
  for (Task<R>& t : tasks) {
    if (t.valid()) (void)t.cancel();
  }
}

// Submits one task per element (make(element) builds it), waits for all,
// and collects the outcomes.
template <class R, class Range, class Make>
BatchResult<R> run_tasks(Pool& pool, Range& range, Make make, const BatchOptions& opts, bool help) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = batch_deadline(opts.timeout);
  const bool timed = deadline != Clock::time_point::max();
  std::vector<Task<R>> tasks;
  if constexpr (std::ranges::sized_range<Range>) {
    tasks.reserve(static_cast<std::size_t>(std::ranges::size(range)));
  }
  bool expired = false;
  // On an exception the tasks already submitted refer to the caller's
  // range: they are cancelled and must end before it leaves. These waits
  // nest rather than throw again (a catch handler has no exception in
  // flight for the waits to see).
  const auto settle_all = [&] {
    cancel_all(tasks);
    const NoStackThrowScope no_throw;
    for (Task<R>& t : tasks) {
      if (t.valid()) (void)await_task(pool, t, Clock::time_point::max(), help);
      (void)await_returned(pool, t.state(), "run_batch", opts.name, Clock::time_point::max());
    }
  };
  try {
    for (auto&& element : range) {
      if (timed && !expired && Clock::now() >= deadline) expired = true;
      tasks.emplace_back();   // first: a handle is never dropped by a throwing push
      if (expired) continue;  // never submitted
      TaskOptions o;
      o.name = opts.name;
      o.priority = opts.priority;
      tasks.back() = pool.submit(make(std::forward<decltype(element)>(element)), std::move(o));
    }
  } catch (...) {
    settle_all();  // out of memory while submitting
    throw;
  }
  try {
    for (Task<R>& t : tasks) {
      if (!t.valid()) continue;
      if (!expired && !await_task(pool, t, deadline, help)) {
        expired = true;
        cancel_all(tasks);
      }
      if (expired) (void)await_task(pool, t, Clock::time_point::max(), help);
      (void)await_returned(pool, t.state(), "run_batch", opts.name, Clock::time_point::max());
    }
  } catch (...) {
    settle_all();  // Error(stack_exhausted): too little stack left to run a task here
    throw;
  }
  BatchResult<R> result;
  result.timed_out = expired;
  result.outcomes.reserve(tasks.size());
  for (Task<R>& t : tasks) {
    result.outcomes.push_back(outcome_of(t));
    result.counts.add(result.outcomes.back().status);
  }
  return result;
}

template <class Range, class Make>
auto batch_on(Pool& pool, Range& range, Make make, const BatchOptions& opts, bool help) {
  using Ref = std::ranges::range_reference_t<Range>;
  using R = task_result_t<decltype(make(std::declval<Ref>()))>;
  return run_tasks<R>(pool, range, std::move(make), opts, help);
}

}  // namespace detail

// A range whose elements are tasks (short or long callables, see task.hpp).
template <class Range>
concept task_range = std::ranges::input_range<Range> &&
    is_task_v<std::remove_cvref_t<detail::held_arg_t<std::ranges::range_reference_t<Range>>>>;

// A function a batch can apply to each element of Range: fn(input), or a
// long task's fn(input, const TaskContext&) or fn(input, std::stop_token).
template <class Fn, class Range>
concept batch_function = std::ranges::input_range<Range> &&
    (std::is_invocable_v<Fn&, detail::held_arg_t<std::ranges::range_reference_t<Range>>> ||
     detail::is_long_fn_v<Fn, detail::held_arg_t<std::ranges::range_reference_t<Range>>>);

// Runs every callable of `tasks` on `pool` and returns their outcomes in
// input order. Blocks until every task has ended (a task written off by the
// pool also until its callable has returned). Called from a task of
// `pool`, it runs queued tasks of the pool while it waits; on a worker with
// less than its stack's reserve left (Task::wait) it cancels the batch,
// waits until every task has ended, and throws Error(Errc::stack_exhausted).
template <task_range Range>
BatchResult<detail::element_result_t<Range>> run_batch(Pool& pool, Range&& tasks,
                                                       BatchOptions opts = {}) {
  using Ref = std::ranges::range_reference_t<Range>;
  const bool help = detail::t_running_pool == &pool;
  return detail::batch_on(
      pool, tasks, [&pool](Ref r) { return detail::ElementTask<Ref>(&pool, std::forward<Ref>(r)); },
      opts, help);
}

// Runs fn(input) for every element of `inputs` on `pool`. fn is called
// concurrently from several threads.
template <std::ranges::input_range Range, class Fn>
  requires(batch_function<Fn, Range>)
BatchResult<detail::input_result_t<Range, std::remove_reference_t<Fn>>> run_batch(
    Pool& pool, Range&& inputs, Fn&& fn, BatchOptions opts = {}) {
  using Ref = std::ranges::range_reference_t<Range>;
  using F = std::remove_reference_t<Fn>;
  const bool help = detail::t_running_pool == &pool;
  F* f = std::addressof(fn);
  return detail::batch_on(
      pool, inputs,
      [&pool, f](Ref r) { return detail::InputTask<F, Ref>(&pool, f, std::forward<Ref>(r)); }, opts,
      help);
}

// The same on a temporary pool built from `pool_options`; the calling
// thread runs tasks too. The pool is shut down (drained) before returning.
template <task_range Range>
BatchResult<detail::element_result_t<Range>> run_batch(PoolOptions pool_options, Range&& tasks,
                                                       BatchOptions opts = {}) {
  Pool pool(std::move(pool_options));
  using Ref = std::ranges::range_reference_t<Range>;
  return detail::batch_on(
      pool, tasks, [&pool](Ref r) { return detail::ElementTask<Ref>(&pool, std::forward<Ref>(r)); },
      opts, /*help=*/true);
}

template <std::ranges::input_range Range, class Fn>
  requires(batch_function<Fn, Range>)
BatchResult<detail::input_result_t<Range, std::remove_reference_t<Fn>>> run_batch(
    PoolOptions pool_options, Range&& inputs, Fn&& fn, BatchOptions opts = {}) {
  Pool pool(std::move(pool_options));
  using Ref = std::ranges::range_reference_t<Range>;
  using F = std::remove_reference_t<Fn>;
  F* f = std::addressof(fn);
  return detail::batch_on(
      pool, inputs,
      [&pool, f](Ref r) { return detail::InputTask<F, Ref>(&pool, f, std::forward<Ref>(r)); }, opts,
      /*help=*/true);
}

}  // namespace crew
