// src/engine/shutdown_sequence.hpp (private): a pool's shutdown modes
// (drain, soft, hard, with escalation and write-offs), restart, and the
// handling of submissions that raced a shutdown. The sequence is described
// in docs/design/architecture.md and docs/shutdown.md.
//
// Who touches what:
//   run          a thread in Pool::shutdown or ~Pool, or the supervisor
//                (a stop of PoolOptions::stop_token); one runs the
//                sequence at a time, the others wait on done_ for its
//                report (a harder mode asks it to escalate)
//   restart      a thread in Pool::restart; waits on done_ for the
//                submitters still sweeping
//   on_push_after_close
//                a submitter whose push met a finished shutdown
//   note_dropped, note_stopped
//                a worker or sweeper that dropped or stopped a task
//                during a shutdown (or after it returned)
// Its books (PoolRuntime::shutdowns) are under WorkerRegistry::mu, with the worker
// list it waits on: the supervisor's write-offs add to them too. User code
// it calls (stop callbacks, observers, the logger, the tasks a drain runs
// on this thread) runs outside WorkerRegistry::mu, but for the pool-state edges
// (see WriteOffNote in pool_runtime.hpp).
#pragma once

#include <chrono>
#include <condition_variable>

#include "crew/detail/cell.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/pool_types.hpp"

namespace crew::detail {

class PoolCore;
struct PoolRuntime;

class ShutdownSequence {
 public:
  // `core` owns `rt`, which owns this sequence; both outlive it.
  ShutdownSequence(PoolCore& core, PoolRuntime& rt) noexcept : core_(core), rt_(rt) {}
  ShutdownSequence(const ShutdownSequence&) = delete;
  ShutdownSequence& operator=(const ShutdownSequence&) = delete;

  // PoolControl::shutdown: blocks until the pool is stopped (or the shutdown is
  // given up: it throws, out of memory). Called from user code that this
  // pool's own shutdown runs on this thread, it returns at once.
  ShutdownReport run(ShutdownMode mode, std::chrono::nanoseconds timeout);
  // PoolCore::restart: false unless the pool is stopped.
  bool restart();
  // A push that saw the pool stopping: a running shutdown sweeps the cell;
  // after one has finished, the submitter runs (drain) or rejects it here
  // and adds the rejections to the pool's last report.
  void on_push_after_close() noexcept;
  // Runs a popped cell on this thread, or rejects it while a soft or hard
  // shutdown drops queued tasks (a wait's help, a sweep).
  void settle_popped_here(Cell& cell);
  // A task dropped from the queue (null: a plain one): told to observers
  // and listed in the running shutdown's report.
  void note_dropped(TaskStateBase* s) noexcept;
  // A run that ends cancelled or timed out, called before its outcome is
  // published: listed in the running shutdown's report if the hard phase
  // stopped it (cancelled) or its deadline ended it (timed_out).
  void note_stopped(TaskStateBase* s, TaskStatus outcome) noexcept;

 private:
  void give_up() noexcept;
  void wake_everyone() noexcept;
  bool wait_for_workers(std::chrono::steady_clock::time_point deadline);
  void drop_queue();
  void sweep_queue(bool run);
  void stop_running();
  void abandon_busy(bool force);

  PoolCore& core_;
  PoolRuntime& rt_;
  // A shutdown finished or was given up; the last sweeper left (waited on
  // under WorkerRegistry::mu).
  std::condition_variable done_;
};

}  // namespace crew::detail
