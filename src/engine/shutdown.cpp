// Shutdown modes, restart, and the handling of submissions that raced a
// shutdown. The sequence is described in docs/design/architecture.md and docs/shutdown.md.
#include <string>
#include <utility>

#include "crew/detail/barrier.hpp"
#include "crew/detail/suspended_tasks.hpp"
#include "pool_runtime.hpp"
#include "shutdown_sequence.hpp"

namespace crew::detail {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after(Clock::time_point t, std::chrono::nanoseconds d) noexcept {
  return saturating_deadline(t, d);
}

std::string summary_of(const ShutdownReport& r) {
  const OutcomeCounts& d = r.during;
  return "shutdown " + std::string(to_string(r.mode)) +
         (r.escalated ? " (escalated to hard)" : "") + " finished in " +
         std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(r.elapsed).count()) +
         " us: succeeded " + std::to_string(d.succeeded) + ", failed " + std::to_string(d.failed) +
         ", cancelled " + std::to_string(d.cancelled) + ", timed out " +
         std::to_string(d.timed_out) + ", rejected " + std::to_string(d.rejected) + ", abandoned " +
         std::to_string(r.abandoned.size() + r.abandoned_unnamed);
}

// The pool whose shutdown this thread is running: the user code it calls
// on the way (stop callbacks of the tasks it stops, observers, the logger)
// runs on this thread too.
thread_local const PoolCore* t_shutting_down = nullptr;

}  // namespace

// The submission path's call, handed to the sequence (the control calls'
// are in pool_control.cpp).
void PoolCore::on_push_after_close() noexcept { rt_->shutdown.on_push_after_close(); }

ShutdownReport ShutdownSequence::run(ShutdownMode mode, std::chrono::nanoseconds timeout) {
  PoolRuntime& rt = rt_;
  const auto t0 = Clock::now();
  ShutdownReport report;
  report.mode = mode;
  if (t_shutting_down == &core_) {
    // Called from user code that this pool's own shutdown runs on this
    // thread: waiting for that shutdown would wait for itself. A harder
    // mode is passed on as an escalation; the call returns at once with
    // the pool still stopping.
    MutexLock lock(rt.registry.mu);
    if (rt.shutdowns.ask_escalation(mode)) rt.registry.changed.notify_all();
    report.final_state = core_.state();
    return report;
  }
  struct Running {
    const PoolCore* outer;
    explicit Running(const PoolCore* core) noexcept : outer(std::exchange(t_shutting_down, core)) {}
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
    ~Running() { t_shutting_down = outer; }
  } running(&core_);
  OutcomeCounts before;
  {
    MutexLock lock(rt.registry.mu);
    // Concurrent callers wait for the first one and share its report; one
    // asking for a harder mode makes the running one escalate to hard now.
    if (rt.shutdowns.ask_escalation(mode)) rt.registry.changed.notify_all();
    while (rt.shutdowns.running()) done_.wait(lock.native());
    const PoolState st = core_.state();
    if (st == PoolState::stopped || st == PoolState::stopped_timeout) {
      if (const ShutdownReport* last = rt.shutdowns.last()) return *last;
      report.final_state = st;
      return report;
    }
    rt.shutdowns.begin(mode, &report);
    before = rt.registry.totals_locked();
  }
  // Coroutine tasks first, while the pool still runs their steps: their
  // resumptions and the destruction of their frames need the workers
  // (crew/detail/suspended_tasks.hpp).
  bool suspended_escalated = false;
  if (SuspendedTasks* suspended = core_.suspended()) {
    const auto deadline = timeout.count() > 0 ? after(t0, timeout) : Clock::time_point::max();
    suspended_escalated = suspended->shut_down(mode, deadline, core_.opts_.abandon_grace, report);
  }
  {
    MutexLock lock(rt.registry.mu);
    if (mode != ShutdownMode::drain) core_.life_.start_dropping();
    core_.set_state(PoolState::stopping);
    core_.life_.call_attention();
  }
  // A worker's push into its own queue has no full fence of its own: from
  // here on, either it saw `stopping` (and handles its cell), or its cell
  // is visible to the sweeps below (detail/barrier.hpp).
  heavy_fence();
  // What follows may throw (it allocates for the report). Then this
  // shutdown is given up: its report no longer points at this frame, and a
  // caller waiting for it (or a later one) runs the sequence again.
  struct GiveUpOnThrow {
    ShutdownSequence* sequence;
    bool done = false;
    ~GiveUpOnThrow() {
      if (!done) sequence->give_up();
    }
  } give_up_on_throw{this};
  wake_everyone();
  if (mode == ShutdownMode::drain) {
    // Queued tasks run on as many workers as the pool may have, even if
    // none is alive (a paused pool that never started one, workers that
    // died or expired): workers start at submission, and a stopping pool
    // starts no more on its own, so a drain right after a burst of posts
    // would otherwise run the queue on the few that were started.
    core_.grow_for_queued();
  } else {
    drop_queue();
  }
  if (mode == ShutdownMode::hard) stop_running();

  bool escalated = false;
  if (mode != ShutdownMode::hard) {
    const auto deadline = timeout.count() > 0 ? after(t0, timeout) : Clock::time_point::max();
    if (suspended_escalated || !wait_for_workers(deadline)) {
      escalated = true;
      {
        MutexLock lock(rt.registry.mu);
        rt.shutdowns.escalated();
      }
      core_.life_.start_dropping();
      core_.life_.call_attention();
      wake_everyone();
      drop_queue();
      stop_running();
    }
  }
  if (mode == ShutdownMode::hard || escalated) {
    if (!wait_for_workers(after(Clock::now(), core_.opts_.abandon_grace))) {
      abandon_busy(/*force=*/false);
      // Workers between tasks exit at once; give them one more grace period.
      if (!wait_for_workers(after(Clock::now(), core_.opts_.abandon_grace))) abandon_busy(true);
    }
  }
  // Exited threads are joined by the supervisor (or the destructor): the
  // report is complete once they have left their loops.
  rt_.supervisor.wake();

  // Final sweep: cells of submissions that raced the start of the shutdown.
  // The sweep and the check run until the queue is seen empty under the
  // mutex; a later racer finds none running and sweeps by itself.
  const bool run_leftovers = mode == ShutdownMode::drain && !escalated;
  for (;;) {
    sweep_queue(run_leftovers);
    MutexLock lock(rt.registry.mu);
    if (!core_.queue_->empty()) continue;
    report.escalated = escalated;
    report.final_state = escalated ? PoolState::stopped_timeout : PoolState::stopped;
    report.elapsed = Clock::now() - t0;
    report.lifetime = rt.registry.totals_locked();
    report.during = report.lifetime;
    report.during.succeeded -= before.succeeded;
    report.during.failed -= before.failed;
    report.during.cancelled -= before.cancelled;
    report.during.timed_out -= before.timed_out;
    report.during.rejected -= before.rejected;
    rt.shutdowns.finish(report);
    core_.set_state(report.final_state);
    give_up_on_throw.done = true;
    break;
  }
  done_.notify_all();
  // An escalation rejected or cut short work the caller asked to finish, and
  // a destructor's report is read by nobody: a warning, not an info line.
  const LogLevel level = report.escalated ? LogLevel::warning : LogLevel::info;
  if (core_.logs(level)) core_.log(level, {.pool = core_.opts_.name}, summary_of(report));
  return report;
}

bool ShutdownSequence::restart() {
  {
    MutexLock lock(rt_.registry.mu);
    // A submitter that raced the last shutdown may still be sweeping what it
    // left in the queue; tasks submitted after this returns must not meet it.
    while (rt_.shutdowns.sweeping()) done_.wait(lock.native());
    const PoolState st = core_.state();
    if (rt_.shutdowns.running() || (st != PoolState::stopped && st != PoolState::stopped_timeout)) {
      return false;
    }
    core_.life_.stop_dropping();
    core_.set_state(PoolState::running);
    core_.life_.call_attention();
    for (std::size_t i = core_.live_workers_.load(); i < core_.opts_.min_workers; ++i) {
      core_.live_workers_.fetch_add(1, std::memory_order_relaxed);
      rt_.registry.spawn_locked(false);
    }
  }
  rt_.supervisor.wake();
  return true;
}

void ShutdownSequence::on_push_after_close() noexcept {
  bool run = false;
  {
    MutexLock lock(rt_.registry.mu);
    // A shutdown in progress sweeps the queue before it finishes; a pool
    // restarted meanwhile runs the task normally.
    if (rt_.shutdowns.running() || core_.state() < PoolState::stopping) return;
    const ShutdownReport* last = rt_.shutdowns.last();
    run = last != nullptr && last->mode == ShutdownMode::drain && !last->escalated;
    rt_.shutdowns.enter_sweep();  // restart() waits for this sweep
  }
  // The shutdown has finished: this submitter handles what it left behind
  // (drop_queue adds the rejections to the last report).
  try {
    sweep_queue(run);
  } catch (...) {  // out of memory for the report lists: the counts still hold
  }
  bool last = false;
  {
    MutexLock lock(rt_.registry.mu);
    last = rt_.shutdowns.leave_sweep();
  }
  if (last) done_.notify_all();
}

void ShutdownSequence::give_up() noexcept {
  {
    MutexLock lock(rt_.registry.mu);
    rt_.shutdowns.give_up();
  }
  done_.notify_all();
}

void ShutdownSequence::wake_everyone() noexcept {
  rt_.wake.wake_all();
  rt_.registry.changed.notify_all();  // paused workers
  rt_.blocked.release_all();          // blocked submitters see `closed`
}

// Also returns (false) when a concurrent shutdown asked to escalate.
// Once it sees none left, no worker starts any more (ShutdownBook::close_workers):
// in the same hold of the lock, so that none starts unwaited for.
bool ShutdownSequence::wait_for_workers(Clock::time_point deadline) {
  MutexLock lock(rt_.registry.mu);
  while (!rt_.registry.live_locked().empty()) {
    if (rt_.shutdowns.escalation_pending()) return false;
    if (deadline == Clock::time_point::max()) {
      rt_.registry.changed.wait(lock.native());
    } else if (rt_.registry.changed.wait_until(lock.native(), deadline) ==
               std::cv_status::timeout) {
      if (!rt_.registry.live_locked().empty()) return false;
      break;
    }
  }
  rt_.shutdowns.close_workers();
  return true;
}

// Rejects everything queued (soft and hard modes, and escalation).
void ShutdownSequence::drop_queue() {
  std::vector<TaskRef> dropped;
  std::uint64_t unnamed = 0;
  Cell cell;
  while (core_.queue_->try_pop(cell)) {
    core_.on_slot_freed();
    TaskStateBase* s = cell.state();
    if (s == nullptr) {
      const bool step = cell.is_step();  // its task counts the drop (TaskStep)
      cell.destroy();
      if (step) continue;
      if (core_.observes(Observer::task_rejected)) {
        rt_.observers.rejected(rt_.observers.plain_event(false), TaskStatus::rejected,
                               Errc::shutdown_dropped, Admission::accepted);
      }
      core_.shared_.add(TaskStatus::rejected);
      ++unnamed;
      continue;
    }
    const TicketReturn ticket(core_.ticket_of(s));
    // The cell's reference is dropped even if listing the task throws.
    struct Release {
      TaskStateBase* s;
      ~Release() { s->release(); }
    } release{s};
    // leave_queue counts the outcome it decides; one decided elsewhere
    // (cancelled, expired) was counted there.
    if (s->leave_queue(TaskStatus::rejected, Errc::shutdown_dropped)) {
      rt_.observers.settled_in_queue(s);
      dropped.push_back(ref_of(*s));
    } else if (!s->ran()) {
      rt_.observers.settled_in_queue(s);
    }
  }
  MutexLock lock(rt_.registry.mu);
  // A sweep after the shutdown returned (a submission that raced past its
  // end) adds to the last report, which later shutdown() calls return.
  ShutdownReport* const current = rt_.shutdowns.current();
  ShutdownReport* const target = current != nullptr ? current : rt_.shutdowns.last();
  if (current == nullptr && target != nullptr) {
    target->during.rejected += unnamed + dropped.size();
    target->lifetime.rejected += unnamed + dropped.size();
  }
  if (target != nullptr) {
    ShutdownReport& r = *target;
    r.rejected_unnamed += unnamed;
    if (r.rejected.empty()) {
      r.rejected = std::move(dropped);
    } else {
      r.rejected.insert(r.rejected.end(), dropped.begin(), dropped.end());
    }
  }
}

// Runs a popped cell on this thread, or rejects it while a soft or hard
// shutdown drops queued tasks; a task decided while queued is counted.
void ShutdownSequence::settle_popped_here(Cell& cell) {
  TaskStateBase* s = cell.state();
  const bool dropping = core_.life_.dropping();
  if (s == nullptr) {
    if (dropping) {
      const bool step = cell.is_step();  // its task counts the drop (TaskStep)
      cell.destroy();
      if (step) return;
      note_dropped(nullptr);
      core_.count_outcome(TaskStatus::rejected);
    } else {
      core_.inline_runner().run_cell_here(cell);
    }
    return;
  }
  const TicketReturn ticket(core_.ticket_of(s));
  if (dropping && s->leave_queue(TaskStatus::rejected, Errc::shutdown_dropped)) {
    note_dropped(s);  // counted, disarmed and its callable gone (leave_queue)
  } else if (s->queue_deadline_passed() && s->expire()) {
    rt_.observers.settled_in_queue(s);
  } else if (ticket.held() && core_.runtime().shedding.shed_at_start(s)) {
    // shed: counted and reported
  } else if (s->leave_queue(TaskStatus::running)) {
    core_.disarm_queue_deadline(s);
    core_.inline_runner().run_claimed_here(s, /*drop_ref=*/true);  // the cell's reference
    return;
  } else if (!s->ran()) {
    rt_.observers.settled_in_queue(s);  // decided (and counted) while queued
  }
  s->release();
}

// Runs (drain) or rejects whatever is left in the queue, on this thread.
void ShutdownSequence::sweep_queue(bool run) {
  if (!run) {
    drop_queue();
    return;
  }
  Cell cell;
  while (core_.queue_->try_pop(cell)) settle_popped_here(cell);
}

// Stops the token of every running long task.
void ShutdownSequence::stop_running() {
  std::vector<StopTarget> targets;
  {
    MutexLock lock(rt_.registry.mu);
    // Room first: a target holds a reference that a throwing push would lose.
    targets.reserve(rt_.registry.live_locked().size());
    for (const auto& w : rt_.registry.live_locked()) {
      StopTarget t;
      w->run.mu.lock();
      const bool found = prepare_stop_locked(*w, StopReason::shutdown, t);
      w->run.mu.unlock();
      if (found) targets.push_back(std::move(t));
    }
  }
  for (StopTarget& t : targets) t.fire();
  rt_.supervisor.stop_foreign(StopReason::shutdown);
  rt_.supervisor.wake();  // it watches the grace periods of inline runs
}

// After the hard phase's grace: writes off the workers still running a task
// (all remaining workers when `force`).
void ShutdownSequence::abandon_busy(bool force) {
  std::vector<WriteOffNote> notes;
  std::vector<std::shared_ptr<Worker>> hung;
  {
    MutexLock lock(rt_.registry.mu);
    notes.reserve(rt_.registry.live_locked().size());
    ShutdownReport* r = rt_.shutdowns.current();
    hung.reserve(rt_.registry.live_locked().size());
    for (const auto& w : rt_.registry.live_locked()) {
      bool write_off = false;
      w->run.mu.lock();
      if (w->run.task != nullptr || w->run.is_long) {
        rt_.registry.write_off_run_locked(*w, r, notes);
        write_off = true;
      } else {
        // A plain short task (no handle, no name): its outcome is counted
        // by the thread if it ever returns. With `force`, also a thread
        // stuck in a start or stop hook.
        const WorkerState st = w->state.load(std::memory_order_relaxed);
        const bool busy = st == WorkerState::busy;
        if (busy || (force && (st == WorkerState::starting || st == WorkerState::stopping))) {
          if (r != nullptr && busy) ++r->abandoned_unnamed;
          w->abandoned.store(true, std::memory_order_release);
          write_off = true;
        }
      }
      w->run.mu.unlock();
      if (write_off) hung.push_back(w);
    }
    for (const auto& w : hung)
      rt_.registry.write_off_locked(w, /*replace=*/false);  // each wakes the waiting shutdown
    // The last resort: every worker is off the books now.
    if (force) rt_.shutdowns.close_workers();
  }
  rt_.supervisor.announce(notes, hung);  // observers and the logger, outside the locks
}

void ShutdownSequence::note_dropped(TaskStateBase* s) noexcept {
  if (s != nullptr) {
    rt_.observers.settled_in_queue(s);
  } else if (core_.observes(Observer::task_rejected)) {
    rt_.observers.rejected(rt_.observers.plain_event(false), TaskStatus::rejected,
                           Errc::shutdown_dropped, Admission::accepted);
  }
  MutexLock lock(rt_.registry.mu);
  ShutdownReport* r = rt_.shutdowns.current();
  if (r == nullptr && core_.state() >= PoolState::stopping && rt_.shutdowns.last() != nullptr) {
    r = rt_.shutdowns.last();  // after the shutdown returned: see drop_queue
    ++r->during.rejected;
    ++r->lifetime.rejected;
  }
  if (r == nullptr) return;
  if (s == nullptr) {
    ++r->rejected_unnamed;
    return;
  }
  try {
    r->rejected.push_back(ref_of(*s));
  } catch (...) {  // out of memory: the count in `during` still has it
  }
}

void ShutdownSequence::note_stopped(TaskStateBase* s, TaskStatus outcome) noexcept {
  // report.cancelled is for tasks the hard phase stopped; one stopped first
  // by its handle, its group or its parent ended as its caller asked.
  if (outcome == TaskStatus::cancelled && s->stop_reason() != StopReason::shutdown) return;
  MutexLock lock(rt_.registry.mu);
  ShutdownReport* r = rt_.shutdowns.current();
  if (r == nullptr) return;
  try {
    (outcome == TaskStatus::cancelled ? r->cancelled : r->timed_out).push_back(ref_of(*s));
  } catch (...) {
  }
}

}  // namespace crew::detail
