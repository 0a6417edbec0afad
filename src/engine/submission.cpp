// Submission's out-of-line parts (crew/detail/submission.hpp): a push the
// home shard's ring could not take (the level's other shards and spill
// queues are the engine's), the overload controller's admission, a task
// state's admission, the observer notes, the errors of a bad submission,
// and the slow path of a full queue.
#include "crew/detail/submission.hpp"

#include <chrono>
#include <string>

#include "crew/detail/overload_control.hpp"
#include "crew/detail/queues.hpp"
#include "crew/detail/task_events.hpp"
#include "crew/observer.hpp"
#include "pool_runtime.hpp"

namespace crew::detail {

void Submission::throw_bad_priority(unsigned priority) const {
  throw Error(Errc::invalid_options, "crew::TaskOptions.priority: " + std::to_string(priority) +
                                         " is above pool '" + c_.opts_.name + "''s highest level " +
                                         std::to_string(c_.queue_->levels() - 1));
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

bool Submission::try_queue_shared(FillRef fill, std::size_t level) noexcept {
  if (!c_.queue_->try_push(fill, level)) return false;
  c_.after_push();
  return true;
}

Submission::Route Submission::route_admitted(FillRef fill, std::size_t level, bool may_block,
                                             Admission& why,
                                             std::chrono::steady_clock::time_point give_up) {
  if (c_.overload_->standing() && !c_.life_.closed()) [[unlikely]] {
    if (c_.queue_->try_push_newest(fill, level)) {
      c_.after_push();
      return Route::queued;
    }
  }
  return route(fill, level, may_block, why, give_up);
}

bool Submission::displace_or_refuse(OverloadReason r, std::size_t level,
                                    std::int64_t queue_timeout_ns,
                                    OverloadReason* reason) noexcept {
  OverloadControl& ctl = *c_.overload_;
  while (r == OverloadReason::limit && level > 0) {
    const Shedding::Displaced d = c_.runtime().shedding.displace_below(level);
    if (d == Shedding::Displaced::shed) {
      ctl.admit_displacing();
      return true;
    }
    if (d != Shedding::Displaced::freed) {
      ctl.note_refused_early();
      break;
    }
    // A task decided meanwhile gave its place back: ask again. Each turn
    // takes one cell out of the queue, so the turns end.
    r = ctl.admit(queue_timeout_ns, /*may_displace=*/true);
    if (r == OverloadReason::none) return true;
  }
  if (reason != nullptr) *reason = r;
  return false;
}

void Submission::note_plain_submission(Route r, Admission why, bool is_long) noexcept {
  if (r == Route::queued) {
    if (c_.observes(Observer::task_enqueued)) task_events::enqueued(c_, nullptr, is_long);
  } else if (r == Route::refused && c_.observes(Observer::task_rejected)) {
    task_events::refused(c_, nullptr, is_long, why);
  }
}

// Hands `s` to the queue; the creator keeps its own reference.
Admission Submission::admit_state(TaskStateBase* s, bool may_block) {
  const bool ticket = c_.admits_here();
  // The enqueue time: for task observers and a handle that shows its
  // queue wait and run time (time_tasks), or for the overload controller
  // alone (when it times this task's wait; the handle shows nothing).
  const bool shown = c_.timed_ || (c_.time_handles_ && !s->detached);
  if (shown || (ticket && c_.overload_->time_this())) [[unlikely]]
    s->clock.set_enqueued(now_ns(), shown);
  // The cell's reference. A queue deadline is armed first: arming may
  // throw (out of memory), and then the caller's reference alone frees
  // the state; once armed, the state is shared with the supervisor,
  // which leaves the deadline to this thread until the submission is
  // counted (begin_admission).
  const bool deadline = s->has_queue_deadline();
  if (deadline) {
    s->begin_admission();
    c_.arm_queue_deadline(s);
    s->add_ref();
  } else {
    s->add_ref_unshared();  // `s` is not shared yet
  }
  // Whether this submission took a ticket: not when it found the pool
  // closed, though a restart may open it before route() looks again, and
  // queue the task then (a cell marked as holding a ticket it never took
  // gave one back that was not taken when it left the queue).
  bool took_ticket = false;
  auto fill = [s, &took_ticket](Cell& c) noexcept {
    s->set_overload_ticket(took_ticket);  // published with the cell
    c.emplace_state(s);
  };
  Admission why = Admission::accepted;
  Route routed;
  if (ticket && !c_.life_.closed()) [[unlikely]] {
    OverloadReason r = OverloadReason::none;
    if (!admit_or_displace(s->level(), s->queue_timeout_left_ns(), &r)) {
      s->set_overload_reason(r);
      routed = refuse(Admission::overloaded, why);
    } else {
      took_ticket = true;
      routed = route_admitted(fill_ref(fill), s->level(), may_block, why, s->queue_deadline());
      if (routed != Route::queued) c_.overload()->release();
    }
  } else {
    routed = route(fill, s->level(), may_block, why, s->queue_deadline());
  }
  switch (routed) {
    case Route::queued:
      if (c_.observes(Observer::task_enqueued)) [[unlikely]]
        task_events::enqueued(c_, s, s->is_long);
      // Counted (pushed): a deadline that passed while this call routed
      // it is fired here; whoever pops the cell reports it, as for the
      // supervisor's.
      if (deadline && s->end_admission()) [[unlikely]]
        (void)s->expire();
      return Admission::accepted;
    case Route::run_here:  // or its queue deadline passed while it waited for room
      c_.disarm_queue_deadline(s);
      if (deadline && (s->end_admission() || s->queue_deadline_passed())) [[unlikely]] {
        c_.expire_unqueued(s);  // drops the cell's reference
        return Admission::accepted;
      }
      if (s->leave_queue(TaskStatus::running)) {
        c_.inline_runner().run_claimed_here(s, /*drop_ref=*/true);
      } else {
        s->release();
      }
      return Admission::accepted;
    case Route::refused:
      break;
  }
  // A refusal decides, even if the queue deadline passed meanwhile: the
  // outcome is claimed before the deadline's hand-over ends, so that the
  // supervisor's timer, firing after end_admission, finds it decided and
  // expire() does nothing. The other way round the timer could expire the
  // task in between: the refusal ended `expired` and was counted twice
  // (outcomes above submissions).
  s->refused_as = why;
  const bool decided = s->claim_in_queue(TaskStatus::rejected, Errc::rejected);
  if (deadline) (void)s->end_admission();
  c_.disarm_queue_deadline(s);
  // Counted as a refusal already (refused_).
  if (decided) settle_in_queue(s, false);
  if (c_.observes(Observer::task_rejected)) [[unlikely]]
    task_events::refused(c_, s, s->is_long, why);
  s->release();
  return why;
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
    if (c_.queue_->try_push(fill, level)) {
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
          return c_.queue_->level_size(level) > blocked.low_water() &&
                 !c_.life_.closed(std::memory_order_seq_cst);
        },
        give_up);
  }
  blocked.leave();
  if (r == Route::queued) c_.after_push();
  return r;
}

}  // namespace crew::detail
