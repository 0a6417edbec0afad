// crew/batch.hpp: running a given set of tasks to completion ("batch" or
// "online" mode), and parallel loops.
//
//   run_batch(pool, tasks[, opts])          a range of callables
//   run_batch(pool, inputs, fn[, opts])     fn(input) for each input
//   run_batch(pool_options, ...)            the same on a temporary pool
// submit every task, wait for all of them (with an optional total timeout)
// and return a BatchResult: each task's Outcome in input order.
//
//   parallel_for(pool, first, last, body[, opts])         body(i), i in [first, last)
//   parallel_for_blocks(pool, first, last, body[, opts])  body(begin, end) per block
// split the index range into blocks. The calling thread and a few helper
// tasks on the pool (one per extra thread, not one per block) claim blocks
// one at a time with one atomic increment each, and run the body in a loop
// compiled with it; the call returns when every block is done.
//
// All of these block the calling thread until the work is done, so tasks
// may refer to the caller's objects: ranges are read in place, not copied
// (a range that yields values rather than references has them moved into
// the tasks). Called from a task of the same pool, they never deadlock: the
// caller runs queued tasks or loop blocks itself.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <ranges>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "crew/error.hpp"
#include "crew/group.hpp"
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

// A range element kept for a task: a pointer when the range yields lvalues
// (the range outlives the call), else the value, moved into the task.
template <class Ref>
struct Held {
  std::remove_reference_t<Ref>* p;
  explicit Held(Ref r) noexcept : p(std::addressof(r)) {}
  Ref get() noexcept { return *p; }
};
template <class Ref>
  requires(!std::is_lvalue_reference_v<Ref>)
struct Held<Ref> {
  std::remove_cvref_t<Ref> v;
  explicit Held(Ref&& r) : v(std::forward<Ref>(r)) {}
  std::remove_cvref_t<Ref>&& get() noexcept { return std::move(v); }
};

// What a task receives of an element of type Ref.
template <class Ref>
using held_arg_t = decltype(std::declval<Held<Ref>&>().get());

template <class F>
using decayed_result_t = std::decay_t<task_result_t<F>>;

// A batch task made of a range element that is itself a task.
template <class Ref>
class ElementTask {
  using C = std::remove_cvref_t<held_arg_t<Ref>>;
  using R = decayed_result_t<C>;

 public:
  ElementTask(const Pool* pool, Ref&& r) : pool_(pool), held_(std::forward<Ref>(r)) {}

  R operator()() requires(!is_long_task_v<C>) {
    const RunningOn mark(pool_);
    return static_cast<R>(std::invoke(held_.get()));
  }
  R operator()(const TaskContext& ctx) requires is_long_task_v<C> {
    const RunningOn mark(pool_);
    if constexpr (std::is_invocable_v<held_arg_t<Ref>, const TaskContext&>) {
      return static_cast<R>(std::invoke(held_.get(), ctx));
    } else {
      return static_cast<R>(std::invoke(held_.get(), ctx.stop_token));
    }
  }

 private:
  const Pool* pool_;
  Held<Ref> held_;
};

template <class Fn, class Arg>
inline constexpr bool is_long_fn_v = std::is_invocable_v<Fn&, Arg, const TaskContext&> ||
                                     std::is_invocable_v<Fn&, Arg, std::stop_token>;

template <class Fn, class Arg>
struct FnResult {
  using type = std::invoke_result_t<Fn&, Arg>;
};
template <class Fn, class Arg>
  requires std::is_invocable_v<Fn&, Arg, const TaskContext&>
struct FnResult<Fn, Arg> {
  using type = std::invoke_result_t<Fn&, Arg, const TaskContext&>;
};
template <class Fn, class Arg>
  requires(!std::is_invocable_v<Fn&, Arg, const TaskContext&> &&
           std::is_invocable_v<Fn&, Arg, std::stop_token>)
struct FnResult<Fn, Arg> {
  using type = std::invoke_result_t<Fn&, Arg, std::stop_token>;
};

// A batch task that applies the batch's function to one input.
template <class Fn, class Ref>
class InputTask {
  using Arg = held_arg_t<Ref>;
  using R = std::decay_t<typename FnResult<Fn, Arg>::type>;

 public:
  InputTask(const Pool* pool, Fn* fn, Ref&& r)
      : pool_(pool), fn_(fn), held_(std::forward<Ref>(r)) {}

  R operator()() requires(!is_long_fn_v<Fn, Arg>) {
    const RunningOn mark(pool_);
    return static_cast<R>(std::invoke(*fn_, held_.get()));
  }
  R operator()(const TaskContext& ctx) requires is_long_fn_v<Fn, Arg> {
    const RunningOn mark(pool_);
    if constexpr (std::is_invocable_v<Fn&, Arg, const TaskContext&>) {
      return static_cast<R>(std::invoke(*fn_, held_.get(), ctx));
    } else {
      return static_cast<R>(std::invoke(*fn_, held_.get(), ctx.stop_token));
    }
  }

 private:
  const Pool* pool_;
  Fn* fn_;
  Held<Ref> held_;
};

std::chrono::steady_clock::time_point batch_deadline(std::chrono::nanoseconds timeout);
void count_outcome(OutcomeCounts& counts, TaskStatus status) noexcept;

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
    // Out of memory while submitting: the tasks already submitted refer to
    // the caller's range, so they must end before the exception leaves.
    for (Task<R>& t : tasks) {
      if (t.valid()) (void)t.cancel();
    }
    for (Task<R>& t : tasks) {
      if (t.valid()) (void)await_task(pool, t, Clock::time_point::max(), help);
    }
    throw;
  }
  for (Task<R>& t : tasks) {
    if (!t.valid()) continue;
    if (!expired && !await_task(pool, t, deadline, help)) {
      expired = true;
      for (Task<R>& u : tasks) {
        if (u.valid()) (void)u.cancel();
      }
    }
    if (expired) (void)await_task(pool, t, Clock::time_point::max(), help);
  }
  BatchResult<R> result;
  result.timed_out = expired;
  result.outcomes.reserve(tasks.size());
  for (Task<R>& t : tasks) {
    result.outcomes.push_back(outcome_of(t));
    count_outcome(result.counts, result.outcomes.back().status);
  }
  return result;
}

template <class Range>
using element_result_t =
    decayed_result_t<std::remove_cvref_t<held_arg_t<std::ranges::range_reference_t<Range>>>>;

template <class Range, class Fn>
using input_result_t =
    std::decay_t<typename FnResult<Fn, held_arg_t<std::ranges::range_reference_t<Range>>>::type>;

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
// input order. Blocks until every task has ended. Called from a task of
// `pool`, it runs queued tasks of the pool while it waits.
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
  requires batch_function<Fn, Range>
      BatchResult<detail::input_result_t<Range, std::remove_reference_t<Fn>>> run_batch(
          Pool& pool, Range&& inputs, Fn&& fn, BatchOptions opts = {}) {
    using Ref = std::ranges::range_reference_t<Range>;
    using F = std::remove_reference_t<Fn>;
    const bool help = detail::t_running_pool == &pool;
    F* f = std::addressof(fn);
    return detail::batch_on(
        pool, inputs,
        [&pool, f](Ref r) { return detail::InputTask<F, Ref>(&pool, f, std::forward<Ref>(r)); },
        opts, help);
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
  requires batch_function<Fn, Range>
      BatchResult<detail::input_result_t<Range, std::remove_reference_t<Fn>>> run_batch(
          PoolOptions pool_options, Range&& inputs, Fn&& fn, BatchOptions opts = {}) {
    Pool pool(std::move(pool_options));
    using Ref = std::ranges::range_reference_t<Range>;
    using F = std::remove_reference_t<Fn>;
    F* f = std::addressof(fn);
    return detail::batch_on(
        pool, inputs,
        [&pool, f](Ref r) { return detail::InputTask<F, Ref>(&pool, f, std::forward<Ref>(r)); },
        opts,
        /*help=*/true);
  }

// ---- parallel loops ----

struct ParallelOptions {
  // Threads working on the loop, the caller included: 0 means one per
  // hardware thread. At most the pool's max_workers + 1.
  std::size_t max_threads = 0;
  // Blocks the range is split into; 0 means 16 per thread, but none smaller
  // than `grain` indices. More blocks balance uneven bodies better; each
  // costs one atomic increment.
  std::size_t blocks = 0;
  std::size_t grain = 1;
  // The priority of the helper tasks (see PoolOptions::priority_levels).
  std::uint8_t priority = 0;
};

namespace detail {

// Shared by the caller of a parallel loop and its helper tasks. On the heap
// and reference counted: a helper that starts after the loop has ended (its
// worker was busy) must still be able to read it.
class LoopState {
 public:
  using RunFn = void (*)(LoopState&) noexcept;

  LoopState(std::size_t n, std::size_t block_count, RunFn run, const void* ctx, const Pool* pool,
            std::uint32_t refs) noexcept
      : refs_(refs),
        pending_(static_cast<std::uint32_t>(block_count)),
        blocks_(block_count),
        per_(n / block_count),
        extra_(n % block_count),
        run_(run),
        ctx_(ctx),
        pool_(pool) {}
  LoopState(const LoopState&) = delete;
  LoopState& operator=(const LoopState&) = delete;

  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // A helper task's body.
  void help() noexcept {
    const RunningOn mark(pool_);
    run_(*this);
  }
  // The claim loop (run_loop) calls these.
  std::size_t claim() noexcept { return next_.fetch_add(1, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t blocks() const noexcept { return blocks_; }
  [[nodiscard]] std::size_t begin_of(std::size_t b) const noexcept {
    return b * per_ + std::min(b, extra_);
  }
  [[nodiscard]] const void* context() const noexcept { return ctx_; }
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  void fail(std::exception_ptr e) noexcept {
    bool expected = false;
    if (failed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      error_ = std::move(e);
    }
  }
  // A thread finished `done` blocks (it claims no more).
  void finished(std::size_t done) noexcept {
    const auto d = static_cast<std::uint32_t>(done);
    if (pending_.fetch_sub(d, std::memory_order_acq_rel) == d) pending_.notify_all();
  }
  // For the caller, after its own claim loop: blocks until every block is
  // done, then returns the first exception a body threw. What is left is at
  // most one block per helper, so it polls (yielding the core) for a while
  // before it sleeps: a futex sleep and its wake-up cost more than a short
  // block on a busy machine.
  std::exception_ptr wait_done() noexcept {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point poll_until = Clock::now() + std::chrono::microseconds(500);
    for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
      if (i % 16 == 15 && Clock::now() >= poll_until) break;
      std::this_thread::yield();
    }
    for (std::uint32_t p = pending_.load(std::memory_order_acquire); p != 0;
         p = pending_.load(std::memory_order_acquire)) {
      pending_.wait(p, std::memory_order_acquire);
    }
    return error_;
  }

 private:
  std::atomic<std::uint32_t> refs_;
  alignas(64) std::atomic<std::size_t> next_{0};    // next block to claim
  alignas(64) std::atomic<std::uint32_t> pending_;  // blocks not finished
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // written once, by whoever set failed_
  const std::size_t blocks_, per_, extra_;
  const RunFn run_;
  const void* const ctx_;  // the caller's LoopContext: read only after a claim succeeds
  const Pool* const pool_;
};

template <class I, class Body>
struct LoopContext {
  I first;
  Body* body;
};

template <class I>
I index_at(I first, std::size_t offset) noexcept {
  using U = std::make_unsigned_t<I>;
  return static_cast<I>(static_cast<U>(static_cast<U>(first) + static_cast<U>(offset)));
}

// Claims blocks until none is left and runs the body on each; the body is
// inlined into the per-index loop.
template <class I, class Body, bool kBlocks>
void run_loop(LoopState& s) noexcept {
  std::size_t done = 0;
  for (std::size_t b = s.claim(); b < s.blocks(); b = s.claim()) {
    ++done;
    if (s.failed()) continue;  // the loop is failing: finish the count only
    const auto& ctx = *static_cast<const LoopContext<I, Body>*>(s.context());
    Body& body = *ctx.body;
    const I lo = index_at(ctx.first, s.begin_of(b));
    const I hi = index_at(ctx.first, s.begin_of(b + 1));
    try {
      if constexpr (kBlocks) {
        body(lo, hi);
      } else {
        for (I i = lo; i != hi; ++i) body(i);
      }
    } catch (...) {
      s.fail(std::current_exception());
    }
  }
  if (done != 0) s.finished(done);
}

std::size_t loop_threads(const Pool& pool, const ParallelOptions& o) noexcept;
// Throws Error(invalid_options) for a priority the pool does not have.
void check_priority(const Pool& pool, const ParallelOptions& o);
std::size_t loop_blocks(std::size_t n, std::size_t threads, const ParallelOptions& o) noexcept;

template <bool kBlocks, class I, class Body>
void parallel_loop(Pool& pool, I first, I last, Body& body, const ParallelOptions& o) {
  if (!(first < last)) return;
  check_priority(pool, o);  // before any helper exists: try_post would throw
  using U = std::make_unsigned_t<I>;
  const auto n =
      static_cast<std::size_t>(static_cast<U>(static_cast<U>(last) - static_cast<U>(first)));
  const std::size_t threads = loop_threads(pool, o);
  const std::size_t blocks = loop_blocks(n, threads, o);
  const LoopContext<I, Body> ctx{first, &body};
  const std::size_t helpers = std::min(threads, blocks) - 1;
  if (helpers == 0) {
    LoopState local(n, blocks, &run_loop<I, Body, kBlocks>, &ctx, &pool, 1);
    run_loop<I, Body, kBlocks>(local);
    if (const std::exception_ptr error = local.wait_done()) std::rethrow_exception(error);
    return;
  }
  auto* s = new LoopState(n, blocks, &run_loop<I, Body, kBlocks>, &ctx, &pool,
                          static_cast<std::uint32_t>(helpers + 1));
  // Helpers first, so that they start while the caller works; each holds a
  // reference. A refused helper (full queue, closed pool) only means one
  // thread less.
  TaskOptions helper_options;
  helper_options.priority = o.priority;
  for (std::size_t k = 0; k < helpers; ++k) {
    if (pool.try_post(
            [s]() noexcept {
              s->help();
              s->release();
            },
            helper_options) != Admission::accepted) {
      s->release();
    }
  }
  run_loop<I, Body, kBlocks>(*s);
  const std::exception_ptr error = s->wait_done();
  s->release();
  if (error) std::rethrow_exception(error);
}

template <class I1, class I2>
using loop_index_t = std::common_type_t<I1, I2>;

}  // namespace detail

template <class I>
concept loop_index = std::integral<I> && !std::same_as<std::remove_cv_t<I>, bool>;

// Calls body(i) for every i in [first, last), on the calling thread and on
// up to max_threads - 1 helper tasks of `pool`. Returns when all calls are
// done; if a body throws, blocks not started yet are skipped and the first
// exception is rethrown here. Blocks the calling thread (which works on the
// loop meanwhile), so `body` may refer to the caller's objects; it is called
// concurrently from several threads.
template <loop_index I1, loop_index I2, class Body>
  requires std::invocable<Body&, detail::loop_index_t<I1, I2>>
void parallel_for(Pool& pool, I1 first, I2 last, Body&& body, ParallelOptions opts = {}) {
  using I = detail::loop_index_t<I1, I2>;
  detail::parallel_loop<false>(pool, static_cast<I>(first), static_cast<I>(last), body, opts);
}

// As parallel_for, calling body(begin, end) once per block (BS::thread_pool's
// submit_blocks): for bodies that keep per-block state.
template <loop_index I1, loop_index I2, class Body>
  requires std::invocable<Body&, detail::loop_index_t<I1, I2>, detail::loop_index_t<I1, I2>>
void parallel_for_blocks(Pool& pool, I1 first, I2 last, Body&& body, ParallelOptions opts = {}) {
  using I = detail::loop_index_t<I1, I2>;
  detail::parallel_loop<true>(pool, static_cast<I>(first), static_cast<I>(last), body, opts);
}

}  // namespace crew
