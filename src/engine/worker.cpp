// WorkerLoop (worker.hpp), the worker threads' body: start and stop (hooks,
// local queue slot, leaving the books), the loop that pops cells, attention
// (pause, resize, stop requests) and handling a popped cell; and the
// outcome counting PoolCore does for any thread. Spinning and sleeping are
// WakePolicy's (wake.cpp), running task states in run.cpp, waits that help
// in help.cpp.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <string>
#include <thread>

#include "pool_runtime.hpp"
#include "thread_name.hpp"

namespace crew::detail {
namespace {

// Puts the calling thread under `policy`. False if the system refused.
bool apply_policy(WorkerPolicy policy) noexcept {
#if defined(__linux__)
  if (policy == WorkerPolicy::batch) {
    const sched_param param{};
    return sched_setscheduler(0, SCHED_BATCH, &param) == 0;
  }
#endif
  (void)policy;
  return true;
}

}  // namespace

void PoolCore::count_outcome(TaskStatus outcome) noexcept {
  if (t_current.core == this) {
    t_current.worker->counts.add(outcome);
  } else {
    shared_.add(outcome);
  }
}

void PoolCore::settled_in_queue(TaskStateBase* s, bool count) noexcept {
  disarm_queue_deadline(s);
  if (count) count_outcome(s->raw_status());
}

void PoolCore::expire_unqueued(TaskStateBase* s) noexcept {
  if (s->expire()) rt_->observers.settled_in_queue(s);
  s->release();
}

void WorkerLoop::run(std::shared_ptr<PoolCore> self, std::shared_ptr<Worker> w, bool spinning,
                     bool replacement) {
  PoolCore& c = *self;
  WorkerLoop loop(c, *w);
  name_thread(c.opts_.name, std::to_string(w->id));
  if (!apply_policy(c.opts_.worker_policy) && c.rt_->registry.first_policy_refusal()) {
    try {
      c.log(LogLevel::warning, {.pool = c.opts_.name, .worker_id = w->id},
            "worker_policy " + std::string(to_string(c.opts_.worker_policy)) +
                " refused by the system; workers keep the default policy");
    } catch (...) {  // out of memory for the message
    }
  }
  bool started = true;
  if (spinning && c.opts_.on_worker_start) {
    // The hook is user code and may take long: while this worker holds the
    // spinning token no submission wakes or starts another, so hand it back
    // first, and let whatever is queued bring in a worker now.
    (void)c.idle_.give_token();
    spinning = false;
    if (!c.queue_->empty()) c.after_push();
  }
  if (c.opts_.on_worker_start) {
    try {
      c.opts_.on_worker_start(w->id);
    } catch (...) {
      started = false;
      if (w->may_call_user())
        c.log_hook_failure("on_worker_start", w->id, std::current_exception());
    }
  }
  // Written off while in its start hook (it hung there through a hard
  // shutdown's last grace period): it is off the books and must not serve
  // tasks. abandon_busy reads the state and writes off under run.mu.
  bool written_off = false;
  if (started) {
    WorkerStateChange idle;
    w->run.mu.lock();
    written_off = w->abandoned.load(std::memory_order_acquire);
    if (!written_off) idle = change_worker_state(*w, WorkerState::idle);
    w->run.mu.unlock();
    announce_state(*w, idle);
  }
  Exit how = written_off ? Exit::abandoned : Exit::leave;
  if (started && !written_off) {
    c.rt_->observers.worker(ObserverHub::WorkerEvent::started, w->id);
    if (replacement) c.rt_->observers.worker(ObserverHub::WorkerEvent::replaced, w->id);
    LocalQueues& locals = c.queue_->locals();
    // Pools with priority levels keep every task in the shared queue, where
    // the levels are.
    if (c.queue_->levels() == 1) {
      try {
        w->pop.local = locals.claim();
      } catch (...) {  // out of memory for the queue: submit to the shared one
      }
    }
    t_current = {&c, w.get(),
                 w->pop.local != LocalQueues::kNone ? &locals.at(w->pop.local) : nullptr};
    how = loop.loop(spinning);
    t_current = {};
    if (w->pop.local != LocalQueues::kNone) {
      const bool left_work = !locals.at(w->pop.local).empty();
      locals.release(std::exchange(w->pop.local, LocalQueues::kNone));
      // Tasks it leaves (it was stopped or retired between tasks) are stolen
      // by the others; make sure one of them is awake.
      if (left_work) c.after_push();
    }
    if (c.opts_.on_worker_stop && w->may_call_user()) {
      try {
        c.opts_.on_worker_stop(w->id);
      } catch (...) {
        c.log_hook_failure("on_worker_stop", w->id, std::current_exception());
      }
    }
  }
  if (!started || written_off) {
    if (!written_off) {
      w->stop_reason.store(WorkerStopReason::start_hook_failed, std::memory_order_relaxed);
      set_worker_state(*w, WorkerState::stopping);
    }
    if (spinning) (void)c.idle_.give_token();
  }
  // Its ticket ledger goes to the thread that next needs one.
  if (c.overload() != nullptr) c.overload()->leave();
  loop.exited(w, how, /*died=*/!started);
  // A worker stopped or retired between tasks leaves while tasks may be
  // queued that submitters did not start a worker for (it still counted as
  // live then): now that it is off the books, bring in one if needed.
  if (started && how != Exit::abandoned && c.state() == PoolState::running && !c.queue_->empty()) {
    c.after_push();
  }
}

void WorkerLoop::exited(const std::shared_ptr<Worker>& w, Exit how, bool died) noexcept {
  PoolRuntime& rt = *core_.rt_;
  // A waker that popped this worker from the idle stack may still be
  // inside futex_wake on its word: wait for it before the memory can go.
  rt.wake.quiesce();
  WorkerRegistry::Left left;
  {
    MutexLock lock(rt.registry.mu);
    left = rt.registry.leave_locked(w, /*counted=*/how == Exit::counted, died);
  }
  if (left.written_off) return;
  announce_state(*w, left.stopped);
  rt.observers.worker(ObserverHub::WorkerEvent::stopped, w->id, nullptr,
                      w->stop_reason.load(std::memory_order_relaxed));
  if (left.last) rt.registry.changed.notify_all();  // a shutdown waits for the last one
  rt.supervisor.wake();                             // joins the thread, replaces a dead worker
}

// `spinning`: this worker holds a spinning token (handed over by whoever
// started or woke it for queued work).
WorkerLoop::Exit WorkerLoop::loop(bool spinning) {
  PoolCore& c = core_;
  Worker& w = w_;
  Cell cell;
  Exit how = Exit::leave;
  // One behind, so that the first look attends: a stop_worker, resize or
  // pause made while this worker started (it is listed, and idle, before
  // this line) bumped the counter already, and would be missed.
  w.seen_attention = c.life_.attention(std::memory_order_acquire) - 1;
  set_worker_state(w, WorkerState::idle);
  // Whether the next look is a spinner's (spin_for_work), which brings in
  // help for what it leaves queued, rather than a plain pop.
  bool spin_first = spinning;
  for (;;) {
    if (!spin_first) {
      if (c.life_.attention(std::memory_order_relaxed) != w.seen_attention) [[unlikely]] {
        if (attend(how)) break;
      }
      const Gate gate = c.rt_->pacer == nullptr ? Gate::pop : pace_start();
      if (gate == Gate::look) continue;
      if (gate == Gate::pop) {
        if (c.queue_->try_pop(cell, w.pop)) {
          if (w.wake.backlog_since_ns != 0) c.rt_->wake.wake_for_backlog(w);
          c.rt_->wake.after_batch(w);
          if (!handle_cell(cell)) return Exit::abandoned;
          continue;
        }
        if (c.rt_->pacer != nullptr && !c.life_.dropping()) c.rt_->pacer->give_back();
      }
      if (c.life_.closed()) {
        w.stop_reason.store(c.rt_->supervisor.root_stopped() ? WorkerStopReason::root_token
                                                             : WorkerStopReason::shutdown,
                            std::memory_order_relaxed);
        break;
      }
    }
    const bool found = c.rt_->wake.spin_for_work(w, cell, spinning);
    spinning = spin_first = false;
    if (found) {
      c.rt_->wake.after_batch(w);  // the token is given back by now
      if (!handle_cell(cell)) return Exit::abandoned;
      continue;
    }
    const WakePolicy::Slept slept = c.rt_->wake.sleep_for_work(w);
    if (slept == WakePolicy::Slept::retired) {
      w.stop_reason.store(WorkerStopReason::idle_expired, std::memory_order_relaxed);
      how = Exit::counted;
      break;
    }
    spinning = slept == WakePolicy::Slept::woken_spinning;
    // One that left on its own look found work whose helper was deferred
    // (wake_due) by a worker that may now be in a long task: it looks as a
    // spinner, so that it brings in help for what it leaves queued.
    spin_first = spinning || slept == WakePolicy::Slept::saw_work;
  }
  set_worker_state(w, WorkerState::stopping);
  return how;
}

// With a start-rate limit (StartPacer): pop with a token taken (given back
// if the pop finds nothing); or, with none due while work is queued, the
// one worker that may waits for it, without a task, and looks again; the
// others spin and sleep as idle workers do (sleep_for_work leaves them
// asleep while a worker waits for a token), except during a drain, when
// they wait for the token too.
WorkerLoop::Gate WorkerLoop::pace_start() noexcept {
  PoolCore& c = core_;
  StartPacer& pacer = *c.rt_->pacer;
  if (c.life_.dropping()) return Gate::pop;  // a shutdown rejects, it starts nothing
  std::int64_t wait_ns = 0;
  if (pacer.try_take(now_ns(), wait_ns)) return Gate::pop;
  if (c.queue_->empty()) return Gate::idle;
  // In slices, so that a pause, a resize or a shutdown is seen within one.
  constexpr std::int64_t kSliceNs = 10'000'000;
  // Unless it is the one waiter, another worker waits for the token. A
  // draining pool's workers cannot sleep for work (a closed pool ends their
  // sleep at once, and a look that pops nothing ends them), so each waits
  // out the token here: the drain keeps its workers for what is queued, and
  // the rate spaces their starts.
  const bool waiter = pacer.begin_wait();
  if (!waiter && !c.life_.closed()) return Gate::idle;
  set_worker_state(w_, WorkerState::idle);
  std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(wait_ns, kSliceNs)));
  if (waiter) pacer.end_wait();
  return Gate::look;
}

// Something besides the queue changed. Returns true if this worker must
// exit, with `how` saying whether it already left live_workers_.
bool WorkerLoop::attend(Exit& how) {
  PoolCore& c = core_;
  Worker& w = w_;
  for (;;) {
    w.seen_attention = c.life_.attention(std::memory_order_acquire);
    if (w.exit_requested.load(std::memory_order_acquire)) {
      w.stop_reason.store(WorkerStopReason::stop_worker, std::memory_order_relaxed);
      how = Exit::leave;
      return true;
    }
    const PoolState st = c.life_.state();
    if (st == PoolState::paused) {
      set_worker_state(w, WorkerState::idle);
      w.run.clock_ns = 0;  // the next run waited: its start is not the last end
      WorkerRegistry& registry = c.rt_->registry;
      MutexLock lock(registry.mu);
      while (c.life_.attention(std::memory_order_acquire) == w.seen_attention) {
        registry.changed.wait(lock.native());
      }
      continue;
    }
    const std::size_t max = c.max_workers_.load(std::memory_order_relaxed);
    if (st == PoolState::running && c.live_workers_.load(std::memory_order_relaxed) > max &&
        try_retire(c.live_workers_, max)) {
      w.stop_reason.store(WorkerStopReason::resized, std::memory_order_relaxed);
      how = Exit::counted;
      return true;
    }
    return false;
  }
}

// Returns false if the worker was abandoned while running the cell.
bool WorkerLoop::handle_cell(Cell& cell) {
  PoolCore& c = core_;
  Worker& w = w_;
  c.on_slot_freed();
  // A task pushed after pause() returned is seen here as paused (its push
  // happened after the state change, its pop before this load), so it is
  // held until resume() or a shutdown, and handled then as any queued task.
  if (c.life_.state() == PoolState::paused) [[unlikely]] {
    c.rt_->wake.wait_out_pause(w);
    w.run.clock_ns = 0;  // the run waited: its start is not the last end
  }
  TaskStateBase* s = cell.state();
  if (s != nullptr) return handle_state(s);
  if (c.life_.dropping()) [[unlikely]] {
    const bool step = cell.is_step();  // its task counts the drop (TaskStep)
    cell.destroy();
    if (!step) {
      w.counts.rejected.inc();
      c.rt_->shutdown.note_dropped(nullptr);
    }
    return true;
  }
  set_worker_state(w, WorkerState::busy);
  w.run.seq.store(w.run.seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  try {
    if (!cell.invoke_and_destroy(&w)) w.counts.succeeded.inc();
  } catch (...) {
    // Reported before it is counted: wait_idle() returns only after handlers ran.
    if (w.may_call_user()) c.report_exception(TaskRef{}, std::current_exception());
    w.counts.failed.inc();
  }
  return !w.abandoned.load(std::memory_order_acquire);
}

bool WorkerLoop::handle_state(TaskStateBase* s) {
  PoolCore& c = core_;
  Worker& w = w_;
  // The admission ticket goes back when the task is done with (run, shed
  // or settled), or when its run is written off; read now, since the run
  // may free `s`.
  TicketReturn ticket(c.ticket_of(s));
  if (c.life_.dropping() && s->leave_queue(TaskStatus::rejected, Errc::shutdown_dropped))
      [[unlikely]] {
    c.rt_->shutdown.note_dropped(s);  // counted, disarmed and its callable gone (leave_queue)
  } else if (s->queue_deadline_passed() && s->expire()) [[unlikely]] {
    c.rt_->observers.settled_in_queue(
        s);  // its timer has not fired yet, or was left to its submitter
  } else if (ticket.held() && c.runtime().shedding.shed_at_start(s)) [[unlikely]] {
    // Shed by CoDel: counted and reported by shed_at_start.
  } else if (!s->leave_queue(TaskStatus::running)) {
    // Decided while queued (cancelled, expired): counted by the thread that
    // decided it (leave_queue). A task run by a waiting worker (ran()) was
    // counted by that worker.
    if (!s->ran()) c.rt_->observers.settled_in_queue(s);
  } else {
    c.disarm_queue_deadline(s);
    // Busy from run_claimed, in one step with the run slot.
    w.run.seq.store(w.run.seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const bool kept = c.run_claimed(&w, s, /*top_level=*/true, /*drop_ref=*/true);  // the cell's
    // reference. Written off (not kept): the write-off returned the ticket.
    if (!kept) ticket.disarm();
    // Kept, but written off since as running a plain task (the worker is
    // busy until it sleeps): a written-off worker takes no more tasks.
    return kept && !w.abandoned.load(std::memory_order_acquire);
  }
  s->release();
  return true;
}

}  // namespace crew::detail
