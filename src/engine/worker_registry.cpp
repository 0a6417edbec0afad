// WorkerRegistry (worker_registry.hpp): the pool's books of its worker
// threads. Every call here but snapshot() runs under `mu`, and none calls
// user code: observers and the logger hear of what they did after the
// locks are released (by the caller, or Supervisor::announce).
#include "worker_registry.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "pool_runtime.hpp"

namespace crew::detail {

Worker* WorkerRegistry::find_locked(std::uint64_t id) const {
  const auto it =
      std::find_if(workers_.begin(), workers_.end(), [id](const auto& w) { return w->id == id; });
  return it == workers_.end() ? nullptr : it->get();
}

std::uint64_t WorkerRegistry::spawn_locked(bool replacement, bool spinning) noexcept {
  PoolCore& core = core_;
  std::shared_ptr<Worker> w;
  try {
    // Everything that may throw comes before the thread starts: once it
    // runs, the worker must be on the books.
    w = std::make_shared<Worker>(next_worker_id_ + 1, &core);
    if (workers_.size() == workers_.capacity()) workers_.reserve(2 * workers_.size() + 4);
    w->thread =
        OsThread(core.opts_.stack_size, [self = core.shared_from_this(), w, spinning, replacement] {
          WorkerLoop::run(self, w, spinning, replacement);
        });
  } catch (const std::exception& e) {
    core.live_workers_.fetch_sub(1, std::memory_order_relaxed);
    if (spinning) (void)core.idle_.give_token();
    spawns_.failed(e.what(), now_ns());
    core.rt_->supervisor.need_by(spawns_.retry_at_ns());
    return 0;
  }
  ++next_worker_id_;
  spawns_.succeeded();
  if (replacement) ++workers_replaced_;
  const std::uint64_t id = w->id;
  workers_.push_back(std::move(w));
  return id;
}

WorkerRegistry::Left WorkerRegistry::leave_locked(const std::shared_ptr<Worker>& w, bool counted,
                                                  bool died) noexcept {
  Left left;
  retired_ += w->counts.read();
  retired_helped_ += w->counts.helped.get();
  // `abandoned` is set under this mutex, so this check cannot race a
  // write-off: a written-off worker is off the books already.
  if (w->abandoned.load(std::memory_order_acquire)) {
    left.written_off = true;
    std::erase(abandoned_, w);
    return left;
  }
  if (!counted) core_.live_workers_.fetch_sub(1, std::memory_order_relaxed);
  left.stopped = change_worker_state(*w, WorkerState::stopped);
  std::erase(workers_, w);
  left.last = workers_.empty();
  exited_.push_back(w);
  if (died) {
    ++replacements_due_;
    replace_backoff_ = std::clamp<std::chrono::nanoseconds>(
        replace_backoff_ * 2, std::chrono::milliseconds(1), std::chrono::seconds(1));
    next_replace_ns_ = now_ns() + replace_backoff_.count();
  }
  return left;
}

// The run's thread clears its run slot under w.run.mu before it decides an
// outcome, so a run found there is always this call's to decide: cancelled,
// or timed_out if its deadline stopped it. The worker is marked, so that
// the run's own end does not count it again, nor return the task's
// admission ticket, which goes back here: the pool replaces the worker, and
// a thread it wrote off is no longer admitted work (a task that never
// returns would hold its ticket for good, and enough of them would hold the
// limit).
void WorkerRegistry::write_off_run_locked(Worker& w, ShutdownReport* report,
                                          std::vector<WriteOffNote>& notes) noexcept {
  CREW_ASSERT(notes.size() < notes.capacity(), "no room reserved for the note");
  WriteOffNote note;
  note.worker = w.id;
  note.started_ns = w.run.started_ns;
  TaskStateBase* const s = w.run.task;
  const StopReason reason = s != nullptr ? s->stop_reason() : w.run.reason;
  if (reason == StopReason::timed_out) note.outcome = TaskStatus::timed_out;
  // Counted before it is published, as run_claimed does.
  core_.shared_.add(note.outcome);
  note.ended_ns = now_ns();
  if (s != nullptr) {
    if (OverloadControl* ctl = core_.ticket_of(s)) ctl->release();
    note.enqueued_ns = s->clock.enqueued_ns();
    s->clock.record(note.started_ns, note.ended_ns);  // before the outcome is published
    const bool decided = s->finish_written_off(note.outcome);
    CREW_ASSERT(decided, "a written-off run's outcome was decided by its thread");
    (void)decided;
    s->add_ref();
    note.task = s;
    if (report != nullptr) {
      try {
        report->abandoned.push_back(ref_of(*s));
      } catch (...) {
      }
    }
  } else if (report != nullptr) {
    ++report->abandoned_unnamed;
  }
  notes.push_back(note);  // no allocation: room was reserved
  w.abandoned.store(true, std::memory_order_release);
}

// When its task returns, the thread ends without touching the pool's state.
void WorkerRegistry::write_off_locked(const std::shared_ptr<Worker>& w, bool replace) noexcept {
  w->abandoned.store(true, std::memory_order_release);
  w->stop_reason.store(WorkerStopReason::written_off, std::memory_order_relaxed);
  w->write_off_change = change_worker_state(*w, WorkerState::abandoned);
  core_.live_workers_.fetch_sub(1, std::memory_order_relaxed);
  ++tasks_abandoned_;
  if (replace) ++replacements_due_;  // at once: the pool keeps its capacity
  if (w->thread.joinable()) w->thread.detach();
  std::erase(workers_, w);
  abandoned_.push_back(w);
  // A shutdown waiting for the workers counts this one as gone: its thread
  // will not notify when it ends (leave_locked skips written-off workers).
  changed.notify_all();
}

std::int64_t WorkerRegistry::keep_capacity_locked(std::int64_t now,
                                                  std::vector<std::uint64_t>& replaced,
                                                  bool workers_closed) noexcept {
  PoolCore& core = core_;
  std::int64_t next = SupervisorAlarm::kNever;
  if (core.life_.state() == PoolState::running) {
    if (replacements_due_ > 0 && now < next_replace_ns_) next = next_replace_ns_;
    while (replacements_due_ > 0 && now >= next_replace_ns_ &&
           core.live_workers_.load(std::memory_order_relaxed) <
               core.max_workers_.load(std::memory_order_relaxed)) {
      --replacements_due_;
      core.live_workers_.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t id = spawn_locked(true);
      if (id == 0) break;  // retried below
      if (replaced.size() < replaced.capacity()) replaced.push_back(id);
    }
    while (core.live_workers_.load(std::memory_order_relaxed) < core.opts_.min_workers &&
           replacements_due_ == 0 && !spawns_.due()) {
      core.live_workers_.fetch_add(1, std::memory_order_relaxed);
      (void)spawn_locked(false);
    }
  } else {
    replacements_due_ = 0;  // a stopped pool starts its workers on restart()
  }
  return std::min(next, retry_spawn_locked(now, workers_closed));
}

// Tries again to start a worker whose thread could not be started, while
// tasks are queued that a worker of this pool may still run (running, or a
// drain).
std::int64_t WorkerRegistry::retry_spawn_locked(std::int64_t now, bool workers_closed) noexcept {
  PoolCore& core = core_;
  if (!spawns_.due()) return SupervisorAlarm::kNever;
  const PoolState st = core.life_.state();
  const bool may_start = st == PoolState::running ||
                         (st == PoolState::stopping && !core.life_.dropping() && !workers_closed);
  if (!may_start || core.queue_->empty()) {
    spawns_.forget();  // the next submission starts one the usual way
    return SupervisorAlarm::kNever;
  }
  if (now < spawns_.retry_at_ns()) return spawns_.retry_at_ns();
  if (core.live_workers_.load(std::memory_order_relaxed) >=
      core.max_workers_.load(std::memory_order_relaxed)) {
    spawns_.forget();  // the pool is at its size: its workers run the queue
    return SupervisorAlarm::kNever;
  }
  // As grow() does: the new worker looks as a spinner, so it brings in
  // help for what it leaves queued.
  core.live_workers_.fetch_add(1, std::memory_order_relaxed);
  core.idle_.hand_token();
  if (spawn_locked(false, /*spinning=*/true) != 0) return SupervisorAlarm::kNever;
  return spawns_.retry_at_ns();
}

std::uint64_t WorkerRegistry::take_spawn_failures_locked(std::string& error,
                                                         std::chrono::nanoseconds& backoff) {
  backoff = spawns_.backoff();
  return spawns_.take_unlogged(error);
}

OutcomeCounts WorkerRegistry::totals_locked() const {
  OutcomeCounts sum = retired_;
  sum += core_.shared_.read();
  sum.rejected += core_.refused_.load(std::memory_order_relaxed);
  for (const auto& w : workers_) sum += w->counts.read();
  for (const auto& w : abandoned_) sum += w->counts.read();
  return sum;
}

void WorkerRegistry::add_stats_locked(PoolStats& s) const {
  for (const auto& w : workers_) {
    ++s.workers;
    const WorkerState ws = w->state.load(std::memory_order_relaxed);
    if (ws == WorkerState::busy) ++s.busy;
    if (ws == WorkerState::idle) ++s.idle;
    s.helped += w->counts.helped.get();
  }
  s.outcomes = totals_locked();
  s.abandoned = tasks_abandoned_;
  s.workers_replaced = workers_replaced_;
  s.helped += retired_helped_;
}

std::vector<WorkerInfo> WorkerRegistry::snapshot() const {
  std::vector<WorkerInfo> out;
  const std::int64_t now = now_ns();
  MutexLock lock(mu);
  out.reserve(workers_.size());
  for (const auto& w : workers_) {
    WorkerInfo info;
    info.id = w->id;
    info.state = w->state.load(std::memory_order_relaxed);
    w->run.mu.lock();
    if (w->run.task != nullptr) info.task = ref_of(*w->run.task);
    info.stop_reason = w->stop_reason.load(std::memory_order_relaxed);
    if (w->run.started_ns != 0)
      info.running_for = std::chrono::nanoseconds(now - w->run.started_ns);
    if (w->run.deadline_ns != 0 && now > w->run.deadline_ns)
      info.overdue_for = std::chrono::nanoseconds(now - w->run.deadline_ns);
    w->run.mu.unlock();
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace crew::detail
