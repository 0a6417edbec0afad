// crew/detail/suspended_tasks.hpp: the pool's view of its tasks that wait
// without a thread (coroutine tasks, crew/coro.hpp).
//
// A coroutine task that is suspended is in no queue and on no worker, so
// the shutdown sequence cannot find it by itself. The coroutine layer
// installs one SuspendedTasks per pool (PoolCore::install_suspended, on the
// first spawn); the pool owns it from then on and destroys it with its
// core. A shutdown calls shut_down() first, on the shutdown's thread, while
// the pool still runs tasks, so that the coroutines' resumptions and the
// destruction of their frames happen on the pool's workers.
#pragma once

#include <chrono>

#include "crew/pool_types.hpp"

namespace crew::detail {

class SuspendedTasks {
 public:
  SuspendedTasks() = default;
  SuspendedTasks(const SuspendedTasks&) = delete;
  SuspendedTasks& operator=(const SuspendedTasks&) = delete;
  virtual ~SuspendedTasks() = default;

  // The coroutine tasks' part of a shutdown in `mode`: drain waits for them
  // to end until `deadline`; soft and hard (and a drain past its deadline)
  // stop them and wait `grace` more; the frames still alive then are
  // destroyed and listed in `report`. Returns true if it had to go past
  // the drain (the shutdown then reports escalated). Blocks the calling
  // (shutdown) thread, never a worker.
  virtual bool shut_down(ShutdownMode mode, std::chrono::steady_clock::time_point deadline,
                         std::chrono::nanoseconds grace, ShutdownReport& report) noexcept = 0;
};

}  // namespace crew::detail
