// Delivering events to the pool's observers (crew/observer.hpp).
#include "observer_hub.hpp"

#include "crew/detail/task_events.hpp"
#include "pool_runtime.hpp"

namespace crew::detail {
namespace {

std::chrono::nanoseconds wait_of(std::int64_t enqueued_ns, std::int64_t start_ns) noexcept {
  return std::chrono::nanoseconds(
      enqueued_ns != 0 && start_ns > enqueued_ns ? start_ns - enqueued_ns : 0);
}

}  // namespace

ObserverHub::ObserverHub(const PoolOptions& options)
    : pool_(options.name),
      slots_([&options] {
        std::vector<Slot> slots;
        for (const auto& obs : options.observers) slots.push_back({obs.get(), obs->events()});
        return slots;
      }()),
      wanted_(events_wanted(options)) {}

std::uint32_t ObserverHub::events_wanted(const PoolOptions& options) noexcept {
  std::uint32_t all = 0;
  for (const auto& obs : options.observers) all |= obs->events();
  return all;
}

TaskEvent ObserverHub::event_of(const TaskStateBase* s) const noexcept {
  return TaskEvent{pool_, s->id, s->name(), s->is_long};
}

TaskEvent ObserverHub::plain_event(bool is_long) const noexcept {
  return TaskEvent{pool_, 0, {}, is_long};
}

void ObserverHub::enqueued(const TaskEvent& e) const noexcept {
  for (const Slot& o : slots_) {
    if ((o.events & Observer::task_enqueued) != 0) o.observer->on_task_enqueued(e);
  }
}

void ObserverHub::started(const TaskEvent& e, std::int64_t enqueued_ns,
                          std::int64_t start_ns) const noexcept {
  const std::chrono::nanoseconds wait = wait_of(enqueued_ns, start_ns);
  for (const Slot& o : slots_) {
    if ((o.events & Observer::task_started) != 0) o.observer->on_task_started(e, wait);
  }
}

void ObserverHub::finished(const TaskEvent& e, TaskStatus outcome, std::int64_t enqueued_ns,
                           std::int64_t start_ns, std::int64_t end_ns) const noexcept {
  const std::chrono::nanoseconds wait = wait_of(enqueued_ns, start_ns);
  const std::chrono::nanoseconds run(end_ns > start_ns ? end_ns - start_ns : 0);
  for (const Slot& o : slots_) {
    if ((o.events & Observer::task_finished) != 0)
      o.observer->on_task_finished(e, outcome, wait, run);
  }
}

void ObserverHub::rejected(const TaskEvent& e, TaskStatus outcome, Errc why,
                           Admission a) const noexcept {
  for (const Slot& o : slots_) {
    if ((o.events & Observer::task_rejected) != 0) o.observer->on_task_rejected(e, outcome, why, a);
  }
}

void ObserverHub::settled_in_queue(const TaskStateBase* s) const noexcept {
  if (wants(Observer::task_rejected)) {
    rejected(event_of(s), s->status(), s->reason(), s->refused_as);
  }
}

void ObserverHub::worker(WorkerEvent kind, std::uint64_t worker, const TaskEvent* task,
                         WorkerStopReason why) const noexcept {
  if (!wants(Observer::worker_events)) return;
  const TaskEvent none = plain_event(false);
  for (const Slot& o : slots_) {
    if ((o.events & Observer::worker_events) == 0) continue;
    switch (kind) {
      case WorkerEvent::started:
        o.observer->on_worker_started(pool_, worker);
        break;
      case WorkerEvent::stopped:
        o.observer->on_worker_stopped(pool_, worker, why);
        break;
      case WorkerEvent::replaced:
        o.observer->on_worker_replaced(pool_, worker);
        break;
      case WorkerEvent::abandoned:
        o.observer->on_worker_abandoned(pool_, worker, task != nullptr ? *task : none);
        break;
    }
  }
}

void ObserverHub::worker_state(std::uint64_t worker, WorkerState from,
                               WorkerState to) const noexcept {
  for (const Slot& o : slots_) {
    if ((o.events & Observer::worker_state) != 0) {
      o.observer->on_worker_state(pool_, worker, from, to);
    }
  }
}

void ObserverHub::pool_state(PoolState from, PoolState to) const noexcept {
  if (from == to || !wants(Observer::pool_state)) return;
  for (const Slot& o : slots_) {
    if ((o.events & Observer::pool_state) != 0) o.observer->on_pool_state(pool_, from, to);
  }
}

namespace task_events {

void enqueued(const PoolCore& core, const TaskStateBase* s, bool is_long) noexcept {
  const ObserverHub& hub = core.runtime().observers;
  hub.enqueued(s != nullptr ? hub.event_of(s) : hub.plain_event(is_long));
}

void refused(const PoolCore& core, const TaskStateBase* s, bool is_long, Admission why) noexcept {
  const ObserverHub& hub = core.runtime().observers;
  hub.rejected(s != nullptr ? hub.event_of(s) : hub.plain_event(is_long), TaskStatus::rejected,
               Errc::rejected, why);
}

void started(const PoolCore& core, const TaskStateBase* s, std::int64_t enqueued_ns,
             std::int64_t start_ns) noexcept {
  if (!core.observes(Observer::task_started)) return;
  const ObserverHub& hub = core.runtime().observers;
  hub.started(hub.event_of(s), enqueued_ns, start_ns);
}

void finished(const PoolCore& core, const TaskStateBase* s, TaskStatus outcome,
              std::int64_t enqueued_ns, std::int64_t start_ns, std::int64_t end_ns) noexcept {
  if (!core.observes(Observer::task_finished)) return;
  const ObserverHub& hub = core.runtime().observers;
  hub.finished(hub.event_of(s), outcome, enqueued_ns, start_ns, end_ns);
}

void unrun(const PoolCore& core, const TaskStateBase* s, TaskStatus outcome, Errc why) noexcept {
  if (!core.observes(Observer::task_rejected)) return;
  const ObserverHub& hub = core.runtime().observers;
  hub.rejected(hub.event_of(s), outcome, why, s->refused_as);
}

}  // namespace task_events

}  // namespace crew::detail
