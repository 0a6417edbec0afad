// crew/detail/pool_control.hpp: the calls of a pool that are not
// submissions, for the facades (crew::Pool in src/pool/pool.cpp):
// PoolControl (start, shutdown and restart, pause, resume, resize,
// stop_worker, wait_idle) and PoolSnapshot (stats, workers). A wait that
// runs queued tasks (Pool::run_pending_task) calls the InlineRunner itself.
// Each is a view of one PoolCore, made per call as Submission is; they are
// defined in src/engine/pool_control.cpp, where the engine's units are
// complete. crew/pool.hpp does not include this header: no inline template
// needs it.
//
// Who touches what: the thread that calls the facade; the state they read
// and change is PoolCore's and its PoolRuntime's, under those units' own
// locks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "crew/pool_types.hpp"

namespace crew::detail {

class PoolCore;

// What a pool shows of itself. Both take the worker registry's mutex and
// nothing else; any thread may call them, a worker of the pool too.
class PoolSnapshot {
 public:
  explicit PoolSnapshot(const PoolCore& core) noexcept : c_(core) {}

  // Outcomes are read before submissions: every outcome in the snapshot
  // belongs to a counted submission, so outcomes >= submitted proves that
  // they all ended (wait_idle).
  [[nodiscard]] PoolStats stats() const;
  [[nodiscard]] std::vector<WorkerInfo> workers() const;

 private:
  const PoolCore& c_;
};

// The control calls. The facade refuses the waiting ones from a task of
// the pool itself (Pool::shutdown, Pool::wait_idle) before it gets here.
class PoolControl {
 public:
  explicit PoolControl(PoolCore& core) noexcept : c_(core) {}

  // Starts the supervisor, then min_workers; the pool is then running.
  // Throws (and starts no worker) if the supervisor's thread cannot start.
  void start();
  // Stops and joins the supervisor (after the final shutdown).
  void stop_supervisor() noexcept;
  // Blocks: until the shutdown in `mode` has ended, or `timeout` after it
  // began (src/engine/shutdown_sequence.hpp); a second caller waits for the
  // report of the one that runs.
  ShutdownReport shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout);
  bool restart();
  void pause();
  void resume();
  void resize(std::size_t max_workers);
  bool stop_worker(std::uint64_t id, WorkerStop how);
  // Blocks: until every task submitted so far has an outcome and its
  // handlers and observers have returned, or until `deadline` (false).
  bool wait_idle(std::chrono::steady_clock::time_point deadline);

 private:
  PoolCore& c_;
};

}  // namespace crew::detail
