// Running a claimed task state: on a worker's top level (watched by the
// supervisor through the worker's run slot), nested in a wait, or on a
// thread that is not a worker; long tasks with their stop source and
// deadline; plain long and observed runs; stop requests to a running task.
#include <algorithm>
#include <exception>
#include <memory>

#include "pool_runtime.hpp"

namespace crew::detail {

namespace {

// The start time of a long run on `w`: the end of the previous run when this
// one follows it directly, else the clock.
std::int64_t start_time(Worker& w) noexcept {
  if (w.run.clock_ns != 0 && w.run.clock_seq + 1 == w.run.seq.load(std::memory_order_relaxed)) {
    return w.run.clock_ns;
  }
  return now_ns();
}

void end_time(Worker& w, std::int64_t end) noexcept {
  w.run.clock_ns = end;
  w.run.clock_seq = w.run.seq.load(std::memory_order_relaxed);
}

// Replaces a source a stop went through, and creates it on first use.
void ready_source(RunFrame& frame) {
  if (frame.poisoned || !frame.source.stop_possible()) {
    frame.source = std::stop_source();
    frame.poisoned = false;
  }
}

// The outcome of a long run that returned (or threw: `outcome` is failed).
TaskStatus decide(TaskStatus outcome, StopReason stop, std::int64_t deadline, std::int64_t end,
                  Errc& why) noexcept {
  why = Errc{};
  if (stop == StopReason::cancelled || stop == StopReason::shutdown) {
    why = Errc::cancelled;
    return TaskStatus::cancelled;
  }
  if (stop == StopReason::timed_out || (deadline != 0 && end > deadline)) {
    why = Errc::timed_out;
    return TaskStatus::timed_out;
  }
  return outcome;
}

}  // namespace

void InlineRunner::run_claimed_here(TaskStateBase* s, bool drop_ref) noexcept {
  const InlineRun here(&c_);
  (void)c_.run_claimed(t_current.core == &c_ ? t_current.worker : nullptr, s, /*top_level=*/false,
                       drop_ref);
}

void InlineRunner::run_cell_here(Cell& cell) noexcept {
  const InlineRun here(&c_);
  try {
    if (!cell.invoke_and_destroy(static_cast<Runner*>(this))) {
      c_.count_outcome(TaskStatus::succeeded);
    }
  } catch (...) {
    c_.report_exception(TaskRef{}, std::current_exception());
    c_.count_outcome(TaskStatus::failed);
  }
}

// Runs a task state that is in `running`. `w` is the worker of this pool
// running it, or null on any other thread. Top-level runs on a worker are
// watched by the supervisor through the worker's run slot; other long runs
// register in PoolRuntime::foreign (hard shutdown) and the timer heap (their
// deadline). Returns false if the worker was abandoned meanwhile.
//
// `drop_ref`: the caller hands over its reference (the queue cell's), which
// is dropped on every way out. A plain success (no observer of finished
// tasks) publishes its outcome and drops it in one read-modify-write of the
// state's word (finish_and_release): with fork-join through Task handles
// that is one locked instruction fewer per task.
bool PoolCore::run_claimed(Worker* w, TaskStateBase* s, bool top_level, bool drop_ref) noexcept {
  struct Releaser {
    TaskStateBase* s;
    ~Releaser() {
      if (s != nullptr) s->release();
    }
  } ref{drop_ref ? s : nullptr};
  const bool watched = w != nullptr && top_level;
  RunFrame local;
  local.core = this;
  RunFrame* frame = watched ? &w->run.frame : &local;
  // Start and end times: for a long task's deadline, the handle's
  // durations (TaskClock) and observers.
  const std::int64_t enqueued = s->clock.enqueued_ns();
  const bool clocked = s->is_long || timed_ || enqueued != 0;
  const std::int64_t start = !clocked ? 0 : watched ? start_time(*w) : now_ns();
  std::int64_t deadline = 0;
  if (s->is_long && s->timeout().count() > 0) {
    deadline = saturating_add(start, s->timeout().count());
  }
  if (watched) {
    // The worker turns busy in the same step as its run slot takes `s`: a
    // hard shutdown that finds it busy finds its task too, stops it and,
    // after the grace period, decides its outcome when it writes the worker
    // off. (Busy with an empty slot, it took the run for a plain task's,
    // which the thread counts itself, and `s` was left with no outcome.)
    w->run.mu.lock();
    if (w->abandoned.load(std::memory_order_relaxed)) [[unlikely]] {
      // Written off already, as running a plain task: the worker stayed
      // busy from its previous task, and a hard shutdown's write-off came
      // after this task left the queue (its worker was preempted past the
      // grace). Nobody else will decide `s`, and the pool may be gone: `s`
      // does not run, it ends cancelled as the shutdown's stop would have
      // ended it, counted by this worker (the plain rule), and nothing of
      // the pool is touched (a ticket it holds stays taken).
      w->run.mu.unlock();
      w->counts.add(TaskStatus::cancelled);
      s->note_stop_reason(StopReason::shutdown);
      const bool finished = s->finish(TaskStatus::cancelled, Errc::cancelled);
      CREW_ASSERT(finished, "a task left the queue twice");
      (void)finished;
      return false;
    }
    w->run.task = s;
    w->run.is_long = s->is_long;
    w->run.started_ns = start;
    w->run.deadline_ns = deadline;
    frame->stop_at_ns.store(0, std::memory_order_relaxed);
    const WorkerStateChange busy = change_worker_state(*w, WorkerState::busy);
    w->run.mu.unlock();
    announce_state(*w, busy);
    if (deadline != 0) rt_->supervisor.need_by(deadline);
  } else if (s->is_long) {
    rt_->supervisor.register_foreign(s, deadline);
  }
  if (s->is_long) {
    // After the slot: this may allocate, and a stop requested meanwhile
    // (recorded by the task) reaches the new source in attach_runner.
    try {
      ready_source(*frame);
    } catch (...) {  // out of memory for the stop state: run without one
    }
  }

  if (observes(Observer::task_started)) [[unlikely]]
    rt_->observers.started(rt_->observers.event_of(s), enqueued, start);
  TaskStatus outcome = TaskStatus::succeeded;
  if (s->is_long) s->attach_runner(frame);
  try {
    TaskContext ctx;
    if (s->is_long) ctx.stop_token = frame->source.get_token();
    ctx.id = s->id;
    ctx.name = s->name();
    ctx.correlation_id = s->correlation_id();
    ctx.deadline = time_point_of(deadline);
    s->run(ctx);
  } catch (...) {
    s->error = std::current_exception();
    outcome = TaskStatus::failed;
  }
  // A long task's outcome is decided from the stop reason as it stands when
  // it detaches: a cancel() after that is told it came too late.
  const StopReason stop = s->is_long ? s->detach_runner() : s->stop_reason();
  const std::int64_t end = clocked ? now_ns() : 0;
  if (watched) {
    if (clocked) end_time(*w, end);
    w->run.mu.lock();
    const bool abandoned = w->abandoned.load(std::memory_order_relaxed);
    w->run.task = nullptr;
    w->run.is_long = false;
    w->run.started_ns = 0;
    w->run.deadline_ns = 0;
    w->run.mu.unlock();
    if (abandoned) {
      // Its outcome was decided when it was written off; whoever waits for
      // the callable itself (a group, a batch) may go on now.
      s->callable_returned();
      run_after_outcome();
      return false;
    }
  } else if (s->is_long) {
    rt_->supervisor.unregister_foreign(s);
  }
  s->clock.record(start, end);  // before the outcome is published
  if (overload_ != nullptr && enqueued != 0 && s->overload_ticket() &&
      overload_->watches_run_time()) [[unlikely]] {
    overload_->on_end(end - start);
  }

  Errc why{};
  outcome = decide(outcome, stop, deadline, end, why);
  // The outcome is this run's to publish: a write-off decides it only while
  // the worker's run slot holds the task, and that was cleared above.
  // Counted before it is published, so that a caller that saw the outcome
  // through its handle (get(), a group's or a batch's wait) sees it in
  // stats() too. Handlers and observers run after the publication (cancel()
  // waits for it, and must not wait for user code); wait_idle() still
  // returns only after they ran, as it also waits for epilogues_.
  const bool epilogue = outcome != TaskStatus::succeeded || observes(Observer::task_finished);
  if (epilogue) epilogues_.fetch_add(1, std::memory_order_seq_cst);
  if (w != nullptr) {
    w->counts.add(outcome);
  } else {
    shared_.add(outcome);
  }
  if (!epilogue && ref.s != nullptr) {
    // The reference goes with the outcome: `s` may be gone after this.
    ref.s = nullptr;
    const bool finished = s->finish_and_release(outcome, why);
    CREW_ASSERT(finished, "a run's outcome was decided by another thread");
    (void)finished;
    run_after_outcome();
    return true;
  }
  // A running shutdown's report lists the task before its outcome is
  // published: a caller that saw the outcome before the shutdown began must
  // not find the task in that shutdown's report.
  if (outcome == TaskStatus::cancelled || outcome == TaskStatus::timed_out) [[unlikely]] {
    rt_->shutdown.note_stopped(s, outcome);
  }
  const bool finished = s->finish(outcome, why);
  CREW_ASSERT(finished, "a run's outcome was decided by another thread");
  (void)finished;
  run_after_outcome();
  if (epilogue) {
    // A task nobody holds a handle to reports what its callable threw, also
    // when it counts as cancelled or timed out (it threw after its stop or
    // deadline).
    if (s->error && s->detached) report_exception(ref_of(*s), s->error);
    if (observes(Observer::task_finished)) [[unlikely]] {
      rt_->observers.finished(rt_->observers.event_of(s), outcome, enqueued, start, end);
    }
    epilogues_.fetch_sub(1, std::memory_order_seq_cst);
  }
  return true;
}

// An inline long task at a worker's top level: no task state, no
// allocation. The run slot under run.mu is what the supervisor and a hard
// shutdown see; the stop reason is kept there too.
void Worker::run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                      void* fn) noexcept {
  PoolCore& c = *run.frame.core;
  const ObserverHub& hub = c.runtime().observers;
  try {
    ready_source(run.frame);
  } catch (...) {
  }
  const std::int64_t start = start_time(*this);
  const std::int64_t deadline = timeout.count() > 0 ? saturating_add(start, timeout.count()) : 0;
  // The worker turned busy when it took the cell (handle_cell), before the
  // slot says "long": a hard shutdown in between wrote it off as running a
  // plain task, which its thread counts itself. This run then counts its
  // outcome too (the write-off did not), is stopped as the shutdown stops
  // long runs, and touches nothing of the pool, which may be gone.
  run.mu.lock();
  const bool written_off_first = abandoned.load(std::memory_order_relaxed);
  run.is_long = true;
  run.started_ns = start;
  run.deadline_ns = deadline;
  run.reason = written_off_first ? StopReason::shutdown : StopReason::none;
  run.frame.stop_at_ns.store(0, std::memory_order_relaxed);
  run.mu.unlock();
  if (written_off_first) {
    if (run.frame.source.stop_possible()) run.frame.source.request_stop();
    run.frame.poisoned = true;
  } else {
    if (deadline != 0) c.runtime().supervisor.need_by(deadline);
    if (c.observes(Observer::task_started)) [[unlikely]] {
      hub.started(hub.plain_event(true), enqueued_ns, start);
    }
  }

  TaskStatus outcome = TaskStatus::succeeded;
  std::exception_ptr error;
  try {
    TaskContext ctx;
    ctx.stop_token = run.frame.source.get_token();
    ctx.deadline = time_point_of(deadline);
    call(fn, ctx);
  } catch (...) {
    error = std::current_exception();
    outcome = TaskStatus::failed;
  }
  const std::int64_t end = now_ns();
  end_time(*this, end);
  run.mu.lock();
  const bool written_off = abandoned.load(std::memory_order_relaxed);
  const StopReason stop = run.reason;
  run.is_long = false;
  run.started_ns = 0;
  run.deadline_ns = 0;
  run.mu.unlock();
  Errc why{};
  if (written_off_first) {
    counts.add(decide(outcome, stop, deadline, end, why));
    return;
  }
  if (written_off) return;  // counted when it was written off
  outcome = decide(outcome, stop, deadline, end, why);
  // Also when the task counts as cancelled or timed out (it threw after its
  // stop or deadline): nobody holds a handle that could carry the exception.
  if (error) c.report_exception(TaskRef{}, error);
  if (c.observes(Observer::task_finished)) [[unlikely]] {
    hub.finished(hub.plain_event(true), outcome, enqueued_ns, start, end);
  }
  counts.add(outcome);
}

void Worker::run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept {
  PoolCore& c = *run.frame.core;
  const ObserverHub& hub = c.runtime().observers;
  const std::int64_t start = start_time(*this);
  if (c.observes(Observer::task_started)) hub.started(hub.plain_event(false), enqueued_ns, start);
  TaskStatus outcome = TaskStatus::succeeded;
  try {
    call(fn);
  } catch (...) {
    if (may_call_user()) c.report_exception(TaskRef{}, std::current_exception());
    outcome = TaskStatus::failed;
  }
  const std::int64_t end = now_ns();
  end_time(*this, end);
  if (c.observes(Observer::task_finished) && may_call_user()) {
    hub.finished(hub.plain_event(false), outcome, enqueued_ns, start, end);
  }
  counts.add(outcome);
}

namespace {

// Times the run of an admitted plain task for the run-time signal, when it
// is on and the task's wait is timed (OverloadControl::on_end).
class RunTimer {
 public:
  RunTimer(OverloadControl& ctl, std::int64_t enqueued_ns) noexcept
      : ctl_(ctl), start_(enqueued_ns != 0 && ctl.watches_run_time() ? now_ns() : 0) {}
  ~RunTimer() {
    if (start_ != 0) ctl_.on_end(now_ns() - start_);
  }
  RunTimer(const RunTimer&) = delete;
  RunTimer& operator=(const RunTimer&) = delete;

 private:
  OverloadControl& ctl_;
  const std::int64_t start_;
};

}  // namespace

void Worker::run_admitted(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept {
  PoolCore& c = *run.frame.core;
  if (c.runtime().shedding.shed_admitted(enqueued_ns)) [[unlikely]] {
    counts.add(TaskStatus::shed);
    return;  // the cell destroys the callable unrun
  }
  const RunTimer timer(*c.overload(), enqueued_ns);
  try {
    call(fn);
    counts.add(TaskStatus::succeeded);
  } catch (...) {
    if (may_call_user()) c.report_exception(TaskRef{}, std::current_exception());
    counts.add(TaskStatus::failed);
  }
}

namespace {

// Runs a LongCall as a task state: for inline long tasks that end up on a
// thread other than a worker's top level.
class CallState final : public ResultStateBase<void> {
 public:
  CallState(LongCall call, void* fn) noexcept : call_(call), fn_(fn) {}
  void run(const TaskContext& ctx) override { call_(fn_, ctx); }

 private:
  LongCall call_;
  void* fn_;
};

}  // namespace

void InlineRunner::run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns,
                            LongCall call, void* fn) noexcept {
  CallState* s = nullptr;
  try {
    auto x = std::make_unique<TaskStateBase::Extras>();  // a long task's: its runner link
    x->timeout = timeout;
    s = new CallState(call, fn);
    s->adopt_extras(std::move(x));
  } catch (...) {
    c_.count_outcome(TaskStatus::failed);
    c_.report_exception(TaskRef{}, std::current_exception());
    return;
  }
  s->id = c_.new_task_id();
  s->owner = &c_;
  s->is_long = true;
  s->detached = true;
  if (enqueued_ns != 0) s->clock.set_enqueued(enqueued_ns);
  s->leave_queue(TaskStatus::running);
  run_claimed_here(s, /*drop_ref=*/true);
}

void InlineRunner::run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept {
  const InlineRun here(&c_);
  const std::int64_t start = now_ns();
  if (c_.observes(Observer::task_started))
    c_.rt_->observers.started(c_.rt_->observers.plain_event(false), enqueued_ns, start);
  TaskStatus outcome = TaskStatus::succeeded;
  try {
    call(fn);
  } catch (...) {
    c_.report_exception(TaskRef{}, std::current_exception());
    outcome = TaskStatus::failed;
  }
  if (c_.observes(Observer::task_finished)) {
    c_.rt_->observers.finished(c_.rt_->observers.plain_event(false), outcome, enqueued_ns, start,
                               now_ns());
  }
  c_.count_outcome(outcome);
}

void InlineRunner::run_admitted(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept {
  const InlineRun here(&c_);
  if (c_.runtime().shedding.shed_admitted(enqueued_ns)) [[unlikely]] {
    c_.count_outcome(TaskStatus::shed);
    return;
  }
  const RunTimer timer(*c_.overload(), enqueued_ns);
  try {
    call(fn);
    c_.count_outcome(TaskStatus::succeeded);
  } catch (...) {
    c_.report_exception(TaskRef{}, std::current_exception());
    c_.count_outcome(TaskStatus::failed);
  }
}

bool prepare_stop_locked(Worker& w, StopReason why, StopTarget& out) noexcept {
  if (!w.run.is_long) return false;
  out.reason = why;
  if (w.run.task != nullptr) {
    w.run.task->add_ref();
    out.task = w.run.task;  // request_stop stops the token and wakes the supervisor
    // The reason and the grace period count from now, not from when the
    // stopper gets to the request: a slow stop callback of another task
    // must not defer or change the write-off of this one.
    w.run.task->note_stop_reason(why);
    std::int64_t unset = 0;
    w.run.frame.stop_at_ns.compare_exchange_strong(unset, now_ns(), std::memory_order_acq_rel);
    return true;
  }
  if (w.run.reason == StopReason::none) w.run.reason = why;
  w.run.frame.poisoned = true;
  std::int64_t unset = 0;
  w.run.frame.stop_at_ns.compare_exchange_strong(unset, now_ns(), std::memory_order_acq_rel);
  out.source = w.run.frame.source;
  return true;
}

}  // namespace crew::detail
