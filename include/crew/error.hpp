// crew/error.hpp: the closed set of errors crew reports.
//
// Failures a caller must handle on submission (pool closed, queue full) are
// returned as an `Admission` value, never thrown. `crew::Error` is thrown only
// by `Task<T>::get()` for a task that produced no value of its own (it was
// rejected, cancelled or timed out), by constructors given invalid options,
// by a blocking call made from a task it would wait for (would_deadlock), and
// by a wait on a worker whose stack has no room left to run the task it waits
// for (stack_exhausted).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace crew {

// The answer to a submission.
enum class Admission : std::uint8_t {
  accepted,          // queued, or run on the caller (overflow::caller_runs)
  closed,            // the pool is stopping or stopped
  full,              // the queue is full and the policy (or try_*) refused to wait
  too_many_blocked,  // max_blocked_submitters callers already wait for room
  overloaded,        // refused by the overload controller (PoolOptions::overload); a
                     // task handle's Error::overload_reason() says why
};

// Why the overload controller (crew/overload.hpp) refused or shed a task.
enum class OverloadReason : std::uint8_t {
  none,
  limit,     // refused at admission: the adaptive limit of admitted work was reached
  codel,     // shed at dequeue: it waited over twice the target while the pool was overloaded
  priority,  // shed to make room for a higher priority
  deadline,  // refused at admission: its queue timeout could not be met at the current rate
  rate,      // refused at admission by the start-rate limiter's backlog
};

// Every error crew raises.
enum class Errc : std::uint8_t {
  invalid_options,   // an Options field is out of range (the message names it)
  rejected,          // refused at submission (see Error::admission())
  shutdown_dropped,  // accepted, then dropped from the queue by a shutdown
  expired,           // still queued when its queue-wait deadline passed
  cancelled,         // cancelled through its handle or group
  timed_out,         // ran past its execution deadline
  abandoned,         // still running past deadline plus grace; its worker was written off
  empty_handle,      // get()/wait() on a default-constructed Task
  // A call that waits for a pool's tasks (Pool::wait_idle, Pool::shutdown)
  // made from one of those tasks: it would wait for itself; or made in a
  // child of fork() on a pool created before the fork, whose workers are
  // not there. Thrown at once.
  would_deadlock,
  // A wait on a worker (Task::wait/get, Group::wait) would have run a queued
  // task nested on a stack with less than its reserve left (a sixteenth of
  // the stack, at least 32 KiB and at most a quarter): the task was cancelled
  // instead, and the wait throws. A chain of nested waits that deep needs a
  // larger PoolOptions::stack_size, or a loop.
  stack_exhausted,
  // Accepted, then shed without running by the overload controller
  // (Error::overload_reason() says why: codel or priority).
  overloaded,
  // A co_await that would suspend a coroutine task (a sleep, a task handle
  // not ended yet, yield, on_callback, ...) made in a forked child
  // (crew::fork), which runs inside its task without being able to suspend
  // it. Thrown at the co_await.
  wait_in_fork,
};

[[nodiscard]] std::string_view to_string(Admission a) noexcept;
[[nodiscard]] std::string_view to_string(Errc e) noexcept;
[[nodiscard]] std::string_view to_string(OverloadReason r) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& what, Admission admission = Admission::accepted,
        OverloadReason overload = OverloadReason::none)
      : std::runtime_error(what), code_(code), admission_(admission), overload_(overload) {}

  [[nodiscard]] Errc code() const noexcept { return code_; }
  // For Errc::rejected: why the pool refused the task.
  [[nodiscard]] Admission admission() const noexcept { return admission_; }
  // For Admission::overloaded and Errc::overloaded: what the controller saw.
  [[nodiscard]] OverloadReason overload_reason() const noexcept { return overload_; }

 private:
  Errc code_;
  Admission admission_;
  OverloadReason overload_;
};

}  // namespace crew
