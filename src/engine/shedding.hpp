// src/engine/shedding.hpp: Shedding, the pool's side of the overload
// controller (crew/overload.hpp) once a task is queued: CoDel's drop of an
// admitted task that waited too long, decided as it starts, and the
// displacement of the newest admitted task of a lower priority by a
// submission past the limit. The controller itself (the limit, the
// windows, the tickets) is OverloadControl (overload_control.cpp).
//
// Who touches what: no state of its own. shed_admitted and shed_at_start
// run on the thread that popped the task (a worker, or a wait or sweep on
// another thread); displace_below on a submitting thread. What they change
// is the queue (Queues' own locks), the task's state (its compare-exchange)
// and the controller's counters (atomics).
#pragma once

#include <cstddef>
#include <cstdint>

namespace crew::detail {

class PoolCore;
class TaskStateBase;

class Shedding {
 public:
  explicit Shedding(PoolCore& core) noexcept : core_(core) {}
  Shedding(const Shedding&) = delete;
  Shedding& operator=(const Shedding&) = delete;

  // Whether an admitted plain task (AdmittedFn) enqueued at `enqueued_ns`
  // (0: untimed, never shed) is shed by CoDel as it starts now; counted
  // as shed by the caller. Counts the start either way.
  bool shed_admitted(std::int64_t enqueued_ns) noexcept;
  // The same for an admitted task state popped at its start: if it is
  // shed, it is settled here (counted, its callable told and destroyed).
  // False too when it was decided meanwhile (cancelled, expired) or run by
  // a wait.
  bool shed_at_start(TaskStateBase* s) noexcept;
  // What displace_below did.
  enum class Displaced : std::uint8_t {
    nothing,  // no admitted task queued newest first below `level`
    shed,     // one was shed: the submission takes its place
    freed,    // one decided meanwhile (cancelled, expired) was taken out:
              // its ticket went back, and the submission may ask again
  };
  // Sheds (reason priority) the newest admitted task queued newest first
  // at a level below `level`, for a submission at `level` past the limit;
  // its ticket goes back.
  Displaced displace_below(std::size_t level) noexcept;

 private:
  // CoDel's answer for an admitted task starting now, enqueued at
  // `enqueued_ns` (0: untimed, never shed); counts the start either way.
  bool codel_sheds(std::int64_t enqueued_ns) noexcept;

  PoolCore& core_;
};

}  // namespace crew::detail
