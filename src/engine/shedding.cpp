// Shedding (shedding.hpp): CoDel's drop at a task's start and the
// displacement by priority.
#include "shedding.hpp"

#include "pool_runtime.hpp"

namespace crew::detail {

bool Shedding::codel_sheds(std::int64_t enqueued_ns) noexcept {
  if (enqueued_ns == 0) return false;  // its wait is not timed
  const std::int64_t start = now_ns();
  return core_.overload()->on_start(start - enqueued_ns, start);
}

bool Shedding::shed_admitted(std::int64_t enqueued_ns) noexcept {
  if (!codel_sheds(enqueued_ns)) [[likely]]
    return false;
  core_.overload()->note_shed();
  return true;
}

Shedding::Displaced Shedding::displace_below(std::size_t level) noexcept {
  Cell cell;
  if (core_.queue_->take_newest_below(level, cell) == level) return Displaced::nothing;
  // Only admitted tasks queue newest first: a task state with its ticket,
  // or an AdmittedFn, whose destruction returns it.
  if (TaskStateBase* s = cell.state()) {
    const TicketReturn ticket(core_.ticket_of(s));
    // Decided meanwhile (cancelled, expired): counted by whoever decided,
    // and no shed.
    const bool shed = s->shed(OverloadReason::priority);
    if (shed) core_.runtime().observers.settled_in_queue(s);
    s->release();
    return shed ? Displaced::shed : Displaced::freed;
  }
  cell.destroy();
  core_.shared_.add(TaskStatus::shed);
  return Displaced::shed;
}

bool Shedding::shed_at_start(TaskStateBase* s) noexcept {
  // Not a start: decided meanwhile (cancelled, expired) or run by a wait.
  if (s->status() != TaskStatus::queued) return false;
  if (!codel_sheds(s->clock.enqueued_ns())) [[likely]]
    return false;
  if (!s->shed(OverloadReason::codel)) return false;  // decided meanwhile (cancelled)
  core_.overload()->note_shed();
  core_.runtime().observers.settled_in_queue(s);
  return true;
}

}  // namespace crew::detail
