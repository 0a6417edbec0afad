// src/engine/shutdown_book.hpp (private): the books of a pool's shutdowns: whether
// one is running and in which mode, whether a concurrent caller asked it to
// escalate, whether it still lets workers start, the report it is building,
// the last one's report, and the submitters that sweep the queue after it
// (PoolCore::on_push_after_close).
//
// Who touches what: all of it is under the pool's WorkerRegistry::mu (the book is
// a member guarded by it: clang's -Wthread-safety checks every call).
// ShutdownSequence::run begins, escalates and finishes (or gives up) a
// shutdown; a concurrent one asks for escalation and waits for its report;
// the sweeps, write-offs and drops add to current() or, after the shutdown
// returned, last(); restart() waits until no sweeper is left.
#pragma once

#include <optional>

#include "crew/pool_types.hpp"

namespace crew::detail {

class ShutdownBook {
 public:
  ShutdownBook() = default;
  ShutdownBook(const ShutdownBook&) = delete;
  ShutdownBook& operator=(const ShutdownBook&) = delete;

  // ---- the running shutdown ----
  [[nodiscard]] bool running() const noexcept { return running_; }
  // Starts one in `mode`, building `report` (which must outlive finish() or
  // give_up()).
  void begin(ShutdownMode mode, ShutdownReport* report) noexcept {
    running_ = true;
    mode_ = mode;
    escalate_ = false;
    workers_closed_ = false;
    report_ = report;
  }
  // The running one has seen its last worker leave (or wrote off the
  // rest): from here on no worker starts (PoolCore::grow, the supervisor's
  // retry), so that none runs a task after it returns. A grow that read
  // the pool as running before the shutdown began may reach its lock only
  // now (its thread preempted in between).
  void close_workers() noexcept { workers_closed_ = true; }
  [[nodiscard]] bool workers_closed() const noexcept { return workers_closed_; }
  // A caller wants `mode` while one runs: true if the running one must now
  // escalate to hard (the first such request; the caller wakes it).
  bool ask_escalation(ShutdownMode mode) noexcept {
    if (!running_ || mode <= mode_ || escalate_) return false;
    escalate_ = true;
    return true;
  }
  // Whether the running one was asked to escalate and has not yet.
  [[nodiscard]] bool escalation_pending() const noexcept {
    return escalate_ && mode_ != ShutdownMode::hard;
  }
  // It escalated to hard (timeout or request).
  void escalated() noexcept { mode_ = ShutdownMode::hard; }
  // The report being built; null when none runs.
  [[nodiscard]] ShutdownReport* current() const noexcept { return report_; }
  // It ended with `report` (the caller then notifies the waiters).
  void finish(const ShutdownReport& report) {
    last_ = report;  // may throw (copies the lists): then nothing changed
    report_ = nullptr;
    running_ = false;
    workers_closed_ = false;  // the pool is stopped: no worker starts until restart()
  }
  // It threw before it finished: the next caller runs the sequence again.
  void give_up() noexcept {
    report_ = nullptr;
    running_ = false;
    workers_closed_ = false;
  }

  // ---- after it ----
  // The last finished shutdown's report, if any (late drops add to it).
  [[nodiscard]] ShutdownReport* last() noexcept { return last_ ? &*last_ : nullptr; }
  // Submitters that found the pool stopped after a shutdown sweep what
  // they left in the queue; restart() waits until none is.
  void enter_sweep() noexcept { ++sweepers_; }
  // True if it was the last sweeper (the caller then notifies the waiters).
  bool leave_sweep() noexcept { return --sweepers_ == 0; }
  [[nodiscard]] bool sweeping() const noexcept { return sweepers_ != 0; }

 private:
  bool running_ = false;
  ShutdownMode mode_ = ShutdownMode::drain;
  bool escalate_ = false;
  bool workers_closed_ = false;
  ShutdownReport* report_ = nullptr;
  std::optional<ShutdownReport> last_;
  int sweepers_ = 0;
};

}  // namespace crew::detail
