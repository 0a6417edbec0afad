// The supervisor: the one thread per pool that serves every deadline (the
// timer heap and the workers' execution deadlines), abandons tasks that
// ignore a stop request past abandon_grace, replaces dead and abandoned
// workers, keeps min_workers, joins exited threads, and turns a stop of the
// root stop token into a hard shutdown.
#include "supervisor.hpp"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "pool_runtime.hpp"

namespace crew::detail {
namespace {

constexpr std::int64_t kNever = SupervisorAlarm::kNever;
static_assert(TimerHeap::kNever == kNever, "fire_timers returns the heap's kNever to sleep_until");

}  // namespace

// ---- the timer heap ----

// The heap's reference is taken here and dropped again if arming throws.
void Supervisor::arm(TaskStateBase* s, std::int64_t at_ns, bool exec) {
  s->add_ref();
  bool earliest = false;
  try {
    earliest = timers_.push(s, at_ns, exec);
  } catch (...) {
    s->release();
    throw;
  }
  if (earliest) alarm_.need_by(at_ns);
}

void Supervisor::disarm(TaskStateBase* s) noexcept {
  if (timers_.erase(s)) s->release();  // outside the lock: it may run a destructor
}

void Supervisor::arm_queue_deadline(TaskStateBase* s) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
      s->extras()->queue_deadline.time_since_epoch());
  arm(s, ns.count(), /*exec=*/false);
}

void Supervisor::register_foreign(TaskStateBase* s, std::int64_t deadline_ns) noexcept {
  {
    MutexLock lock(foreign_mu_);
    try {
      foreign_.push_back(s);
    } catch (...) {  // out of memory: a hard shutdown will not stop it, its deadline still does
    }
  }
  if (deadline_ns != 0) {
    try {
      arm(s, deadline_ns, /*exec=*/true);
    } catch (...) {  // out of memory: the deadline is lost, the task still runs
    }
  }
  // A hard shutdown may have begun before this run registered: it sets
  // the drop switch before it reads foreign_ (stop_foreign).
  const PoolLifecycle& life = core_.life_;
  if (life.dropping(std::memory_order_seq_cst) && life.closed(std::memory_order_seq_cst)) {
    s->request_stop(StopReason::shutdown);
  }
}

void Supervisor::unregister_foreign(TaskStateBase* s) noexcept {
  disarm(s);
  MutexLock lock(foreign_mu_);
  std::erase(foreign_, s);
}

void Supervisor::stop_foreign(StopReason why) {
  std::vector<StopTarget> targets;
  {
    MutexLock lock(foreign_mu_);
    // Room first: a target holds a reference that a throwing push would lose.
    targets.reserve(foreign_.size());
    for (TaskStateBase* s : foreign_) {
      s->add_ref();
      targets.push_back(StopTarget{s, std::stop_source(std::nostopstate), why});
    }
  }
  for (StopTarget& t : targets) t.fire();  // user stop callbacks, outside the lock
}

std::int64_t Supervisor::fire_timers(std::int64_t now) {
  std::vector<TimerHeap::Due> due;
  std::int64_t next = TimerHeap::kNever;
  try {
    next = timers_.pop_due(now, due);
  } catch (...) {
    // Out of memory for `due`: what it holds was moved out of the heap
    // (with its references) and is fired below; the rest stays armed.
    next = now + std::chrono::nanoseconds(std::chrono::milliseconds(1)).count();
  }
  std::vector<StopTarget> to_stop;
  for (const auto [s, exec] : due) {
    if (exec) {
      StopTarget t;
      t.task = s;  // the heap's reference moves to the target
      t.reason = StopReason::timed_out;
      try {
        to_stop.push_back(std::move(t));
      } catch (...) {  // out of memory: fire it here
        t.fire();
      }
    } else {
      // expire() settles it here: counted, a listening callable told
      // (QueueExpiryListener), the callable destroyed, then published;
      // unless its submitter is still routing it, which then does.
      if (!s->defer_expiry()) (void)s->expire();
      s->release();
    }
  }
  hand_to_stopper(to_stop);
  return next;
}

// ---- the supervisor loop ----

void Supervisor::start() {
  thread_ = std::thread([this] { loop(); });
}

void Supervisor::watch(const std::stop_token& token) noexcept {
  if (token.stop_possible()) root_stop_.emplace(token, RootStop{&core_});
}

void RootStop::operator()() const noexcept { core->runtime().supervisor.on_root_stop(); }

void Supervisor::on_root_stop() noexcept {
  root_stopped_.store(true, std::memory_order_release);
  root_stop_pending_.store(true, std::memory_order_release);
  wake();
}

void Supervisor::loop() noexcept {
  for (;;) {
    const SupervisorAlarm::Key key = alarm_.begin_scan();
    if (exit_.load(std::memory_order_acquire)) {
      alarm_.cancel();
      return;
    }
    if (root_stop_pending_.exchange(false, std::memory_order_acq_rel)) {
      alarm_.cancel();
      (void)core_.shutdown(ShutdownMode::hard, std::chrono::nanoseconds(0));
      continue;
    }
    std::int64_t next = kNever;
    try {
      const std::int64_t now = now_ns();
      next = std::min(fire_timers(now), watch_workers(now));
    } catch (...) {  // out of memory while scanning: try again shortly
      next = now_ns() + std::chrono::nanoseconds(std::chrono::milliseconds(10)).count();
    }
    alarm_.sleep_until(key, next);
  }
}

std::int64_t Supervisor::watch_workers(std::int64_t now) {
  PoolCore& core = core_;
  PoolRuntime& rt = core.runtime();
  std::int64_t next = kNever;
  std::vector<StopTarget> to_stop;
  std::vector<std::shared_ptr<Worker>> to_join;
  std::vector<WriteOffNote> notes;
  std::vector<std::uint64_t> replaced;  // ids of replacement workers, to log
  std::uint64_t spawn_failures = 0;
  std::string spawn_error;
  std::chrono::nanoseconds spawn_backoff{0};
  const std::int64_t grace = core.opts_.abandon_grace.count();
  std::vector<std::shared_ptr<Worker>> hung;
  {
    MutexLock lock(rt.mu);
    // Room for every worker first: nothing below allocates once a note
    // holds a reference or a write-off is decided.
    notes.reserve(rt.workers.size());
    to_stop.reserve(rt.workers.size());
    replaced.reserve(rt.replacements_due + rt.workers.size());
    hung.reserve(rt.workers.size());
    for (const auto& w : rt.workers) {
      w->run.mu.lock();
      if (w->run.is_long) {
        const std::int64_t stop_at = w->run.frame.stop_at_ns.load(std::memory_order_acquire);
        const std::int64_t deadline = w->run.deadline_ns;
        if (stop_at != 0) {
          if (now >= saturating_add(stop_at, grace)) {
            rt.write_off_run_locked(core, *w, rt.shutdowns.current(), notes);
            hung.push_back(w);
          } else {
            next = std::min(next, saturating_add(stop_at, grace));
          }
        } else if (deadline != 0) {
          if (now >= deadline) {
            StopTarget t;
            if (prepare_stop_locked(*w, StopReason::timed_out, t)) to_stop.push_back(std::move(t));
            next = std::min(next, saturating_add(now, grace));
          } else {
            next = std::min(next, deadline);
          }
        }
      }
      w->run.mu.unlock();
    }
    for (const auto& w : hung) {
      rt.write_off_locked(core, w);
      ++rt.replacements_due;  // at once: the pool keeps its capacity
    }

    if (core.life_.state() == PoolState::running) {
      if (rt.replacements_due > 0 && now < rt.next_replace_ns) {
        next = std::min(next, rt.next_replace_ns);
      }
      while (rt.replacements_due > 0 && now >= rt.next_replace_ns &&
             core.live_workers_.load(std::memory_order_relaxed) <
                 core.max_workers_.load(std::memory_order_relaxed)) {
        --rt.replacements_due;
        core.live_workers_.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t id = rt.spawn_worker_locked(core, true);
        if (id == 0) break;  // retried by `spawns` below
        if (replaced.size() < replaced.capacity()) replaced.push_back(id);
      }
      while (core.live_workers_.load(std::memory_order_relaxed) < core.opts_.min_workers &&
             rt.replacements_due == 0 && !rt.spawns.due()) {
        core.live_workers_.fetch_add(1, std::memory_order_relaxed);
        (void)rt.spawn_worker_locked(core, false);
      }
    } else {
      rt.replacements_due = 0;  // a stopped pool starts its workers on restart()
    }
    next = std::min(next, rt.retry_spawn_locked(core, now));
    spawn_failures = rt.spawns.take_unlogged(spawn_error);
    spawn_backoff = rt.spawns.backoff();
    to_join.swap(rt.exited);
  }
  announce(notes, hung);
  // The logger is user code: called only now, outside the pool's locks.
  if (spawn_failures != 0) {
    core.log(LogLevel::error, {.pool = core.opts_.name},
             "cannot start a worker thread (" + std::to_string(spawn_failures) +
                 (spawn_failures == 1 ? " failure): " : " failures): ") + spawn_error +
                 "; trying again in " + std::to_string(spawn_backoff.count() / 1'000'000) +
                 " ms while tasks are queued");
  }
  if (core.logs(LogLevel::warning)) {
    for (const std::uint64_t id : replaced) {
      core.log(LogLevel::warning, {.pool = core.opts_.name, .worker_id = id},
               "started to replace a worker that died or was abandoned");
    }
  }
  hand_to_stopper(to_stop);
  for (const auto& w : to_join) {
    if (w->thread.joinable()) w->thread.join();
  }
  return next;
}

// Under PoolRuntime::mu and w.run.mu: decides the outcome of the worker's
// current run as abandoned (cancelled, or timed_out if its deadline stopped
// it) and marks the worker, so that the run's own end does not count it
// again. The run's thread clears its run slot under w.run.mu before it
// decides an outcome, so a run found there is always this call's to decide.
// Observers and the logger hear of it from Supervisor::announce, after the
// locks are released.
void PoolRuntime::write_off_run_locked(PoolCore& core, Worker& w, ShutdownReport* report,
                                       std::vector<WriteOffNote>& notes) noexcept {
  CREW_ASSERT(notes.size() < notes.capacity(), "no room reserved for the note");
  WriteOffNote note;
  note.worker = w.id;
  note.started_ns = w.run.started_ns;
  TaskStateBase* const s = w.run.task;
  const StopReason reason = s != nullptr ? s->stop_reason() : w.run.reason;
  if (reason == StopReason::timed_out) note.outcome = TaskStatus::timed_out;
  // Counted before it is published, as run_claimed does. The running thread
  // clears run.task under run.mu before it decides an outcome, so with
  // run.task set the outcome is the write-off's to decide.
  core.shared_.add(note.outcome);
  note.ended_ns = now_ns();
  if (s != nullptr) {
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

void Supervisor::announce(std::vector<WriteOffNote>& notes,
                          const std::vector<std::shared_ptr<Worker>>& written_off) noexcept {
  PoolCore& core = core_;
  const ObserverHub& hub = core.runtime().observers;
  for (WriteOffNote& n : notes) {
    const TaskEvent event = n.task != nullptr ? hub.event_of(n.task) : hub.plain_event(true);
    hub.worker(ObserverHub::WorkerEvent::abandoned, n.worker, &event);
    if (core.logs(LogLevel::warning)) {
      try {
        core.log(LogLevel::warning,
                 {.pool = core.opts_.name,
                  .task = event.name,
                  .task_id = event.id,
                  .worker_id = n.worker,
                  .correlation_id = n.task != nullptr ? std::string_view(n.task->correlation_id())
                                                      : std::string_view{}},
                 "task abandoned: still running " +
                     std::to_string(core.opts_.abandon_grace.count() / 1'000'000) +
                     " ms after its stop was requested; its worker is written off");
      } catch (...) {  // out of memory while formatting: drop the line
      }
    }
    if (hub.wants(Observer::task_finished)) {
      hub.finished(event, n.outcome, n.enqueued_ns, n.started_ns, n.ended_ns);
    }
    if (n.task != nullptr) n.task->release();
  }
  notes.clear();
  for (const auto& w : written_off) {
    announce_state(*w, w->write_off_change);
    hub.worker(ObserverHub::WorkerEvent::stopped, w->id, nullptr, WorkerStopReason::written_off);
  }
}

// Writes a worker off: it leaves the pool's books and its thread is detached;
// when its task returns, the thread ends without touching the pool's state.
void PoolRuntime::write_off_locked(PoolCore& core, const std::shared_ptr<Worker>& w) noexcept {
  w->abandoned.store(true, std::memory_order_release);
  w->stop_reason.store(WorkerStopReason::written_off, std::memory_order_relaxed);
  w->write_off_change = change_worker_state(*w, WorkerState::abandoned);
  core.live_workers_.fetch_sub(1, std::memory_order_relaxed);
  ++tasks_abandoned;
  if (w->thread.joinable()) w->thread.detach();
  std::erase(workers, w);
  abandoned.push_back(w);
  // A shutdown waiting for the workers counts this one as gone: its thread
  // will not notify when it ends (worker_exited skips written-off workers).
  workers_changed.notify_all();
}

// Tries again to start a worker whose thread could not be started, while
// tasks are queued that a worker of this pool may still run (running, or a
// drain). Returns when to look again.
std::int64_t PoolRuntime::retry_spawn_locked(PoolCore& core, std::int64_t now) noexcept {
  if (!spawns.due()) return kNever;
  const PoolState st = core.life_.state();
  const bool may_start =
      st == PoolState::running || (st == PoolState::stopping && !core.life_.dropping());
  if (!may_start || core.queue_.empty()) {
    spawns.forget();  // the next submission starts one the usual way
    return kNever;
  }
  if (now < spawns.retry_at_ns()) return spawns.retry_at_ns();
  if (core.live_workers_.load(std::memory_order_relaxed) >=
      core.max_workers_.load(std::memory_order_relaxed)) {
    spawns.forget();  // the pool is at its size: its workers run the queue
    return kNever;
  }
  // As grow() does: the new worker looks as a spinner, so it brings in
  // help for what it leaves queued.
  core.live_workers_.fetch_add(1, std::memory_order_relaxed);
  core.idle_.hand_token();
  if (spawn_worker_locked(core, false, /*spinning=*/true) != 0) return kNever;
  return spawns.retry_at_ns();
}

// PoolCore's calls from the inline submission path and from ~Pool.
void PoolCore::arm_queue_deadline(TaskStateBase* s) { rt_->supervisor.arm_queue_deadline(s); }
void PoolCore::disarm_timer(TaskStateBase* s) noexcept { rt_->supervisor.disarm(s); }
void PoolCore::stop_supervisor() noexcept { rt_->supervisor.stop(); }

void Supervisor::hand_to_stopper(std::vector<StopTarget>& targets) noexcept {
  stopper_.hand(targets);
}

void Supervisor::stop() noexcept {
  PoolRuntime& rt = core_.runtime();
  root_stop_.reset();  // no callback can start after this
  exit_.store(true, std::memory_order_release);
  alarm_.wake_all();
  if (thread_.joinable()) thread_.join();
  // The supervisor is gone, so nothing hands the stopper more work.
  stopper_.stop();
  std::vector<std::shared_ptr<Worker>> to_join;
  TimerHeap::Armed armed;
  {
    MutexLock lock(rt.mu);
    // After a shutdown every worker has exited or was written off; one still
    // on the books would end with the last reference to its own joinable
    // std::thread (std::terminate). It is leaving: wait for it.
    while (!rt.workers.empty()) rt.workers_changed.wait(lock.native());
    to_join.swap(rt.exited);
  }
  armed = timers_.take_all();
  for (const auto& w : to_join) {
    if (w->thread.joinable()) w->thread.join();
  }
  for (const auto* part : {&armed.heap, &armed.lane}) {
    for (const TimerHeap::Entry& e : *part) e.state->release();
  }
}

}  // namespace crew::detail
