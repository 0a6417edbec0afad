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
      (void)core_.runtime().shutdown.run(ShutdownMode::hard, std::chrono::nanoseconds(0));
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
    MutexLock lock(rt.registry.mu);
    const auto& workers = rt.registry.live_locked();
    // Room for every worker first: nothing below allocates once a note
    // holds a reference or a write-off is decided.
    notes.reserve(workers.size());
    to_stop.reserve(workers.size());
    replaced.reserve(rt.registry.replacements_due_locked() + workers.size());
    hung.reserve(workers.size());
    for (const auto& w : workers) {
      w->run.mu.lock();
      if (w->run.is_long) {
        const std::int64_t stop_at = w->run.frame.stop_at_ns.load(std::memory_order_acquire);
        const std::int64_t deadline = w->run.deadline_ns;
        if (stop_at != 0) {
          if (now >= saturating_add(stop_at, grace)) {
            rt.registry.write_off_run_locked(*w, rt.shutdowns.current(), notes);
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
    for (const auto& w : hung) rt.registry.write_off_locked(w, /*replace=*/true);
    next = std::min(next,
                    rt.registry.keep_capacity_locked(now, replaced, rt.shutdowns.workers_closed()));
    spawn_failures = rt.registry.take_spawn_failures_locked(spawn_error, spawn_backoff);
    rt.registry.take_exited_locked(to_join);
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

// PoolCore's calls from the inline submission path.
void PoolCore::arm_queue_deadline(TaskStateBase* s) { rt_->supervisor.arm_queue_deadline(s); }
void PoolCore::disarm_timer(TaskStateBase* s) noexcept { rt_->supervisor.disarm(s); }

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
    WorkerRegistry& registry = rt.registry;
    MutexLock lock(registry.mu);
    // After a shutdown every worker has exited or was written off; one still
    // on the books would end with the last reference to its own joinable
    // std::thread (std::terminate). It is leaving: wait for it.
    while (!registry.live_locked().empty()) registry.changed.wait(lock.native());
    registry.take_exited_locked(to_join);
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
