// crew/detail/coro_task.hpp: the state behind a coroutine task (crew/coro.hpp).
//
// A coroutine task is a CoroState<R>: a task state (the same one a Task<R>
// handle reads: status word, reference count, result, stop request) plus
// CoroTaskBase, the coroutine side: the root frame, its stop (the token it
// hands out and its children, crew/detail/coro_stop.hpp), the one
// suspension it may be in and the coroutine tasks waiting for it to end
// (crew/detail/coro_suspension.hpp).
//
// Its life:
//   spawn    the state is made, enrolled in its pool's CoroHub (one reference
//            until it ends; spawned from a coroutine task of the same pool,
//            listed in that task's children instead, crew/detail/
//            coro_stop.hpp) and a StartCell is queued as a counted task:
//            the pool's admission decides (block, reject, caller_runs).
//   steps    the StartCell, then one ResumeStep per resumption: short tasks
//            of the pool at the task's priority. Each runs the coroutine on
//            the worker until it suspends or ends.
//   suspend  an awaiter arms the task (arm: the frame to resume, a
//            generation number) and hands it to what it waits on (the hub's
//            timer, an awaited task's waiter list, or the hub's poll). Whoever
//            wakes it first (that, or the task's stop) claims the generation
//            with one compare-exchange and queues the ResumeStep; the others
//            find it claimed and do nothing. A claimed task is not armed, so
//            nobody else can resume or destroy its frame.
//   end      at the root's final suspension, on the worker of its last step:
//            the outcome is decided (a stop makes it cancelled or timed_out
//            however the coroutine returned, as for long tasks), the frame
//            destroyed, the outcome counted, then published; the waiters are
//            woken and the hub lets go. One waiter of the same pool goes on
//            at once on this worker (symmetric transfer from the final
//            suspension), the others are queued.
//   abandon  a frame the task will never resume (its step was dropped by a
//            shutdown, or a shutdown destroys it past its grace) is destroyed
//            by the thread that claimed it, and the task ends cancelled with
//            the reason (Errc::shutdown_dropped, Errc::abandoned).
//
// Status and counting: the StartCell is the task's one submission. The
// state leaves `queued` for `running` as soon as the pool accepts the
// start (launch), not when it runs: a queued task state is one a wait on
// a worker may take and run itself (Task::wait), and a coroutine task's
// state is not run that way. So an outcome is never decided in the queue
// after admission: a cancel stops the task, and the start, when it comes
// up stopped (or past its queue deadline), destroys the frame unrun and
// ends the task cancelled (Errc::cancelled, Errc::shutdown_dropped,
// Errc::expired). The outcome is counted by the thread that ends the task;
// a start dropped by a soft or hard shutdown is counted by the pool (as
// rejected) and the task ends cancelled (Errc::shutdown_dropped) uncounted.
// A refused task ends rejected, counted as the refusal. A ResumeStep is
// neither a submission nor an outcome (the pool's stats see one task
// however often it resumes).
//
// The overload controller (crew/overload.hpp), with OverloadOptions::
// admit_coroutines: a spawn from outside the pool takes an admission ticket in
// launch(), or is refused (rejected, Admission::overloaded, with the reason); a
// spawn from the pool's own tasks takes none, as a submission from them does.
// The ticket stands for the start queued and the first step running, and goes
// back when that step ends (the task suspends or ends) or the start ends the
// task unrun: a suspended task holds none. The start's queue wait feeds the
// controller's signal, but CoDel does not drop a start: the task is `running`
// by then, and `shed` is an outcome only a queued task can have; the limit,
// which that wait lowers, refuses the spawns instead.
//
// Times and events: where the pool times its tasks (PoolOptions::
// time_tasks for a task with a handle, or observers that want timings)
// the handle's queue_wait() is from the admission to the first start, and
// run_time() the wall time from the first start to the end, suspensions
// included. Observers hear of a coroutine task as of a task state: enqueued
// (admitted to the queue), started (its first step), finished (its end,
// on the thread of its last step), or rejected (refused, or ended before
// it started).
#pragma once

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <stop_token>
#include <type_traits>
#include <utility>

#include "crew/detail/block_cache.hpp"
#include "crew/detail/coro_stop.hpp"
#include "crew/detail/coro_suspension.hpp"
#include "crew/detail/pool_core.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/submission.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/error.hpp"
#include "crew/task.hpp"

namespace crew {
template <class R>
class Co;
}

namespace crew::detail {

class CoroHub;
class CoroTaskBase;

// Frames of up to kMaxCachedBlock bytes (512) come from the block cache;
// larger ones from the global operator new.
inline constexpr std::size_t kMaxCachedFrame = kMaxCachedBlock;
inline void* frame_alloc(std::size_t n) {
  return n <= kMaxCachedFrame ? cached_alloc(n) : ::operator new(n);
}
inline void frame_free(void* p, std::size_t n) noexcept {
  if (n <= kMaxCachedFrame) {
    cached_free(p, n);
  } else {
    ::operator delete(p);
  }
}

// The coroutine task whose step runs on the calling thread, or null. Out of
// line on purpose: read from inside a coroutine body, an inlined
// thread_local may be read through an address computed before a
// suspension, on another thread (docs/coroutines.md, "Traps").
[[nodiscard]] CoroTaskBase* current_coro_task() noexcept;

// The part of a CoroState that does not depend on the result type
// (src/coro/coro_task.cpp). Its parts: the Suspension (the one wait it may
// be in), the WaitList (the coroutine tasks waiting for it to end), the
// CoroStop (its token and its children).
class CoroTaskBase {
 public:
  CoroTaskBase(const CoroTaskBase&) = delete;
  CoroTaskBase& operator=(const CoroTaskBase&) = delete;

  [[nodiscard]] TaskStateBase& state() noexcept { return *self_; }
  [[nodiscard]] PoolCore& core() const noexcept { return *core_; }
  [[nodiscard]] std::stop_token stop_token() noexcept { return stop_.token(); }
  // 0 for a task spawned from outside a coroutine task, else its parent's + 1.
  [[nodiscard]] unsigned spawn_depth() const noexcept { return stop_.depth(); }
  // The queue level (priority) its steps are pushed at.
  [[nodiscard]] std::size_t level() const noexcept { return level_; }
  // The task's state recorded a stop (Task::cancel, its deadline, a
  // shutdown, its parent's stop).
  [[nodiscard]] bool stop_requested() const noexcept {
    return self_->stop_reason() != StopReason::none;
  }

  // ---- spawn (the spawning thread, before the task is shared) ----
  // Name, deadlines, the runner link and the link to `parent` (the spawning
  // coroutine task, if any: its stop stops this one), and two references
  // for launch() to hand to the hub and the start. Throws bad_alloc,
  // having done nothing of that.
  void setup(PoolCore& core, TaskOptions&& opts, bool detached, CoroTaskBase* parent);
  // Queues the task's start on its pool; returns the admission. A refused
  // task ends rejected (not counted here: the pool counted the refusal).
  // `wait_for_room` (spawn_when_room): where a pool that blocks on a full
  // queue would block, returns Admission::full with nothing decided (the
  // task neither queued nor refused: call again, with or without it);
  // past the task's queue deadline, or in a pool that does not block, as
  // without it.
  Admission launch(bool may_block, bool wait_for_room = false);

  // ---- awaiters (the task's own thread, inside await_suspend) ----
  // Each returns false when the coroutine must not suspend (resume at once:
  // stopped already, nothing to wait for, or woken while settling), true
  // when it is suspended; then the frame may be resumed on another thread
  // as soon as the call returns, so the awaiter must not touch itself
  // afterwards. Until it returns, no other thread resumes the frame.
  // `stoppable` false: a stop does not end this sleep (StopMode::ignore).
  bool suspend_until(std::coroutine_handle<> h, std::int64_t at_ns, bool stoppable = true);
  // `target`: `awaited` as a coroutine task (its end wakes the waiter), or
  // null for any other task (polled).
  bool suspend_on(std::coroutine_handle<> h, TaskStateBase* awaited, CoroTaskBase* target);
  bool suspend_yield(std::coroutine_handle<> h) noexcept;
  // A wait for something outside crew (on_callback): arms the task and
  // returns the generation its waker fires, or 0 if the task is stopped
  // already (do not suspend). After the operation is started:
  // finish_arming(gen, true) is true if the task is suspended, false if it
  // must go on at once (a stop, or the operation's completion, came
  // first); if starting it threw, claim_own(gen) is true if nothing woke
  // it (rethrow), false if a waker did (go on without suspending).
  std::uint64_t external_begin(std::coroutine_handle<> h) noexcept;
  // Last in await_suspend, after arming generation `gen`: a stop that came
  // first is claimed here; else the suspension settles. True if the task is
  // suspended, false if it goes on at once.
  bool finish_arming(std::uint64_t gen, bool stoppable) noexcept;
  // Claims generation `gen` on the task's own thread (nothing woke it yet).
  bool claim_own(std::uint64_t gen) noexcept;
  // In await_resume: true if the task was resumed by a stop; the co_await
  // then throws stop_error() (Error(cancelled), or Error(timed_out) past
  // its deadline). The throw is written in each await_resume, so that it
  // leaves from the coroutine's own frame: the unwinder walks one frame
  // to the coroutine's handler, not three (10,000 cancelled tasks throw
  // 10,000 times).
  [[nodiscard]] bool end_wait() noexcept;
  [[nodiscard]] Error stop_error() const;

  // ---- the steps ----
  void run_start(Runner& runner) noexcept;  // the StartCell
  void run_resume() noexcept;               // a ResumeStep
  // The root reached its final suspension (FinalAwaiter): ends the task
  // and returns the frame to go on with on this thread (a waiter of the
  // same pool it claimed, or std::noop_coroutine()).
  std::coroutine_handle<> finish_root() noexcept;
  void start_dropped(Admission refused) noexcept;
  // Destroys a claimed (or never started) frame and ends the task
  // cancelled with `why`, counted unless `count` is false (the pool
  // counted the drop of its start). On the claiming thread.
  void abandon(Errc why, bool count = true) noexcept;

  // ---- wakers (any thread) ----
  // Claims generation `gen` and queues the resumption; false if it was
  // claimed already (or re-armed since), or if the task's thread was still
  // settling it (that thread goes on with it).
  bool fire(std::uint64_t gen, Wake why) noexcept;
  // Claims the armed generation without resuming (a shutdown that destroys
  // the frame); true if it did and the task was suspended (not settling).
  bool claim_armed() noexcept;
  // Queues the step that resumes the claimed frame (or destroys it:
  // `abandon`), or hands it to the hub to retry while the queue is full.
  void post_step(bool abandon) noexcept;
  // The task's state recorded a stop: ends a stoppable suspension and
  // stops the token and the children (TaskStateBase::stop_requested_hook).
  void on_stopped() noexcept;

  // A reference to the task (its state's count).
  void hold() noexcept { self_->add_ref(); }
  void drop() noexcept { self_->release(); }

  // The current suspension (armed_gen, waits_on, since_ns: any thread).
  [[nodiscard]] const Suspension& suspension() const noexcept { return suspension_; }

  // The coroutine tasks spawned from this one and not ended (the registry's
  // walk, CoroHub): f(CoroTaskBase&) for each, under a spin lock.
  template <class F>
  void for_each_child(F f) {
    stop_.for_each_child(f);
  }

  // ---- the hub's registry (under its mutex) ----
  CoroTaskBase* reg_prev = nullptr;
  CoroTaskBase* reg_next = nullptr;
  std::uint8_t reg_shard = 0;  // set by enroll

 protected:
  explicit CoroTaskBase(TaskStateBase* self) noexcept : self_(self) {}
  ~CoroTaskBase() = default;

  virtual void destroy_root() noexcept = 0;
  [[nodiscard]] virtual std::coroutine_handle<> root_handle() const noexcept = 0;
  // Moves the root's result into the state; `outcome` becomes failed if
  // the root threw (or the result's move threw).
  virtual void take_result(TaskStatus& outcome) noexcept = 0;
  // The outcome was decided while queued: the frame goes, the waiters wake.
  void settled_unstarted() noexcept;

 private:
  // Takes this task's node out of its target's list, if it is there.
  void unlink_wait() noexcept;
  // What every end shares after the outcome is published: the waiters
  // wake, the links go. With `transfer`, one waiter of the same pool is
  // not queued but returned, to be resumed on this thread (a worker).
  std::coroutine_handle<> ended(bool transfer) noexcept;
  void leave_hub() noexcept;
  // Before the outcome is counted: the handle's times (if clocked) and the
  // observers' event (finished, or rejected for a task that never started).
  void clock_end(TaskStatus outcome, Errc why) noexcept;

  TaskStateBase* const self_;
  PoolCore* core_ = nullptr;
  CoroHub* hub_ = nullptr;
  std::uint8_t level_ = 0;
  bool linked_ = false;          // node_ is in a target's list (the task's thread)
  bool from_coroutine_ = false;  // spawned from a coroutine task
  // The hub holds it: set before the hub lists it (a shutdown that finds
  // it there may end it), or by the parent that hands it to the hub
  // (CoroStop::hand_off, under the parent's stop lock, which the task's
  // unlink takes before it reads this); cleared by the one thread that
  // ends the task.
  std::atomic<bool> enrolled_{false};
  // Listed in its parent's children instead of the hub (spawned from a
  // coroutine task that was not stopped): the registry's reference is
  // dropped at the end unless the parent handed it to the hub. Set by
  // setup before the task is shared.
  bool in_parent_ = false;
  std::int64_t queue_deadline_ns_ = 0;  // 0: none
  // The overload controller's admission ticket of a task spawned from
  // outside the pool while the controller is on (null: none), and the
  // admission time when the controller times this task's queue wait (0:
  // untimed). Set by launch() before the start is queued; the thread that
  // runs or drops the start takes the ticket and returns it when the
  // first step ends, or when the start ends the task unrun.
  OverloadControl* ticket_ = nullptr;
  std::int64_t admitted_ns_ = 0;
  bool admitted_ = false;  // launch() took it through the admission (the spawning thread)
  // Whether the first step ran, and when, if the task is clocked (else
  // 0). Written by that step, read by the thread that ends the task.
  bool started_ = false;
  std::int64_t started_ns_ = 0;
  std::chrono::nanoseconds timeout_{0};
  // Attached to the state as its runner for the task's whole life, so that
  // a stop after the end is too late (TaskStateBase::detach_runner). Its
  // source stays empty: the stop reaches the task through on_stopped().
  RunFrame frame_;
  Suspension suspension_;
  WaitNode node_;     // this task's entry in its target's waiters (the task's thread)
  WaitList waiters_;  // the tasks waiting for this one
  CoroStop stop_;
};

// A step: the resumption (or, for a shutdown, the destruction) of a claimed
// frame, queued as a short task. Holds a reference to the task. Not a task
// of its own (TaskStep): the pool counts no submission and no outcome for
// it.
class ResumeStep {
 public:
  using step_of_task = void;
  ResumeStep(CoroTaskBase* t, bool abandon) noexcept : t_(t), abandon_(abandon) { t_->hold(); }
  ResumeStep(ResumeStep&& o) noexcept : t_(std::exchange(o.t_, nullptr)), abandon_(o.abandon_) {}
  ResumeStep& operator=(ResumeStep&&) = delete;
  ResumeStep(const ResumeStep&) = delete;
  ResumeStep& operator=(const ResumeStep&) = delete;
  // Drops the reference without the step having run or been dropped (the
  // push failed: the caller keeps the claim).
  void cancel() && noexcept {
    if (t_ != nullptr) std::exchange(t_, nullptr)->drop();
  }
  ~ResumeStep() {
    if (t_ != nullptr) {  // dropped unrun by a shutdown
      Submission(t_->core()).step_taken();
      t_->abandon(Errc::shutdown_dropped);
      t_->drop();
    }
  }
  void operator()() noexcept {
    CoroTaskBase* t = std::exchange(t_, nullptr);
    Submission(t->core()).step_taken();  // one of its steps left the queue (stats())
    if (abandon_) {
      t->abandon(Errc::abandoned);
    } else {
      t->run_resume();
    }
    t->drop();
  }

 private:
  CoroTaskBase* t_;
  bool abandon_;
};

// The task's start, queued as a counted task (the task's one submission).
// It adopts the reference setup() took for it.
class StartCell {
 public:
  explicit StartCell(CoroTaskBase* t) noexcept : t_(t) {}
  StartCell(StartCell&& o) noexcept : t_(std::exchange(o.t_, nullptr)), queued_(true) {}
  StartCell& operator=(StartCell&&) = delete;
  StartCell(const StartCell&) = delete;
  StartCell& operator=(const StartCell&) = delete;
  ~StartCell() {
    if (t_ != nullptr) {
      t_->start_dropped(queued_ ? Admission::accepted : t_->state().refused_as);
      t_->drop();
    }
  }
  void run_counted(Runner& runner) noexcept {
    CoroTaskBase* t = std::exchange(t_, nullptr);
    t->run_start(runner);
    t->drop();
  }
  // Lets go of the task without dropping it (a push that found no room:
  // the start's reference stays with the task for the next launch()).
  void disown() noexcept { t_ = nullptr; }

 private:
  CoroTaskBase* t_;
  bool queued_ = false;  // moved into a queue cell: destroyed unrun = dropped
};

// ---- promises ----

struct PromiseBase;
// A forked child reached its final suspension (src/coro/coro_fork.cpp):
// returns the joiner to go on with, or std::noop_coroutine().
std::coroutine_handle<> fork_final(PromiseBase& p) noexcept;

struct PromiseBase {
  // The task this coroutine runs in: set when the task starts it (root) or
  // when a coroutine of the task awaits it (child). Null in a forked child
  // (crew::fork) and the coroutines it awaits: they run inside their
  // task's step without being its suspension, so a co_await that would
  // suspend the task throws there (Errc::wait_in_fork).
  CoroTaskBase* task = nullptr;
  // The awaiting coroutine of the same task; null for the root. For a
  // forked child, the coroutine that joins it (crew/detail/coro_fork.hpp).
  std::coroutine_handle<> continuation;
  std::exception_ptr error;
  // 0, or the fork word of a forked child (crew/detail/coro_fork.hpp).
  std::atomic<std::uint32_t> fork_word{0};

  static void* operator new(std::size_t n) { return frame_alloc(n); }
  static void operator delete(void* p, std::size_t n) noexcept { frame_free(p, n); }

  std::suspend_always initial_suspend() noexcept { return {}; }
  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      PromiseBase& p = h.promise();
      // A forked child first: its joiner may be writing `continuation`.
      if (p.fork_word.load(std::memory_order_relaxed) != 0) [[unlikely]] {
        return fork_final(p);
      }
      if (p.continuation) return p.continuation;  // symmetric transfer to the awaiter
      return p.task->finish_root();               // destroys this frame
    }
    void await_resume() noexcept {}
  };
  FinalAwaiter final_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }
};

template <class R>
struct CoroPromise : PromiseBase {
  CoroPromise() noexcept {}  // NOLINT(modernize-use-equals-default): the union stays raw
  ~CoroPromise() {
    if (has_value) value.~R();
  }
  CoroPromise(const CoroPromise&) = delete;
  CoroPromise& operator=(const CoroPromise&) = delete;
  Co<R> get_return_object() noexcept;
  template <class V>
    requires std::is_convertible_v<V&&, R>
  void return_value(V&& v) noexcept(std::is_nothrow_constructible_v<R, V&&>) {
    ::new (static_cast<void*>(std::addressof(value))) R(std::forward<V>(v));
    has_value = true;
  }
  R take() { return std::move(value); }
  union {
    R value;
  };
  bool has_value = false;
};

template <>
struct CoroPromise<void> : PromiseBase {
  Co<void> get_return_object() noexcept;
  void return_void() noexcept {}
};

template <class P>
concept CrewPromise = std::is_base_of_v<PromiseBase, P>;

// The task a co_await in coroutine `h` suspends; throws Error(wait_in_fork)
// in a forked child (PromiseBase::task), before anything is suspended.
[[noreturn]] void throw_wait_in_fork(const char* what);
template <CrewPromise P>
CoroTaskBase* waiting_task(std::coroutine_handle<P> h, const char* what) {
  CoroTaskBase* t = h.promise().task;
  if (t == nullptr) [[unlikely]]
    throw_wait_in_fork(what);
  return t;
}

// The task state of a spawned Co<R>.
template <class R>
class CoroState final : public ResultStateBase<R>, public CoroTaskBase {
 public:
  using Handle = std::coroutine_handle<CoroPromise<R>>;
  explicit CoroState(Handle root) noexcept : CoroTaskBase(this), root_(root) {
    root_.promise().task = this;
    this->is_long = true;  // cancel() stops a started task through its stop source
  }
  CoroState(const CoroState&) = delete;
  CoroState& operator=(const CoroState&) = delete;
  ~CoroState() override { destroy_root(); }

  // Never queued as a task state (its steps are cells).
  void run(const TaskContext& /*ctx*/) override {}

 private:
  void destroy_root() noexcept override {
    if (root_) std::exchange(root_, nullptr).destroy();
  }
  void take_result(TaskStatus& outcome) noexcept override {
    CoroPromise<R>& p = root_.promise();
    if (p.error) {
      this->error = p.error;
      outcome = TaskStatus::failed;
      return;
    }
    if constexpr (!std::is_void_v<R>) {
      try {
        this->set_value(p.take());
      } catch (...) {
        this->error = std::current_exception();
        outcome = TaskStatus::failed;
      }
    }
  }
  [[nodiscard]] std::coroutine_handle<> root_handle() const noexcept override { return root_; }
  void discard_callable() noexcept override { settled_unstarted(); }
  void stop_requested_hook() noexcept override { on_stopped(); }

  Handle root_;
};

}  // namespace crew::detail
