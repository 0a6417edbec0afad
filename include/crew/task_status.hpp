// crew/task_status.hpp: the states a task goes through.
//
//   queued -> running -> succeeded | failed | cancelled | timed_out
//   queued -> cancelled | rejected | shed
//
// A task that is refused at submission is `rejected` from the start.
#pragma once

#include <cstdint>
#include <string_view>

namespace crew {

enum class TaskStatus : std::uint8_t {
  queued,
  running,
  succeeded,  // returned normally (before its deadline, without a stop request)
  failed,     // threw; the exception is kept in the handle
  cancelled,  // cancelled while queued, or a long task stopped through cancel()
              // or a hard shutdown
  timed_out,  // a long task that returned after its execution deadline
  rejected,   // refused at submission, expired in the queue, or dropped by a shutdown
  shed,       // accepted, then dropped unrun by the overload controller (crew/overload.hpp)
};

[[nodiscard]] constexpr bool is_final(TaskStatus s) noexcept {
  return s != TaskStatus::queued && s != TaskStatus::running;
}

// queued -> running -> one outcome; queued -> cancelled or rejected.
[[nodiscard]] constexpr bool is_legal_transition(TaskStatus from, TaskStatus to) noexcept {
  switch (from) {
    case TaskStatus::queued:
      return to == TaskStatus::running || to == TaskStatus::cancelled ||
             to == TaskStatus::rejected || to == TaskStatus::shed;
    case TaskStatus::running:
      return to == TaskStatus::succeeded || to == TaskStatus::failed ||
             to == TaskStatus::cancelled || to == TaskStatus::timed_out;
    default:
      return false;  // outcomes are final
  }
}

[[nodiscard]] std::string_view to_string(TaskStatus s) noexcept;

}  // namespace crew
