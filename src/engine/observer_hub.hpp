// src/engine/observer_hub.hpp (private): a pool's observers
// (PoolOptions::observers) and the events it delivers to them
// (crew/observer.hpp). Each emit is called only when some observer wants
// the event (PoolCore::observes), so a pool without observers never enters
// here.
//
// Who touches what: nothing changes after construction (the observers and
// the events each wants are read once), so any thread emits without a lock.
//   task events    the thread where the task event happens: a submitter, a
//                  worker, a waiting thread, the supervisor, a shutdown
//   worker events  the worker's own thread (started, stopped, its states),
//                  the thread that wrote it off (abandoned), after the
//                  pool's locks are released
//   pool state     the thread that changed the state; shutdown, restart,
//                  start and resume change it under WorkerRegistry::mu, and the
//                  event goes out there, so that observers hear the edges
//                  in the order they happened
// Every emit runs user code on the calling thread, until it returns.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "crew/detail/task_state.hpp"
#include "crew/observer.hpp"
#include "crew/pool_types.hpp"

namespace crew::detail {

class ObserverHub {
 public:
  enum class WorkerEvent : std::uint8_t { started, stopped, replaced, abandoned };

  // `options` must outlive the hub (the pool's name is not copied).
  explicit ObserverHub(const PoolOptions& options);
  ObserverHub(const ObserverHub&) = delete;
  ObserverHub& operator=(const ObserverHub&) = delete;

  // The union of the events the observers in `options` want.
  [[nodiscard]] static std::uint32_t events_wanted(const PoolOptions& options) noexcept;
  [[nodiscard]] bool wants(std::uint32_t events) const noexcept { return (wanted_ & events) != 0; }

  [[nodiscard]] TaskEvent event_of(const TaskStateBase* s) const noexcept;
  [[nodiscard]] TaskEvent plain_event(bool is_long) const noexcept;

  void enqueued(const TaskEvent& e) const noexcept;
  void started(const TaskEvent& e, std::int64_t enqueued_ns, std::int64_t start_ns) const noexcept;
  void finished(const TaskEvent& e, TaskStatus outcome, std::int64_t enqueued_ns,
                std::int64_t start_ns, std::int64_t end_ns) const noexcept;
  void rejected(const TaskEvent& e, TaskStatus outcome, Errc why, Admission a) const noexcept;
  // A task state that ended without running: who settled it tells observers.
  void settled_in_queue(const TaskStateBase* s) const noexcept;
  // `why`: for `stopped` only.
  void worker(WorkerEvent kind, std::uint64_t worker, const TaskEvent* task = nullptr,
              WorkerStopReason why = WorkerStopReason::none) const noexcept;
  void worker_state(std::uint64_t worker, WorkerState from, WorkerState to) const noexcept;
  // Nothing if from == to or nobody wants pool states.
  void pool_state(PoolState from, PoolState to) const noexcept;

 private:
  struct Slot {
    Observer* observer;
    std::uint32_t events;
  };
  const std::string_view pool_;
  const std::vector<Slot> slots_;
  const std::uint32_t wanted_;
};

}  // namespace crew::detail
