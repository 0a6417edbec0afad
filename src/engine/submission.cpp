// Submission's out-of-line parts (crew/detail/submission.hpp): the errors
// of a bad submission, and the slow path of a full queue.
#include "crew/detail/submission.hpp"

#include <chrono>
#include <string>

#include "pool_runtime.hpp"

namespace crew::detail {

void Submission::throw_bad_priority(unsigned priority) const {
  throw Error(Errc::invalid_options, "crew::TaskOptions.priority: " + std::to_string(priority) +
                                         " is above pool '" + c_.opts_.name + "''s highest level " +
                                         std::to_string(c_.queue_.levels() - 1));
}

void Submission::throw_negative_timeout(const TaskOptions& o) {
  const bool execution = o.timeout.count() < 0;
  throw Error(Errc::invalid_options,
              std::string("crew::TaskOptions.") + (execution ? "timeout" : "queue_timeout") + ": " +
                  std::to_string((execution ? o.timeout : o.queue_timeout).count()) +
                  " ns is negative");
}

void Submission::throw_long_correlation_id(const TaskOptions& o) {
  throw Error(Errc::invalid_options,
              "crew::TaskOptions.correlation_id: " + std::to_string(o.correlation_id.size()) +
                  " bytes, at most " + std::to_string(kMaxCorrelationId));
}

Submission::Route Submission::route_full(FillRef fill, std::size_t level, bool may_block,
                                         Admission& why,
                                         std::chrono::steady_clock::time_point give_up) {
  // A worker of this pool never waits for room in its own queue: that is
  // the nested-submit deadlock. It runs the task itself instead.
  if (t_current.core == &c_ || c_.opts_.overflow == Overflow::caller_runs) {
    c_.ran_inline_.fetch_add(1, std::memory_order_relaxed);
    return Route::run_here;
  }
  if (!may_block || c_.opts_.overflow == Overflow::reject) return refuse(Admission::full, why);
  BlockedSubmitters& blocked = c_.rt_->blocked;
  if (!blocked.enter(c_.opts_.max_blocked_submitters)) {
    return refuse(Admission::too_many_blocked, why);
  }
  // Wait for the level to drain to its low-water mark rather than for
  // the first free slot, then push (blocked_submitters.hpp says why); a
  // task with a queue deadline waits no longer than that.
  const bool timed = give_up != TaskStateBase::kNoDeadline;
  Route r = Route::refused;
  for (;;) {
    if (c_.life_.closed()) {
      refuse(Admission::closed, why);
      break;
    }
    if (c_.queue_.try_push(fill, level)) {
      r = Route::queued;
      break;
    }
    if (timed && std::chrono::steady_clock::now() >= give_up) {
      // Settled on this thread (the caller finds the deadline passed and
      // ends it expired), as a task run here is.
      c_.ran_inline_.fetch_add(1, std::memory_order_relaxed);
      r = Route::run_here;
      break;
    }
    blocked.wait(
        [&] {
          return c_.queue_.level_size(level) > blocked.low_water() &&
                 !c_.life_.closed(std::memory_order_seq_cst);
        },
        give_up);
  }
  blocked.leave();
  if (r == Route::queued) c_.after_push();
  return r;
}

}  // namespace crew::detail
