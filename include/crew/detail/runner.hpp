// crew/detail/runner.hpp: what a queue cell runs through. A cell holds a
// callable and calls it directly when it can; the contents below are the
// callables that cannot run by themselves (a long task posted without a
// task state, a plain task in a pool with task observers, a task that
// decides its own outcome, a plain task admitted by the overload
// controller), and Runner is the interface through which the thread that
// popped such a cell runs it: a worker at its top level (src/engine), or
// PoolCore's InlineRunner on any other thread (pool_core.hpp).
//
// Threads: a cell's content is made by its submitter and run, or dropped,
// by the one thread that popped it; nothing here is shared.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "crew/detail/overload_control.hpp"  // an admitted task's ticket, returned inline
#include "crew/task.hpp"                     // TaskContext
#include "crew/task_status.hpp"

namespace crew::detail {

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
  // A plain task admitted by the overload controller: it may be shed
  // (counted as such) instead of run.
  virtual void run_admitted(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept = 0;

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

// The cell content of a plain task admitted by the overload controller
// (submitted from outside the pool while it is on): its enqueue time (0:
// its wait is not timed), and
// the admission ticket, returned when the cell is destroyed (run, shed or
// dropped by a shutdown).
template <class D>
struct AdmittedFn {
  OverloadControl* ticket;
  std::int64_t enqueued_ns;
  D fn;
  template <class G>
  AdmittedFn(OverloadControl* t, std::int64_t enqueued, G&& f)
      : ticket(t), enqueued_ns(enqueued), fn(std::forward<G>(f)) {}
  AdmittedFn(AdmittedFn&& o) noexcept(std::is_nothrow_move_constructible_v<D>)
      : ticket(std::exchange(o.ticket, nullptr)), enqueued_ns(o.enqueued_ns), fn(std::move(o.fn)) {}
  AdmittedFn(const AdmittedFn&) = delete;
  AdmittedFn& operator=(const AdmittedFn&) = delete;
  AdmittedFn& operator=(AdmittedFn&&) = delete;
  ~AdmittedFn() {
    if (ticket != nullptr) ticket->release();
  }
  // An untimed one is neither shed nor timed: it runs as a plain task
  // does (its caller counts it, false), without the runner's call.
  bool run_with(void* runner) {
    if (enqueued_ns == 0) [[likely]] {
      fn();
      return false;
    }
    static_cast<Runner*>(runner)->run_admitted(enqueued_ns, &call_plain<D>, &fn);
    return true;
  }
};

// Returns an admission ticket when it leaves scope (none for null): for the
// thread that popped an admitted task state and is done with it.
class TicketReturn {
 public:
  explicit TicketReturn(OverloadControl* ctl) noexcept : ctl_(ctl) {}
  ~TicketReturn() {
    if (ctl_ != nullptr) ctl_->release();
  }
  TicketReturn(const TicketReturn&) = delete;
  TicketReturn& operator=(const TicketReturn&) = delete;
  [[nodiscard]] bool held() const noexcept { return ctl_ != nullptr; }
  // Someone else returned it (a write-off of the run).
  void disarm() noexcept { ctl_ = nullptr; }

 private:
  OverloadControl* ctl_;
};

}  // namespace crew::detail
