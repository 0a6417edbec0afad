// Batch outcomes and deadlines (the rest of crew/batch.hpp is templates).
#include "crew/batch.hpp"

#include <chrono>
#include <exception>
#include <string>

namespace crew::detail {

void OutcomeBase::check() const {
  switch (status) {
    case TaskStatus::succeeded:
      return;
    case TaskStatus::failed:
      if (error) std::rethrow_exception(error);
      break;
    default:
      break;
  }
  const std::string who =
      id == 0 ? "batch task (never submitted)" : "batch task #" + std::to_string(id);
  throw Error(reason, who + ": " + std::string(to_string(reason)));
}

std::chrono::steady_clock::time_point batch_deadline(std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (timeout.count() <= 0) return Clock::time_point::max();
  return detail::saturating_deadline(Clock::now(), timeout);
}

}  // namespace crew::detail
