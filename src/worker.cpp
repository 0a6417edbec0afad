// The worker threads: the loop that pops and runs cells, spinning and
// sleeping when there is nothing to do, and running task states (long tasks
// with their stop tokens and deadlines, handles, names).
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "control.hpp"
#include "crew/detail/futex.hpp"

namespace crew::detail {
namespace {

// "<pool name>-<worker id>", cut to the 15 bytes Linux keeps, id preserved.
void name_this_thread(const std::string& pool, std::uint64_t id) noexcept {
  const std::string suffix = "-" + std::to_string(id);
  std::string name = pool.substr(0, suffix.size() < 15 ? 15 - suffix.size() : 0) + suffix;
  if (name.size() > 15) name.resize(15);
  pthread_setname_np(pthread_self(), name.c_str());
}

std::chrono::steady_clock::time_point time_point_of(std::int64_t ns) noexcept {
  return ns == 0 ? TaskStateBase::kNoDeadline
                 : std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

// Retires one worker if more than `floor` are live.
bool try_retire(std::atomic<std::size_t>& live, std::size_t floor) noexcept {
  std::size_t n = live.load(std::memory_order_relaxed);
  while (n > floor) {
    if (live.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

}  // namespace

void Core::count_here(TaskStatus outcome) noexcept {
  if (t_current.core == this) {
    t_current.worker->counts.add(outcome);
  } else {
    shared_.add(outcome);
  }
}

void Core::worker_thread(std::shared_ptr<Core> self, std::shared_ptr<Worker> w, bool spinning,
                         bool replacement) {
  Core& c = *self;
  name_this_thread(c.opts_.name, w->id);
  bool started = true;
  if (spinning && c.opts_.on_worker_start) {
    // The hook is user code and may take long: while this worker holds the
    // spinning token no submission wakes or starts another, so hand it back
    // first, and let whatever is queued bring in a worker now.
    c.spinning_.fetch_sub(1, std::memory_order_seq_cst);
    spinning = false;
    if (!c.queue_.empty()) c.after_push();
  }
  if (c.opts_.on_worker_start) {
    try {
      c.opts_.on_worker_start(w->id);
    } catch (...) {
      started = false;
      if (w->may_call_user()) c.log_hook_failure("on_worker_start", w->id, std::current_exception());
    }
  }
  // Written off while in its start hook (it hung there through a hard
  // shutdown's last grace period): it is off the books and must not serve
  // tasks. abandon_busy reads the state and writes off under cur_mu.
  bool written_off = false;
  if (started) {
    w->cur_mu.lock();
    written_off = w->abandoned.load(std::memory_order_acquire);
    if (!written_off) set_worker_state(*w, WorkerState::idle);
    w->cur_mu.unlock();
  }
  Exit how = written_off ? Exit::abandoned : Exit::leave;
  if (started && !written_off) {
    c.emit_worker(WorkerEvent::started, w->id);
    if (replacement) c.emit_worker(WorkerEvent::replaced, w->id);
    LocalQueues& locals = c.queue_.locals();
    // Pools with priority levels keep every task in the shared queue, where
    // the levels are.
    if (c.queue_.levels() == 1) {
      try {
        w->pop.local = locals.claim();
      } catch (...) {  // out of memory for the queue: submit to the shared one
      }
    }
    t_current = {&c, w.get(), w->pop.local};
    how = c.work_loop(*w, spinning);
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
    if (!written_off) set_worker_state(*w, WorkerState::stopping);
    if (spinning) c.spinning_.fetch_sub(1, std::memory_order_seq_cst);
  }
  c.worker_exited(w, how, /*died=*/!started);
  // A worker stopped or retired between tasks leaves while tasks may be
  // queued that submitters did not start a worker for (it still counted as
  // live then): now that it is off the books, bring in one if needed.
  if (started && how != Exit::abandoned && c.state() == PoolState::running && !c.queue_.empty()) {
    c.after_push();
  }
}

void Core::worker_exited(const std::shared_ptr<Worker>& w, Exit how, bool died) noexcept {
  Control& ctl = *ctl_;
  {
    // A waker that popped this worker from the idle stack may still be
    // inside futex_wake on its word: wait for it before the memory can go.
    MutexLock idle_lock(ctl.idle_mu);
  }
  bool written_off = false;
  bool last = false;
  {
    MutexLock lock(ctl.mu);
    add_to(ctl.retired, w->counts.read());
    ctl.retired_helped += w->helped.get();
    // `abandoned` is set under this mutex, so this check cannot race a
    // write-off: a written-off worker is off the books already.
    if (w->abandoned.load(std::memory_order_acquire)) {
      written_off = true;
      std::erase(ctl.abandoned, w);
    } else {
      if (how != Exit::counted) live_workers_.fetch_sub(1, std::memory_order_relaxed);
      set_worker_state(*w, WorkerState::stopped);
      std::erase(ctl.workers, w);
      last = ctl.workers.empty();
      ctl.exited.push_back(w);
      if (died) {
        ++ctl.replacements_due;
        ctl.replace_backoff = std::clamp<std::chrono::nanoseconds>(
            ctl.replace_backoff * 2, std::chrono::milliseconds(1), std::chrono::seconds(1));
        ctl.next_replace_ns = now_ns() + ctl.replace_backoff.count();
      }
    }
  }
  if (!written_off) {
    if (!died) emit_worker(WorkerEvent::stopped, w->id);
    if (last) ctl.workers_changed.notify_all();  // a shutdown waits for the last one
    wake_supervisor();                           // joins the thread, replaces a dead worker
  }
}

// `spinning`: this worker holds a spinning token (handed over by whoever
// started or woke it for queued work).
Core::Exit Core::work_loop(Worker& w, bool spinning) {
  Cell cell;
  Exit how = Exit::leave;
  w.seen_attention = attention_.load(std::memory_order_acquire);
  set_worker_state(w, WorkerState::idle);
  for (;;) {
    if (!spinning) {
      if (attention_.load(std::memory_order_relaxed) != w.seen_attention) [[unlikely]] {
        if (attend(w, how)) break;
      }
      if (queue_.try_pop(cell, w.pop)) {
        if (!handle_cell(w, cell)) return Exit::abandoned;
        continue;
      }
      if (state_.load(std::memory_order_acquire) >= PoolState::stopping) break;
    }
    const bool found = spin_for_work(w, cell, spinning);
    spinning = false;
    if (found) {
      if (!handle_cell(w, cell)) return Exit::abandoned;
      continue;
    }
    const Slept slept = sleep_for_work(w);
    if (slept == Slept::retired) {
      how = Exit::counted;
      break;
    }
    spinning = slept == Slept::woken_spinning;
  }
  set_worker_state(w, WorkerState::stopping);
  return how;
}

// Something besides the queue changed. Returns true if this worker must
// exit, with `how` saying whether it already left live_workers_.
bool Core::attend(Worker& w, Exit& how) {
  for (;;) {
    w.seen_attention = attention_.load(std::memory_order_acquire);
    if (w.exit_requested.load(std::memory_order_acquire)) {
      how = Exit::leave;
      return true;
    }
    const PoolState st = state_.load(std::memory_order_acquire);
    if (st == PoolState::paused) {
      set_worker_state(w, WorkerState::idle);
      MutexLock lock(ctl_->mu);
      while (attention_.load(std::memory_order_acquire) == w.seen_attention) {
        ctl_->workers_changed.wait(lock.native());
      }
      continue;
    }
    const std::size_t max = max_workers_.load(std::memory_order_relaxed);
    if (st == PoolState::running && live_workers_.load(std::memory_order_relaxed) > max &&
        try_retire(live_workers_, max)) {
      how = Exit::counted;
      return true;
    }
    return false;
  }
}

namespace {

// Workers spinning in all pools of the process, and how many may: about
// half the hardware threads, so that several pools (crewd has three) never
// spin more cores than one pool would, and the other half is left to the
// threads that submit.
std::atomic<int> g_spinners{0};
int spinner_limit() noexcept {
  static const int limit = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
  return limit;
}

// A process-wide spinning slot, or false if every slot is taken.
bool take_spinner_slot() noexcept {
  int n = g_spinners.load(std::memory_order_relaxed);
  while (n < spinner_limit()) {
    if (g_spinners.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

}  // namespace

// Polls the queues for opts_.spin. Always gives up the spinning token.
//
// The wake-up policy, after Go's scheduler: a submitter wakes a sleeper
// only when no worker of the pool holds a spinning token (a spinner, or a
// worker woken or started to become one); the last spinner to find work
// wakes another if more is queued, before it runs its task. A spinner polls
// without giving its core away (a yield could cost a whole time slice while
// a task waits, and submitters do not wake anyone while it spins), and at
// most spinner_limit() workers spin in the whole process; a worker that
// finds every slot taken goes to sleep after one look at the queues.
bool Core::spin_for_work(Worker& w, Cell& cell, bool already_spinning) noexcept {
  if (!already_spinning) spinning_.fetch_add(1, std::memory_order_seq_cst);
  set_worker_state(w, WorkerState::idle);
  w.clock_ns = 0;  // the next run waited: read the clock afresh
  const bool slot = opts_.spin.count() != 0 && take_spinner_slot();
  const std::int64_t until = slot ? saturating_add(now_ns(), opts_.spin.count()) : 0;
  bool found = false;
  for (unsigned i = 0;; ++i) {
    if (queue_.try_pop(cell, w.pop)) {
      found = true;
      break;
    }
    if (!slot || attention_.load(std::memory_order_relaxed) != w.seen_attention ||
        state_.load(std::memory_order_relaxed) >= PoolState::stopping) {
      break;
    }
    if ((i & 15) == 15 && now_ns() >= until) break;
    for (int k = 0; k < 8; ++k) cpu_relax();
  }
  if (slot) g_spinners.fetch_sub(1, std::memory_order_relaxed);
  // The last spinner to find work brings in help if more is queued (a
  // sleeper, else a new worker): a burst ramps up with one wake-up per
  // worker, and a submitter that saw this spinner is never left alone.
  if (spinning_.fetch_sub(1, std::memory_order_seq_cst) == 1 && found && !queue_.empty()) {
    if (sleepers_.load(std::memory_order_seq_cst) != 0) {
      wake_sleeper();
    } else if (live_workers_.load(std::memory_order_relaxed) <
                   max_workers_.load(std::memory_order_relaxed) &&
               state_.load(std::memory_order_relaxed) == PoolState::running) {
      grow();
    }
  }
  return found;
}

void Core::wake_sleeper() noexcept {
  Control& ctl = *ctl_;
  MutexLock lock(ctl.idle_mu);
  if (ctl.idle.empty()) return;
  Worker* w = ctl.idle.back();
  ctl.idle.pop_back();
  w->in_idle_stack = false;
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  spinning_.fetch_add(1, std::memory_order_seq_cst);  // handed to the woken worker
  w->wake_word.fetch_add(1, std::memory_order_release);
  futex_wake(w->wake_word, 1);
}

// Wakes every sleeper at once. Callers change what sleepers re-check (state,
// attention) before calling, so a worker that goes to sleep afterwards sees
// the change and does not stay asleep.
void Core::wake_all_sleepers() noexcept {
  Control& ctl = *ctl_;
  MutexLock lock(ctl.idle_mu);
  for (Worker* w : ctl.idle) {
    w->in_idle_stack = false;
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    spinning_.fetch_add(1, std::memory_order_seq_cst);  // handed to the woken worker
    w->wake_word.fetch_add(1, std::memory_order_release);
    futex_wake(w->wake_word, 1);
  }
  ctl.idle.clear();
}

// Takes this worker out of the idle stack. False if a waker popped it first
// (and so handed it a spinning token).
bool Core::leave_idle_stack(Worker& w) noexcept {
  MutexLock lock(ctl_->idle_mu);
  if (!w.in_idle_stack) return false;
  std::erase(ctl_->idle, &w);
  w.in_idle_stack = false;
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  return true;
}

// Holds the worker (and the cell it popped) while the pool is paused.
// resume() and shutdown() change the state under ctl.mu and notify.
void Core::wait_out_pause(Worker& w) {
  set_worker_state(w, WorkerState::idle);
  MutexLock lock(ctl_->mu);
  while (state_.load(std::memory_order_acquire) == PoolState::paused) {
    ctl_->workers_changed.wait(lock.native());
  }
}

Core::Slept Core::sleep_for_work(Worker& w) noexcept {
  const std::uint32_t key = w.wake_word.load(std::memory_order_acquire);
  set_worker_state(w, WorkerState::idle);
  {
    MutexLock lock(ctl_->idle_mu);
    ctl_->idle.push_back(&w);
    w.in_idle_stack = true;
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
  }
  // After announcing ourselves (seq_cst), re-check: a submitter that pushed
  // before it could see us has published its task by now.
  auto must_wake = [&] {
    return !queue_.empty() || attention_.load(std::memory_order_acquire) != w.seen_attention ||
           state_.load(std::memory_order_seq_cst) >= PoolState::stopping;
  };
  if (must_wake()) return leave_idle_stack(w) ? Slept::woken : Slept::woken_spinning;
  for (;;) {
    const bool may_expire = live_workers_.load(std::memory_order_relaxed) > opts_.min_workers;
    const std::int64_t deadline =
        may_expire ? saturating_add(now_ns(), opts_.idle_timeout.count()) : 0;
    futex_wait(w.wake_word, key, time_point_of(deadline));
    if (w.wake_word.load(std::memory_order_acquire) != key) return Slept::woken_spinning;
    if (must_wake()) return leave_idle_stack(w) ? Slept::woken : Slept::woken_spinning;
    if (may_expire && now_ns() >= deadline) {
      if (!leave_idle_stack(w)) return Slept::woken_spinning;
      if (try_retire(live_workers_, opts_.min_workers)) return Slept::retired;
      return Slept::woken;  // needed after all: the minimum would be crossed
    }
  }
}

// Returns false if the worker was abandoned while running the cell.
bool Core::handle_cell(Worker& w, Cell& cell) {
  on_slot_freed();
  // A task pushed after pause() returned is seen here as paused (its push
  // happened after the state change, its pop before this load), so it is
  // held until resume() or a shutdown, and handled then as any queued task.
  if (state_.load(std::memory_order_acquire) == PoolState::paused) [[unlikely]] {
    wait_out_pause(w);
  }
  TaskStateBase* s = cell.state();
  if (s != nullptr) return handle_state(w, s);
  if (drop_queued_.load(std::memory_order_relaxed)) [[unlikely]] {
    cell.destroy();
    w.counts.rejected.inc();
    note_dropped(nullptr);
    return true;
  }
  set_worker_state(w, WorkerState::busy);
  w.task_seq.store(w.task_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  try {
    if (!cell.invoke_and_destroy(&w)) w.counts.succeeded.inc();
  } catch (...) {
    // Reported before it is counted: wait_idle() returns only after handlers ran.
    if (w.may_call_user()) report_exception(TaskRef{}, std::current_exception());
    w.counts.failed.inc();
  }
  return !w.abandoned.load(std::memory_order_acquire);
}

bool Core::handle_state(Worker& w, TaskStateBase* s) {
  bool keep_going = true;
  if (drop_queued_.load(std::memory_order_relaxed) &&
      s->leave_queue(TaskStatus::rejected, Errc::shutdown_dropped)) [[unlikely]] {
    if (s->queue_deadline != TaskStateBase::kNoDeadline) disarm_queue_deadline(s);
    w.counts.rejected.inc();
    note_dropped(s);
  } else if (!s->leave_queue(TaskStatus::running)) {
    // Decided while queued (cancelled, expired): counted here, once. A task
    // run by a waiting worker (ran()) was counted by that worker.
    if (!s->ran()) {
      emit_settled_in_queue(s);
      w.counts.add(s->status());
    }
  } else {
    if (s->queue_deadline != TaskStateBase::kNoDeadline) disarm_queue_deadline(s);
    set_worker_state(w, WorkerState::busy);
    w.task_seq.store(w.task_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    keep_going = run_claimed(&w, s, /*top_level=*/true);
  }
  s->release();
  return keep_going;
}

namespace {

// The start time of a long run on `w`: the end of the previous run when this
// one follows it directly, else the clock.
std::int64_t start_time(Worker& w) noexcept {
  if (w.clock_ns != 0 && w.clock_seq + 1 == w.task_seq.load(std::memory_order_relaxed)) {
    return w.clock_ns;
  }
  return now_ns();
}

void end_time(Worker& w, std::int64_t end) noexcept {
  w.clock_ns = end;
  w.clock_seq = w.task_seq.load(std::memory_order_relaxed);
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

void Core::run_claimed_here(TaskStateBase* s) noexcept {
  const InlineRun here(this);
  (void)run_claimed(t_current.core == this ? t_current.worker : nullptr, s, /*top_level=*/false);
}

// Runs a task state that is in `running`. `w` is the worker of this pool
// running it, or null on any other thread. Top-level runs on a worker are
// watched by the supervisor through the worker's run slot; other long runs
// register in Control::foreign (hard shutdown) and the timer heap (their
// deadline). Returns false if the worker was abandoned meanwhile.
bool Core::run_claimed(Worker* w, TaskStateBase* s, bool top_level) noexcept {
  const bool watched = w != nullptr && top_level;
  RunFrame local;
  local.core = this;
  RunFrame* frame = watched ? &w->frame : &local;
  const bool clocked = s->is_long || timed_;  // needs start and end times
  const std::int64_t start = !clocked ? 0 : watched ? start_time(*w) : now_ns();
  std::int64_t deadline = 0;
  if (s->is_long) {
    try {
      ready_source(*frame);
    } catch (...) {  // out of memory for the stop state: run without one
    }
    if (s->timeout.count() > 0) deadline = saturating_add(start, s->timeout.count());
  }
  if (watched) {
    w->cur_mu.lock();
    w->cur_task = s;
    w->cur_long = s->is_long;
    w->cur_started_ns = start;
    w->cur_deadline_ns = deadline;
    frame->stop_at_ns.store(0, std::memory_order_relaxed);
    w->cur_mu.unlock();
    if (deadline != 0) {
      const std::int64_t next = sup_next_wake_.load(std::memory_order_seq_cst);
      if (next == 0 || deadline < next) wake_supervisor();
    }
  } else if (s->is_long) {
    register_foreign(s, deadline);
  }

  if (observes(Observer::task_started)) [[unlikely]]
    emit_started(event_of(s), s->enqueued_ns, start);
  TaskStatus outcome = TaskStatus::succeeded;
  if (s->is_long) s->attach_runner(frame);
  try {
    TaskContext ctx;
    if (s->is_long) ctx.stop_token = frame->source.get_token();
    ctx.id = s->id;
    ctx.name = s->name;
    ctx.deadline = time_point_of(deadline);
    s->run(ctx);
  } catch (...) {
    s->error = std::current_exception();
    outcome = TaskStatus::failed;
  }
  if (s->is_long) s->detach_runner();
  const std::int64_t end = clocked ? now_ns() : 0;
  if (watched) {
    if (clocked) end_time(*w, end);
    w->cur_mu.lock();
    const bool abandoned = w->abandoned.load(std::memory_order_relaxed);
    w->cur_task = nullptr;
    w->cur_long = false;
    w->cur_started_ns = 0;
    w->cur_deadline_ns = 0;
    w->cur_mu.unlock();
    if (abandoned) {
      // Its outcome was decided when it was written off; whoever waits for
      // the callable itself (a group, a batch) may go on now.
      s->callable_returned();
      return false;
    }
  } else if (s->is_long) {
    unregister_foreign(s);
  }

  Errc why{};
  outcome = decide(outcome, s->stop_reason(), deadline, end, why);
  if (!s->finish(outcome, why)) return true;  // cannot happen off the top level
  if (outcome == TaskStatus::failed && s->detached) {
    report_exception(TaskRef{s->id, s->name}, s->error);
  }
  if (outcome == TaskStatus::cancelled || outcome == TaskStatus::timed_out)
    note_stopped(s, outcome);
  if (observes(Observer::task_finished)) [[unlikely]] {
    emit_finished(event_of(s), outcome, s->enqueued_ns, start, end);
  }
  // Counted last: wait_idle() returns only after handlers and observers ran.
  if (w != nullptr) {
    w->counts.add(outcome);
  } else {
    shared_.add(outcome);
  }
  return true;
}

// An inline long task at a worker's top level: no task state, no
// allocation. The run slot under cur_mu is what the supervisor and a hard
// shutdown see; the stop reason is kept there too.
void Worker::run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                      void* fn) noexcept {
  Core& c = *frame.core;
  try {
    ready_source(frame);
  } catch (...) {
  }
  const std::int64_t start = start_time(*this);
  const std::int64_t deadline = timeout.count() > 0 ? saturating_add(start, timeout.count()) : 0;
  cur_mu.lock();
  cur_long = true;
  cur_started_ns = start;
  cur_deadline_ns = deadline;
  cur_reason = StopReason::none;
  frame.stop_at_ns.store(0, std::memory_order_relaxed);
  cur_mu.unlock();
  if (deadline != 0) {
    const std::int64_t next = c.sup_next_wake_.load(std::memory_order_seq_cst);
    if (next == 0 || deadline < next) c.wake_supervisor();
  }
  if (c.observes(Observer::task_started)) [[unlikely]] {
    c.emit_started(c.plain_event(true), enqueued_ns, start);
  }

  TaskStatus outcome = TaskStatus::succeeded;
  std::exception_ptr error;
  try {
    TaskContext ctx;
    ctx.stop_token = frame.source.get_token();
    ctx.deadline = time_point_of(deadline);
    call(fn, ctx);
  } catch (...) {
    error = std::current_exception();
    outcome = TaskStatus::failed;
  }
  const std::int64_t end = now_ns();
  end_time(*this, end);
  cur_mu.lock();
  const bool written_off = abandoned.load(std::memory_order_relaxed);
  const StopReason stop = cur_reason;
  cur_long = false;
  cur_started_ns = 0;
  cur_deadline_ns = 0;
  cur_mu.unlock();
  if (written_off) return;  // counted when it was written off
  Errc why{};
  outcome = decide(outcome, stop, deadline, end, why);
  if (outcome == TaskStatus::failed) c.report_exception(TaskRef{}, error);
  if (c.observes(Observer::task_finished)) [[unlikely]] {
    c.emit_finished(c.plain_event(true), outcome, enqueued_ns, start, end);
  }
  counts.add(outcome);
}

void Worker::run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept {
  Core& c = *frame.core;
  const std::int64_t start = start_time(*this);
  if (c.observes(Observer::task_started)) c.emit_started(c.plain_event(false), enqueued_ns, start);
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
    c.emit_finished(c.plain_event(false), outcome, enqueued_ns, start, end);
  }
  counts.add(outcome);
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

void Core::run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                    void* fn) noexcept {
  CallState* s = nullptr;
  try {
    s = new CallState(call, fn);
  } catch (...) {
    count_here(TaskStatus::failed);
    report_exception(TaskRef{}, std::current_exception());
    return;
  }
  s->id = new_task_id();
  s->owner = this;
  s->is_long = true;
  s->detached = true;
  s->timeout = timeout;
  s->enqueued_ns = enqueued_ns;
  s->leave_queue(TaskStatus::running);
  run_claimed_here(s);
  s->release();
}

void Core::run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept {
  const InlineRun here(this);
  const std::int64_t start = now_ns();
  if (observes(Observer::task_started)) emit_started(plain_event(false), enqueued_ns, start);
  TaskStatus outcome = TaskStatus::succeeded;
  try {
    call(fn);
  } catch (...) {
    report_exception(TaskRef{}, std::current_exception());
    outcome = TaskStatus::failed;
  }
  if (observes(Observer::task_finished)) {
    emit_finished(plain_event(false), outcome, enqueued_ns, start, now_ns());
  }
  count_here(outcome);
}

// Under w.cur_mu: prepares a stop of the worker's current top-level long
// run. False if there is none.
bool Core::prepare_stop_locked(Worker& w, StopReason why, StopTarget& out) noexcept {
  w.cur_mu.assert_held();
  if (!w.cur_long) return false;
  out.reason = why;
  if (w.cur_task != nullptr) {
    w.cur_task->add_ref();
    out.task = w.cur_task;  // request_stop records the time and wakes the supervisor
    return true;
  }
  if (w.cur_reason == StopReason::none) w.cur_reason = why;
  w.frame.poisoned = true;
  std::int64_t unset = 0;
  w.frame.stop_at_ns.compare_exchange_strong(unset, now_ns(), std::memory_order_acq_rel);
  out.source = w.frame.source;
  return true;
}

void StopTarget::fire() noexcept {
  if (task != nullptr) {
    task->request_stop(reason);
    task->release();
    task = nullptr;
  } else if (source.stop_possible()) {
    source.request_stop();
  }
}

}  // namespace crew::detail

namespace crew::detail {
namespace {

// The calling thread's stack, found once per thread.
struct StackBounds {
  std::uintptr_t low = 0;
  std::uintptr_t high = 0;
};
thread_local StackBounds t_stack{};

StackBounds this_stack() noexcept {
  if (t_stack.high == 0) {
    pthread_attr_t attr;
    void* addr = nullptr;
    std::size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      (void)pthread_attr_getstack(&attr, &addr, &size);
      pthread_attr_destroy(&attr);
    }
    const auto low = reinterpret_cast<std::uintptr_t>(addr);
    t_stack = size == 0 ? StackBounds{1, 1} : StackBounds{low, low + size};
  }
  return t_stack;
}

}  // namespace

// Taking a task that is not the caller's own (the shared queue, another
// worker's queue) nests a task of unknown depth on this stack; it is allowed
// while at most 1/kForeignHelpShare of the stack is in use. Own tasks are
// always taken: their nesting follows the program's recursion.
bool stack_allows_help() noexcept {
  constexpr std::uintptr_t kForeignHelpShare = 16;
  const StackBounds b = this_stack();
  if (b.high == b.low) return true;  // unknown: as before
  const char here = 0;
  const auto sp = reinterpret_cast<std::uintptr_t>(&here);
  return sp > b.low && (b.high - sp) * kForeignHelpShare <= b.high - b.low;
}

bool Core::run_pending() { return help_once(/*own=*/true, /*foreign=*/true); }

bool Core::help_once(bool own, bool foreign) {
  if (state() == PoolState::paused) return false;
  Cell cell;
  Worker* w = t_current.core == this ? t_current.worker : nullptr;
  if (w != nullptr) {
    if (!(own && queue_.pop_own(cell, w->pop)) &&
        !(foreign && stack_allows_help() && queue_.pop_foreign(cell, w->pop))) {
      return false;
    }
    w->helped.inc();
  } else {
    if (!foreign || !stack_allows_help() || !queue_.try_pop(cell)) return false;
    helped_.fetch_add(1, std::memory_order_relaxed);
  }
  on_slot_freed();
  settle_popped_here(cell);
  return true;
}

bool Core::help_until(TaskStateBase* s, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  Clock::duration nap = std::chrono::microseconds(50);
  while (!s->done()) {
    // Own newest tasks first: most often `s` and its siblings are among them.
    if (help_once(/*own=*/true, /*foreign=*/false)) continue;
    if (s->leave_queue(TaskStatus::running)) {
      if (s->queue_deadline != TaskStateBase::kNoDeadline) disarm_queue_deadline(s);
      run_claimed_here(s);
      return true;
    }
    if (help_once(/*own=*/false, /*foreign=*/true)) {
      nap = std::chrono::microseconds(50);
      continue;
    }
    // It runs elsewhere (stolen, or nested in another wait): sleep on it in
    // short naps, then look for work again (its children may queue here).
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    (void)s->wait_until(deadline - now > nap ? now + nap : deadline);
    nap = std::min<Clock::duration>(nap * 2, std::chrono::milliseconds(1));
  }
  return true;
}

bool is_worker_of(const TaskStateBase* s) noexcept {
  return t_current.core != nullptr && t_current.core == s->owner;
}

int wait_as_worker(TaskStateBase* s, std::chrono::steady_clock::time_point deadline) {
  if (!is_worker_of(s)) return -1;
  return t_current.core->help_until(s, deadline) ? 1 : 0;
}

}  // namespace crew::detail
