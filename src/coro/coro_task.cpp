// The coroutine side of a coroutine task: spawn, the steps, suspension and
// wake-ups, the end (crew/detail/coro_task.hpp describes the life).
#include "crew/detail/coro_task.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>

#include "coro_hub.hpp"
#include "crew/coro.hpp"
#include "crew/detail/clock.hpp"
#include "crew/detail/overload_control.hpp"
#include "crew/detail/task_events.hpp"
#include "crew/observer.hpp"
#include "run_frame.hpp"

namespace crew {

namespace {
// The task whose step runs on this thread (see current_coro_task()).
thread_local detail::CoroTaskBase* t_coro = nullptr;

// Sets t_coro for the length of a step; steps nest when a start runs on
// the caller (caller_runs, or a worker of the pool with full queues).
struct StepScope {
  detail::CoroTaskBase* outer;
  explicit StepScope(detail::CoroTaskBase* t) noexcept : outer(std::exchange(t_coro, t)) {}
  ~StepScope() { t_coro = outer; }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
};
}  // namespace

std::stop_token current_stop_token() noexcept {
  detail::CoroTaskBase* t = t_coro;
  return t != nullptr ? t->stop_token() : std::stop_token{};
}

namespace detail {

CoroTaskBase* current_coro_task() noexcept { return t_coro; }

void run_frame(CoroTaskBase* t, std::coroutine_handle<> h) noexcept {
  const StepScope scope(t);
  h.resume();  // the task may have ended: only the step's reference keeps it
}

void throw_wait_in_fork(const char* what) {
  throw Error(Errc::wait_in_fork,
              std::string(what) +
                  ": in a forked child (crew::fork), which cannot suspend its task; "
                  "spawn a coroutine task for work that waits");
}

void CoroTaskBase::on_stopped() noexcept {
  // The token's callbacks and the children first, as a stop source runs
  // them: a callback that cancels an operation outside crew (on_callback)
  // runs before the coroutine can resume and destroy it.
  stop_.stop();
  // Pairs with the fence after arming (finish_arming): either this sees
  // the task armed, or the task sees the stop.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::uint64_t gen = suspension_.armed_gen();
  if (gen != 0 && suspension_.stoppable()) (void)fire(gen, Wake::stop);
}

void CoroTaskBase::setup(PoolCore& core, TaskOptions&& opts, bool detached, CoroTaskBase* parent) {
  TaskStateBase& s = state();
  auto x = std::make_unique<TaskStateBase::Extras>();
  x->name = std::move(opts.name);
  x->correlation_id = std::move(opts.correlation_id);
  timeout_ = opts.timeout.count() != 0 ? opts.timeout : core.options().task_timeout;
  x->timeout = timeout_;
  if (opts.queue_timeout.count() != 0) {
    queue_deadline_ns_ = saturating_add(now_ns(), opts.queue_timeout.count());
  }
  // The task's runner for its whole life (set before the state is shared,
  // as attach_runner would): a stop after its end is too late.
  x->runner = &frame_;
  s.adopt_extras(std::move(x));
  s.id = Submission(core).task_id();
  // The owner lets a wait for the task on a worker of the pool run the
  // pool's tasks meanwhile (Task::wait), the task's own steps among them.
  s.owner = &core;
  s.detached = detached;
  s.set_level(opts.priority);
  core_ = &core;
  level_ = opts.priority;
  hub_ = &CoroHub::of(core);
  // The hub's reference and the start's (launch() hands them over), taken
  // while nothing else can see the state: linking to the parent shares it.
  s.add_ref_unshared();
  s.add_ref_unshared();
  // Linked to a parent of the same pool, the task is found through the
  // parent's list: no entry in the hub's registry of its own
  // (CoroStop::hand_off). A task of another pool is in its own pool's hub.
  from_coroutine_ = parent != nullptr;
  const bool linked = stop_.link(*this, s, parent != nullptr ? &parent->stop_ : nullptr);
  in_parent_ = linked && parent->core_ == core_;
}

Admission CoroTaskBase::launch(bool may_block, bool wait_for_room) {
  TaskStateBase& s = state();
  Submission submission(*core_);
  Admission a = Admission::accepted;
  bool queued = false;
  // The admission, once (a spawn that waits for room comes back here).
  if (!admitted_) {
    admitted_ = true;
    if (submission.clocks(s)) s.clock.set_enqueued(now_ns());
    // From outside the pool with the overload controller on and admitting
    // coroutine tasks: a ticket first (crew/detail/coro_task.hpp, "The
    // overload controller").
    if (core_->admits_here() && core_->options().overload.admit_coroutines &&
        core_->state() < PoolState::stopping) {
      OverloadReason why = OverloadReason::none;
      const std::int64_t now = now_ns();
      const std::int64_t queue_timeout =
          queue_deadline_ns_ == 0 ? 0 : std::max<std::int64_t>(1, queue_deadline_ns_ - now);
      if (submission.admit_or_displace(level_, queue_timeout, &why)) {
        ticket_ = core_->overload();
        admitted_ns_ = submission.admitted_enqueue_ns();
      } else {
        a = Admission::overloaded;
        s.set_overload_reason(why);
      }
    }
    if (a == Admission::accepted && !in_parent_) {
      enrolled_.store(true, std::memory_order_relaxed);  // published by the hub's lock
      if (!hub_->enroll(this, from_coroutine_)) {
        enrolled_.store(false, std::memory_order_relaxed);
        a = Admission::closed;
        if (ticket_ != nullptr) std::exchange(ticket_, nullptr)->release();
      }
    }
  }
  if (a != Admission::accepted) {
    drop();  // the hub's reference
    drop();  // the start's
    // Refused without a submission: counted as one refused at admission.
    s.refused_as = a;
    submission.count_refusal();
    if (s.claim_in_queue(TaskStatus::rejected, Errc::rejected)) settle_in_queue(&s, false);
  } else {
    // A spawn blocked on a full queue waits no longer than its queue
    // deadline: its start then runs here and ends the task expired.
    const auto give_up =
        queue_deadline_ns_ == 0
            ? TaskStateBase::kNoDeadline
            : std::chrono::steady_clock::time_point(std::chrono::nanoseconds(queue_deadline_ns_));
    StartCell cell(this);
    // Waiting for room (spawn_when_room): no room decides nothing yet, for
    // a pool that would block (not one that refuses or runs it on the
    // caller), before the queue deadline, while the pool is open.
    if (wait_for_room && core_->options().overflow == Overflow::block &&
        (queue_deadline_ns_ == 0 || now_ns() < queue_deadline_ns_) &&
        core_->state() < PoolState::stopping) {
      if (!submission.try_push_counted(cell, level_)) {
        cell.disown();  // the start's reference stays for the next call
        // Accepted as far as a stop is concerned: it stops the task, and
        // its start, once pushed, ends it unrun (see below).
        (void)s.leave_queue(TaskStatus::running);
        return Admission::full;
      }
      queued = true;
    } else {
      a = submission.post_counted(std::move(cell), level_, may_block, &queued, give_up);
      if (a != Admission::accepted) s.refused_as = a;
    }
  }  // a refused cell ends the task rejected here
  // Accepted: running from now on (unless its start already made it so),
  // though its start may still be queued. A wait for it on a worker then
  // runs the pool's tasks, its steps among them, and never takes the task
  // for a queued task state to run itself; a cancel stops it, and the
  // start ends it unstarted (run_start).
  if (a == Admission::accepted) (void)s.leave_queue(TaskStatus::running);
  // The caller's reference keeps `s` alive however far the task got.
  if (queued && core_->observes(Observer::task_enqueued))
    task_events::enqueued(*core_, &s, s.is_long);
  if (a != Admission::accepted && core_->observes(Observer::task_rejected)) {
    task_events::refused(*core_, &s, s.is_long, a);
  }
  return a;
}

void CoroTaskBase::start_dropped(Admission refused) noexcept {
  const TicketReturn ticket(std::exchange(ticket_, nullptr));
  TaskStateBase& s = state();
  if (s.done()) return;  // a shutdown ended it before the cell was refused or dropped
  const Errc why = refused == Admission::accepted ? Errc::shutdown_dropped : Errc::rejected;
  // The pool counted it (a refusal, or the drop of its cell). Refused, or
  // dropped before launch() marked it running: it ends rejected, unstarted.
  if (s.claim_in_queue(TaskStatus::rejected, why)) {
    settle_in_queue(&s, false);
    return;
  }
  abandon(why, /*count=*/false);
}

void CoroTaskBase::settled_unstarted() noexcept {
  destroy_root();
  (void)state().detach_runner();
  (void)ended(false);
}

void CoroTaskBase::leave_hub() noexcept {
  // Only the thread that ends the task gets here (once), after its unlink
  // (which reads a hand-off by the parent).
  if (enrolled_.load(std::memory_order_relaxed)) {
    enrolled_.store(false, std::memory_order_relaxed);
    in_parent_ = false;
    hub_->leave(this);
  } else if (in_parent_) {
    in_parent_ = false;
    drop();  // the registry's reference: the parent's list let it go at unlink
  }
}

void CoroTaskBase::run_start(Runner& runner) noexcept {
  // The admission ticket goes back as this returns: the first step ended,
  // or the start ended the task unrun. The task may be gone by then; the
  // pool is not (this runs on one of its threads, or in a submission).
  OverloadControl* const ctl = std::exchange(ticket_, nullptr);
  const TicketReturn ticket(ctl);
  if (ctl != nullptr && admitted_ns_ != 0) {
    // The start's queue wait feeds the controller's signal. Its answer,
    // whether CoDel would shed this start, is not acted on (see
    // crew/detail/coro_task.hpp): the limit refuses the next spawns.
    const std::int64_t now = now_ns();
    (void)ctl->on_start(now - admitted_ns_, now);
  }
  TaskStateBase& s = state();
  (void)s.leave_queue(TaskStatus::running);  // unless launch() did
  if (s.done()) {
    // A shutdown ended it before launch() marked it running (uncounted,
    // see crew/detail/coro_task.hpp): this cell counts it.
    runner.count_outcome(s.raw_status());
    return;
  }
  // Stopped or past its queue deadline before it started: it never runs.
  Errc why{};
  if (queue_deadline_ns_ != 0 && now_ns() >= queue_deadline_ns_) {
    why = Errc::expired;
  } else if (stop_requested()) {
    why = s.stop_reason() == StopReason::shutdown ? Errc::shutdown_dropped : Errc::cancelled;
  }
  if (why != Errc{}) {
    abandon(why);
    return;
  }
  started_ = true;
  const std::int64_t enqueued = s.clock.enqueued_ns();
  if (enqueued != 0) {
    started_ns_ = now_ns();
    task_events::started(*core_, &s, enqueued, started_ns_);
  }
  if (timeout_.count() > 0) {
    try {
      hub_->arm_deadline(this, saturating_add(now_ns(), timeout_.count()));
    } catch (...) {  // out of memory: the task runs without its deadline
    }
  }
  suspension_.clear_frame();
  run_frame(this, root_handle());
}

void CoroTaskBase::run_resume() noexcept { run_frame(this, suspension_.frame()); }

const char* to_string(WaitKind k) noexcept {
  switch (k) {
    case WaitKind::none:
      return "none";
    case WaitKind::sleep:
      return "sleep";
    case WaitKind::task:
      return "task";
    case WaitKind::yield:
      return "yield";
    case WaitKind::callback:
      return "callback";
  }
  return "unknown";
}

bool CoroTaskBase::claim_armed() noexcept {
  const std::uint64_t gen = suspension_.armed_gen();
  return gen != 0 && suspension_.claim(gen, Wake::stop) == Claimed::resume;
}

bool CoroTaskBase::fire(std::uint64_t gen, Wake why) noexcept {
  // Claimed while settling: the arming thread goes on with the frame.
  if (suspension_.claim(gen, why) != Claimed::resume) return false;
  post_step(false);
  return true;
}

bool CoroTaskBase::finish_arming(std::uint64_t gen, bool stoppable) noexcept {
  if (stoppable) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (stop_requested()) {
      // Claimed by this stop or by a waker meanwhile: resume now either way.
      (void)suspension_.claim(gen, Wake::stop);
      return false;
    }
  }
  return suspension_.settle(gen);
}

bool CoroTaskBase::claim_own(std::uint64_t gen) noexcept {
  return suspension_.claim(gen, Wake::none) != Claimed::no;
}

void CoroTaskBase::post_step(bool abandon) noexcept {
  // Off the pool's own threads (a cancel, a callback's Resume), the step
  // may run, end the task and let the pool go before the push returns:
  // hold the core until then. (A worker holds it, and the timer thread is
  // joined before it goes: it must not hold the last reference.)
  std::shared_ptr<PoolCore> keep;
  if (!is_worker_of(self_) && !hub_->on_timer_thread()) keep = core_->weak_from_this().lock();
  ResumeStep step(this, abandon);
  if (Submission(*core_).try_push_step(step, level_)) return;
  if (core_->state() >= PoolState::stopping) {
    // The pool takes no more tasks: nothing will resume this frame.
    std::move(step).cancel();
    this->abandon(Errc::shutdown_dropped);
    return;
  }
  std::move(step).cancel();
  hub_->retry(this, abandon);  // the level is full: again shortly
}

bool CoroTaskBase::suspend_until(std::coroutine_handle<> h, std::int64_t at_ns, bool stoppable) {
  if (stoppable && stop_requested()) {
    suspension_.set_wake(Wake::stop);
    return false;
  }
  if (at_ns <= now_ns()) {
    suspension_.set_wake(Wake::event);
    return false;
  }
  const std::uint64_t gen = suspension_.arm(h, WaitKind::sleep, stoppable);
  try {
    hub_->arm_wake(this, gen, at_ns);
  } catch (...) {
    if (claim_own(gen)) throw;  // not suspended: the co_await throws
    return false;               // claimed while settling: go on (woken by a stop)
  }
  return finish_arming(gen, stoppable);
}

bool CoroTaskBase::suspend_yield(std::coroutine_handle<> h) noexcept {
  const std::uint64_t gen = suspension_.arm(h, WaitKind::yield, true);
  // A stop may have claimed it since arm(): then it goes on at once.
  if (!claim_own(gen)) return false;
  post_step(false);  // the frame may be resumed elsewhere from here on
  return true;
}

std::uint64_t CoroTaskBase::external_begin(std::coroutine_handle<> h) noexcept {
  if (stop_requested()) {
    suspension_.set_wake(Wake::stop);
    return 0;
  }
  return suspension_.arm(h, WaitKind::callback, true);
}

bool CoroTaskBase::suspend_on(std::coroutine_handle<> h, TaskStateBase* awaited,
                              CoroTaskBase* target) {
  if (stop_requested()) {
    suspension_.set_wake(Wake::stop);
    return false;
  }
  const std::uint64_t gen = suspension_.arm(h, WaitKind::task, true);
  if (target != nullptr) {
    // Once linked the task may be resumed on another worker (and unlink
    // itself) before this returns: what is needed afterwards is local.
    // No reference of its own: the awaited handle keeps the target alive
    // until await_resume.
    node_ = WaitNode{this, gen, target, nullptr};
    linked_ = true;
    if (!target->waiters_.add(&node_)) {  // it ended meanwhile
      linked_ = false;
      // Not suspended: resumed at once (by this event, or a stop meanwhile).
      (void)suspension_.claim(gen, Wake::event);
      return false;
    }
  } else {
    try {
      hub_->arm_poll(this, gen, awaited);
    } catch (...) {
      if (claim_own(gen)) throw;
      return false;  // claimed while settling: go on
    }
  }
  return finish_arming(gen, true);
}

void CoroTaskBase::unlink_wait() noexcept {
  if (!linked_) return;
  // Still in the list unless the target ended (it then took the list).
  node_.target->waiters_.remove(&node_);
  linked_ = false;
}

bool CoroTaskBase::end_wait() noexcept {
  const Wake why = suspension_.take_wake();
  // Woken by the end of its target, the task's node left the list then.
  if (why == Wake::event) linked_ = false;
  unlink_wait();
  return why == Wake::stop;
}

// One string built in place: 10,000 cancelled tasks throw 10,000 of these.
Error CoroTaskBase::stop_error() const {
  const TaskStateBase& s = *self_;
  const bool timed_out = s.stop_reason() == StopReason::timed_out;
  std::string what = "coroutine task ";
  if (!s.name().empty()) {
    what += '\'';
    what += s.name();
    what += "' ";
  }
  what += '#';
  what += std::to_string(s.id);
  what += timed_out ? ": timed_out" : ": cancelled";
  return Error(timed_out ? Errc::timed_out : Errc::cancelled, what);
}

std::coroutine_handle<> CoroTaskBase::ended(bool transfer) noexcept {
  // Claimed under the list's lock: a claimed waiter is not resumed by
  // anyone else, so its node stays as it is until its step is queued.
  WaitNode* claimed = waiters_.close([](WaitNode& n) {
    // A waiter still settling goes on by itself (its node left the list).
    return n.waiter->suspension_.claim(n.gen, Wake::event) == Claimed::resume;
  });
  std::coroutine_handle<> next = std::noop_coroutine();
  // One waiter of this pool goes on here, on a worker of the pool, by
  // symmetric transfer: no queue round trip for a fork-join's join.
  bool here = transfer && claimed != nullptr && is_worker_of(self_);
  while (claimed != nullptr) {
    WaitNode* n = std::exchange(claimed, claimed->next);
    CoroTaskBase* w = n->waiter;
    if (here && w->core_ == core_) {
      here = false;
      next = w->suspension_.frame();
      t_coro = w;  // the step goes on as the waiter's (StepScope restores it)
      continue;
    }
    w->post_step(false);
  }
  // Children still running are listed in the hub before this task leaves
  // it: a shutdown or a snapshot that walks from the hub finds them.
  if (stop_.has_children()) {
    hub_->begin_hand_off();
    stop_.hand_off([this](CoroTaskBase& child) {
      if (child.core_ != core_) return;  // another pool's: in its own hub already
      child.enrolled_.store(true, std::memory_order_relaxed);
      (void)hub_->enroll(&child, /*from_coroutine=*/true);  // never refused
    });
    hub_->end_hand_off();
  }
  stop_.unlink();
  leave_hub();  // may free this task
  return next;
}

namespace {
// What a co_await throws when the task is stopped (throw_stopped), or when
// what it awaited was ended by the same stop or shutdown (a child stopped
// with it, dropped or abandoned by the shutdown, a spawn refused by the
// closing pool): the outcome says it already, so a stopped detached task
// does not report it.
bool is_stop_error(const std::exception_ptr& e) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    switch (err.code()) {
      case Errc::cancelled:
      case Errc::timed_out:
      case Errc::shutdown_dropped:
      case Errc::abandoned:
        return true;
      case Errc::rejected:
        return err.admission() == Admission::closed;
      default:
        return false;
    }
  } catch (...) {
    return false;
  }
}
}  // namespace

// The outcome of a coroutine task that ran: a stop decides it, as for a
// long task (src/engine/run.cpp).
std::coroutine_handle<> CoroTaskBase::finish_root() noexcept {
  TaskStateBase& s = state();
  const StopReason stop = s.detach_runner();
  TaskStatus outcome = TaskStatus::succeeded;
  take_result(outcome);
  destroy_root();
  Errc why{};
  if (stop == StopReason::cancelled || stop == StopReason::shutdown) {
    outcome = TaskStatus::cancelled;
    why = Errc::cancelled;
  } else if (stop == StopReason::timed_out) {
    outcome = TaskStatus::timed_out;
    why = Errc::timed_out;
  }
  // Reported before it is counted, as the pool does: wait_idle() returns
  // after the handler ran (and the observers).
  if (s.error && s.detached && !(stop != StopReason::none && is_stop_error(s.error))) {
    core_->report_exception(TaskRef{s.id, s.name(), s.correlation_id()}, s.error);
  }
  clock_end(outcome, why);
  core_->count_outcome(outcome);
  (void)s.finish(outcome, why);
  return ended(true);
}

void CoroTaskBase::clock_end(TaskStatus outcome, Errc why) noexcept {
  TaskStateBase& s = state();
  const std::int64_t enqueued = s.clock.enqueued_ns();
  const std::int64_t end = enqueued != 0 ? now_ns() : 0;
  if (!started_) {
    s.clock.record(end, end);  // it waited in the queue until now
    task_events::unrun(*core_, &s, outcome, why);
    return;
  }
  s.clock.record(started_ns_ != 0 ? started_ns_ : end, end);
  if (enqueued != 0) task_events::finished(*core_, &s, outcome, enqueued, started_ns_, end);
}

void CoroTaskBase::abandon(Errc why, bool count) noexcept {
  TaskStateBase& s = state();
  unlink_wait();
  (void)s.detach_runner();
  {
    const StepScope scope(this);
    destroy_root();
  }
  // Uncounted: its start was dropped by the pool, which counted and
  // reported that.
  if (count) {
    clock_end(TaskStatus::cancelled, why);
    core_->count_outcome(TaskStatus::cancelled);
  }
  (void)s.finish(TaskStatus::cancelled, why);
  (void)ended(false);
}

}  // namespace detail
}  // namespace crew
