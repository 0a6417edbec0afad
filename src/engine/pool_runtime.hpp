// src/engine/pool_runtime.hpp (private): PoolRuntime, the part of a pool
// that is not on the submission path, which PoolCore reaches through a
// std::unique_ptr. It owns the units, each with its own header saying who
// touches what: ObserverHub (observer_hub.hpp), WorkerRegistry
// (worker_registry.hpp: the worker books), BlockedSubmitters
// (blocked_submitters.hpp), WakePolicy (wake_policy.hpp), Supervisor
// (supervisor.hpp: its thread, the timer heap, the stopper, foreign runs)
// and ShutdownSequence (shutdown_sequence.hpp). Its own field is the book
// of shutdowns, under the registry's mutex. A worker and its loop are in
// worker.hpp.
#pragma once

#include <algorithm>
#include <memory>

#include "blocked_submitters.hpp"
#include "crew/detail/overload_control.hpp"
#include "crew/detail/pool_core.hpp"
#include "crew/detail/queues.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/log.hpp"
#include "crew/observer.hpp"
#include "observer_hub.hpp"
#include "shedding.hpp"
#include "shutdown_book.hpp"
#include "shutdown_sequence.hpp"
#include "start_pacer.hpp"
#include "supervisor.hpp"
#include "wake_policy.hpp"
#include "worker.hpp"
#include "worker_registry.hpp"

namespace crew::detail {

struct PoolRuntime {
  PoolRuntime(PoolCore& core, const PoolOptions& options)
      : pacer(options.max_start_rate > 0
                  ? std::make_unique<StartPacer>(options.max_start_rate,
                                                 std::max<std::size_t>(options.start_burst, 1),
                                                 now_ns())
                  : nullptr),
        observers(options),
        registry(core),
        blocked(options.queue_capacity, options.priority_levels),
        wake(core),
        supervisor(core),
        shutdown(core, *this),
        shedding(core) {}

  // PoolOptions::max_start_rate (null without one): workers take a token
  // before they pop.
  const std::unique_ptr<StartPacer> pacer;

  // The observers and the events they hear (user code: never called under
  // a worker's run.mu; under registry.mu only for pool-state edges, see
  // WriteOffNote).
  const ObserverHub observers;

  // The worker threads' books, under registry.mu (worker_registry.hpp).
  WorkerRegistry registry;

  // Shutdowns: one runs at a time (ShutdownSequence); the others wait for
  // its report. Under registry.mu: the sequence, write-offs and drops add
  // to it.
  ShutdownBook shutdowns CREW_GUARDED_BY(registry.mu);

  // Submitters blocked on a full shared queue; released in batches once it
  // is down to half its capacity.
  BlockedSubmitters blocked;

  // Spinning, sleeping and waking workers (src/engine/wake_policy.hpp).
  WakePolicy wake;
  // Deadlines, write-offs, replacements (src/engine/supervisor.hpp).
  Supervisor supervisor;
  // Shutdown and restart (src/engine/shutdown_sequence.hpp).
  ShutdownSequence shutdown;
  // CoDel's drop at a task's start, displacement by priority
  // (src/engine/shedding.hpp).
  Shedding shedding;
};

// Tells observers of a change made by change_worker_state; no lock held.
inline void announce_state(const Worker& w, const WorkerStateChange& change) noexcept {
  if (!change.changed) return;
  PoolCore& c = *w.run.frame.core;
  if (c.observes(Observer::worker_state)) [[unlikely]]
    c.runtime().observers.worker_state(w.id, change.from, change.to);
}
// A state change and its event, on a thread that holds none of the pool's
// locks.
inline void set_worker_state(Worker& w, WorkerState to) noexcept {
  announce_state(w, change_worker_state(w, to));
}

// PoolCore's calls into its PoolRuntime that the engine makes on hot paths (a
// worker's pop), inline here where PoolRuntime is complete.
inline void PoolCore::on_slot_freed() noexcept { rt_->blocked.slot_freed(queue_.get()); }

}  // namespace crew::detail
