// Batch outcomes and deadlines (the rest of crew/batch.hpp is templates).
#include "crew/batch.hpp"

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "crew/log.hpp"
#include "crew/pool.hpp"

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

void await_returned(const Pool& pool, const TaskStateBase* s) noexcept {
  if (s == nullptr || !s->callable_live()) return;
  const std::shared_ptr<Logger>& logger = pool.options().logger;
  if (logger && LogLevel::warning >= logger->level()) {
    logger->log(LogLevel::warning, {.pool = pool.name(), .task = s->name, .task_id = s->id},
                "run_batch waits for a written-off task whose callable still runs");
  }
  (void)s->wait_returned_until(std::chrono::steady_clock::time_point::max());
}

std::chrono::steady_clock::time_point batch_deadline(std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (timeout.count() <= 0) return Clock::time_point::max();
  return detail::saturating_deadline(Clock::now(), timeout);
}

}  // namespace crew::detail
