// Delivering events to the pool's observers (crew/observer.hpp). Each
// function is called only when some observer wants the event, so these
// loops are off the unobserved hot path.
#include "control.hpp"

namespace crew::detail {

TaskEvent Core::event_of(const TaskStateBase* s) const noexcept {
  return TaskEvent{opts_.name, s->id, s->name(), s->is_long};
}

TaskEvent Core::plain_event(bool is_long) const noexcept {
  return TaskEvent{opts_.name, 0, {}, is_long};
}

void Core::emit_enqueued(const TaskEvent& e) noexcept {
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::task_enqueued) != 0) o.observer->on_task_enqueued(e);
  }
}

void Core::emit_started(const TaskEvent& e, std::int64_t enqueued_ns,
                        std::int64_t start_ns) noexcept {
  const std::chrono::nanoseconds wait(
      enqueued_ns != 0 && start_ns > enqueued_ns ? start_ns - enqueued_ns : 0);
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::task_started) != 0) o.observer->on_task_started(e, wait);
  }
}

void Core::emit_finished(const TaskEvent& e, TaskStatus outcome, std::int64_t enqueued_ns,
                         std::int64_t start_ns, std::int64_t end_ns) noexcept {
  const std::chrono::nanoseconds wait(
      enqueued_ns != 0 && start_ns > enqueued_ns ? start_ns - enqueued_ns : 0);
  const std::chrono::nanoseconds run(end_ns > start_ns ? end_ns - start_ns : 0);
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::task_finished) != 0)
      o.observer->on_task_finished(e, outcome, wait, run);
  }
}

void Core::emit_rejected(const TaskEvent& e, TaskStatus outcome, Errc why, Admission a) noexcept {
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::task_rejected) != 0) o.observer->on_task_rejected(e, outcome, why, a);
  }
}

void Core::emit_settled_in_queue(const TaskStateBase* s) noexcept {
  if (observes(Observer::task_rejected)) {
    emit_rejected(event_of(s), s->status(), s->reason(), s->refused_as);
  }
}

void Core::emit_worker(WorkerEvent kind, std::uint64_t worker, const TaskEvent* task) noexcept {
  if (!observes(Observer::worker_events)) return;
  const TaskEvent none = plain_event(false);
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::worker_events) == 0) continue;
    switch (kind) {
      case WorkerEvent::started:
        o.observer->on_worker_started(opts_.name, worker);
        break;
      case WorkerEvent::stopped:
        o.observer->on_worker_stopped(opts_.name, worker);
        break;
      case WorkerEvent::replaced:
        o.observer->on_worker_replaced(opts_.name, worker);
        break;
      case WorkerEvent::abandoned:
        o.observer->on_worker_abandoned(opts_.name, worker, task != nullptr ? *task : none);
        break;
    }
  }
}

void Core::emit_worker_state(std::uint64_t worker, WorkerState from, WorkerState to) noexcept {
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::worker_state) != 0) {
      o.observer->on_worker_state(opts_.name, worker, from, to);
    }
  }
}

void Core::emit_pool_state(PoolState from, PoolState to) noexcept {
  if (from == to || !observes(Observer::pool_state)) return;
  for (const ObserverSlot& o : observers_) {
    if ((o.events & Observer::pool_state) != 0) o.observer->on_pool_state(opts_.name, from, to);
  }
}

}  // namespace crew::detail
