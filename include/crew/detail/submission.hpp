// crew/detail/submission.hpp: detail::Submission, a pool's inline
// submission path: how Pool::post / submit / try_*, Group and run_batch
// hand a task to a PoolCore. It packs the task (in its cell when it fits,
// else boxed or in a task state), pushes it inline to where nearly every
// push goes (the worker's own queue, else the ring of the caller's home
// shard), wakes a worker if none is spinning (PoolCore::after_push), and
// counts a refusal; with the overload controller on, it also takes an
// admission ticket inline while the caller's credit lasts. What is rare
// is out of line, in src/engine/submission.cpp, so that the rest of the
// queues and the observers stay out of the installed headers: a full
// ring (the other shards, the spill queue), a full queue's slow path
// (route_full), a task state's admission, an admission near the limit
// (displacing or refusing) and the newest-first route, and the observer
// notes. A short-lived view of one PoolCore, made per call: it holds no
// state of its own.
//
// Who touches what: the submitting thread (any thread, a worker of the
// pool included) writes the queue's tail and slot and the pool's id and
// refusal counters; it reads the pool's state and idle counts.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "crew/detail/pool_core.hpp"

namespace crew::detail {

class Submission {
 public:
  explicit Submission(PoolCore& core) noexcept : c_(core) {}

  enum class Route : std::uint8_t { queued, run_here, refused };

  template <class F>
  Admission post(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    const std::size_t level = level_of(opts);
    if constexpr (is_long_task_v<D>) {
      if (needs_state(opts) || c_.admits_here()) {
        return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
      }
      return post_long_inline(std::forward<F>(f), std::move(opts), may_block);
    } else {
      if (needs_state(opts)) [[unlikely]] {
        return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
      }
      if (c_.admits_here()) [[unlikely]] {
        if (c_.observes_tasks())
          return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
        return post_admitted(std::forward<F>(f), level, may_block);
      }
      if (c_.observes_tasks()) [[unlikely]] {
        return post_observed(std::forward<F>(f), level, may_block);
      }
      return post_plain(std::forward<F>(f), level, may_block);
    }
  }

  // Submits a counted task (see CountedTask) without a task state: no
  // allocation when it fits a cell. For a pool without task observers only
  // (observers need the task's own events; see counted_ok()), unless the
  // task tells them itself, as a coroutine task does. `queued`, if given,
  // is set when the task went to the queue (not run here, not refused).
  // `give_up`: the task's queue deadline, past which a submission blocked
  // on a full queue stops waiting and runs the task here (which finds its
  // deadline passed), as route_full says.
  template <CountedTask F>
  Admission post_counted(
      F&& f, std::size_t level, bool may_block, bool* queued = nullptr,
      std::chrono::steady_clock::time_point give_up = TaskStateBase::kNoDeadline) {
    using D = std::decay_t<F>;
    static_assert(std::is_nothrow_move_constructible_v<D>);
    Admission why = Admission::accepted;
    if constexpr (Cell::fits_inline<CountedFn<D>>) {
      auto fill = [&f](Cell& c) noexcept { c.emplace(CountedFn<D>{std::move(f)}); };
      switch (route(fill, level, may_block, why, give_up)) {
        case Route::queued:
          if (queued != nullptr) *queued = true;
          return Admission::accepted;
        case Route::run_here: {
          const InlineRun here(&c_);
          f.run_counted(c_.inline_runner());
          return Admission::accepted;
        }
        case Route::refused:
          break;  // f records its refusal when the caller destroys it
      }
    } else {
      // Boxed before a slot is claimed: boxing allocates and may throw,
      // and the fill must not (the slot is claimed by then).
      Cell tmp;
      tmp.emplace(CountedFn<D>{std::move(f)});
      auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
      switch (route(fill, level, may_block, why, give_up)) {
        case Route::queued:
          if (queued != nullptr) *queued = true;
          return Admission::accepted;
        case Route::run_here: {
          const InlineRun here(&c_);
          (void)tmp.invoke_and_destroy(static_cast<Runner*>(&c_.inline_runner()));
          return Admission::accepted;
        }
        case Route::refused:
          tmp.destroy();  // the task records its refusal
          break;
      }
    }
    return why;
  }
  // Whether a counted task (post_counted: no state, no ticket) may be
  // posted from this thread: no task observers to tell, and no overload
  // controller to admit it (a submission from outside the pool while it is
  // on needs a ticket, which only a task state or an AdmittedFn carries).
  [[nodiscard]] bool counted_ok() const noexcept {
    return !c_.observes_tasks() && !c_.admits_here();
  }
  // Pushes a counted task if its level has room now: neither blocks nor
  // refuses, and counts nothing when it cannot (false, `f` untouched), for
  // a submitter that waits for room itself (a coroutine spawned with
  // crew::spawn_when_room). False too for a closed pool.
  template <CountedTask F>
  bool try_push_counted(F& f, std::size_t level) noexcept {
    using D = std::decay_t<F>;
    static_assert(Cell::fits_inline<CountedFn<D>>, "pushed in place: it must fit a cell");
    auto fill = [&f](Cell& c) noexcept { c.emplace(CountedFn<D>{std::move(f)}); };
    return !c_.life_.closed() && try_queue(fill, level);
  }

  // What a plain post carries only in a task state (its Extras).
  static bool needs_state(const TaskOptions& o) noexcept {
    return !o.name.empty() || o.queue_timeout.count() != 0 || !o.correlation_id.empty();
  }

  // The queue level of a submission; throws for a priority the pool lacks,
  // a negative timeout and a correlation id too long (the options' one
  // validation). Inlined into every submission: three compares, cold throws.
  [[gnu::always_inline]] std::size_t level_of(const TaskOptions& o) const {
    if (o.priority >= c_.opts_.priority_levels) [[unlikely]]
      throw_bad_priority(o.priority);
    if (o.timeout.count() < 0 || o.queue_timeout.count() < 0) [[unlikely]]
      throw_negative_timeout(o);
    if (o.correlation_id.size() > kMaxCorrelationId) [[unlikely]]
      throw_long_correlation_id(o);
    return o.priority;
  }
  [[noreturn]] void throw_bad_priority(unsigned priority) const;
  [[noreturn]] static void throw_negative_timeout(const TaskOptions& o);
  [[noreturn]] static void throw_long_correlation_id(const TaskOptions& o);

  template <class F>
  Task<task_result_t<std::decay_t<F>>> submit(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    (void)level_of(opts);  // validated before anything is allocated
    TaskStateBase* s = make_state<D>(std::forward<F>(f), std::move(opts));
    (void)admit_state(s, may_block);
    return Task<task_result_t<D>>(s);  // adopts the creator's reference
  }

  // ---- coroutine tasks (crew/coro.hpp) ----
  // Queues one step of a coroutine task (a resumption) as a short task of
  // `level`: to the calling worker's own queue on a worker of this pool,
  // else the shared one. Never runs it on the caller and never blocks:
  // false when the level is full or the pool takes no more tasks (the
  // caller keeps the step). Also during SuspendedTasks::shut_down, which
  // runs before the pool stops taking tasks. A step is no submission (a
  // coroutine task is one, its StartCell) and counts no outcome: the step
  // calls step_taken() when it is taken off the queue. The
  // caller keeps the pool alive until this returns (the step may end its
  // task, and a wait for that let the pool go, before it does).
  template <class F>
  bool try_push_step(F& f, std::size_t level) noexcept {
    static_assert(Cell::fits_inline<F>, "a step must fit a cell");
    static_assert(TaskStep<F>, "a step counts no outcome of its own");
    auto fill = [&f](Cell& c) noexcept { c.emplace(std::move(f)); };
    return !c_.life_.closed() && try_queue(fill, level);
  }
  // A step onto the calling worker's own queue, uncounted: neither a
  // submission nor a step for stats() (so step_taken() is not called for
  // it), only a cell while it is queued. False when the caller is no
  // worker of this pool, its queue is full or the pool takes no more tasks.
  template <class F>
  bool try_push_own_step(F& f) noexcept {
    static_assert(Cell::fits_inline<F>, "a step must fit a cell");
    static_assert(TaskStep<F>, "a step counts no outcome of its own");
    if (t_current.core != &c_ || t_current.local_queue == nullptr || c_.life_.closed()) {
      return false;
    }
    auto fill = [&f](Cell& c) noexcept { c.emplace(std::move(f)); };
    if (!t_current.local_queue->try_push_uncounted(fill)) return false;
    c_.after_push(/*own_queue=*/true);
    return true;
  }
  // A step pushed by try_push_step was taken off the queue: about to run,
  // or dropped unrun. Before its effects (PoolCore::steps_).
  void step_taken() noexcept { c_.steps_.fetch_add(1, std::memory_order_release); }
  // Whether the pool reads the clock for task state `s` (its handle's
  // queue wait and run time, observers' timings), as admit_state does.
  [[nodiscard]] bool clocks(const TaskStateBase& s) const noexcept {
    return c_.timed_ || (c_.time_handles_ && !s.detached);
  }
  // A task id of this pool, and a refusal counted as submitted and
  // rejected (a spawn refused before it reached the queue).
  std::uint64_t task_id() noexcept { return c_.new_task_id(); }
  void count_refusal() noexcept { c_.refused_.fetch_add(1, std::memory_order_relaxed); }

  // An admission ticket for a submission at `level` from outside the pool
  // (PoolCore::admits_here; a coroutine task's spawn calls it too): past
  // the limit, a level above 0 displaces the newest task a lower level
  // queued newest first (Shedding::displace_below, src/engine/shedding.hpp)
  // and takes its ticket. False (and why, in `reason`) if refused; the
  // refusal is not counted as a submission here.
  // Inline up to a ticket from the caller's credit, the common case.
  [[gnu::always_inline]] bool admit_or_displace(std::size_t level, std::int64_t queue_timeout_ns,
                                                OverloadReason* reason = nullptr) noexcept {
    const OverloadReason r = c_.overload_->admit(queue_timeout_ns, /*may_displace=*/level > 0);
    if (r == OverloadReason::none) [[likely]]
      return true;
    return displace_or_refuse(r, level, queue_timeout_ns, reason);
  }
  // The enqueue time of an admitted task: now if the overload controller
  // times this one's queue wait, else 0.
  [[gnu::always_inline]] std::int64_t admitted_enqueue_ns() const noexcept {
    return c_.overload_->time_this() ? now_ns() : 0;
  }

 private:
  // A fill passed out of line: the slow paths after a failed push
  // (src/engine/submission.cpp) build the task's cell in its slot through
  // it, one indirect call.
  struct FillRef {
    void (*fill)(void* ctx, Cell& c) noexcept;
    void* ctx;
    void operator()(Cell& c) const noexcept { fill(ctx, c); }
  };
  template <class Fill>
  static FillRef fill_ref(Fill& f) noexcept {
    return {[](void* ctx, Cell& c) noexcept { (*static_cast<Fill*>(ctx))(c); }, &f};
  }

  template <class D, class F>
  Admission post_state(F&& f, TaskOptions&& opts, bool may_block) {
    TaskStateBase* s = make_state<D>(std::forward<F>(f), std::move(opts));
    s->detached = true;
    const Admission a = admit_state(s, may_block);
    s->release();
    return a;
  }

  // An unnamed long task without a queue deadline: inline in its cell like a
  // short one (no allocation) when it fits, else through a task state.
  template <class F>
  Admission post_long_inline(F&& f, TaskOptions&& opts, bool may_block) {
    using D = std::decay_t<F>;
    if constexpr (Cell::fits_inline<LongFn<D>> && std::is_nothrow_constructible_v<D, F&&>) {
      const std::chrono::nanoseconds timeout =
          opts.timeout.count() != 0 ? opts.timeout : c_.opts_.task_timeout;
      const std::int64_t enqueued = c_.timed_ ? now_ns() : 0;
      Admission why = Admission::accepted;
      auto fill = [&](Cell& c) noexcept {
        c.emplace(LongFn<D>{timeout, enqueued, std::forward<F>(f)});
      };
      const Route r = route(fill, level_of(opts), may_block, why);
      if (r == Route::run_here) {
        D local(std::forward<F>(f));
        c_.inline_runner().run_long(timeout, enqueued, &call_long<D>, &local);
        return Admission::accepted;
      }
      if (c_.observed_ != 0) [[unlikely]]
        note_plain_submission(r, why, /*is_long=*/true);
      return r == Route::queued ? Admission::accepted : why;
    } else {
      return post_state<D>(std::forward<F>(f), std::move(opts), may_block);
    }
  }

  // A plain task in a pool whose observers want task events: stored with
  // its enqueue time and run through the Runner, which times and reports it.
  template <class F>
  Admission post_observed(F&& f, std::size_t level, bool may_block) {
    using D = std::decay_t<F>;
    const std::int64_t enqueued = c_.timed_ ? now_ns() : 0;
    Admission why = Admission::accepted;
    if constexpr (Cell::fits_inline<ObservedFn<D>> && std::is_nothrow_constructible_v<D, F&&>) {
      // Built in its slot, as post_plain does: no staging cell to relocate.
      auto fill = [&](Cell& c) noexcept { c.emplace(ObservedFn<D>{enqueued, std::forward<F>(f)}); };
      const Route r = route(fill, level, may_block, why);
      if (r == Route::run_here) {
        D local(std::forward<F>(f));
        c_.inline_runner().run_observed(enqueued, &call_plain<D>, &local);
        return Admission::accepted;
      }
      note_plain_submission(r, why, /*is_long=*/false);
      return r == Route::queued ? Admission::accepted : why;
    }
    Cell tmp;  // boxed (or copied) before a slot is claimed: this may throw
    tmp.emplace(ObservedFn<D>{enqueued, std::forward<F>(f)});
    auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
    const Route r = route(fill, level, may_block, why);
    if (r == Route::run_here) {
      (void)tmp.invoke_and_destroy(static_cast<Runner*>(&c_.inline_runner()));
      return Admission::accepted;
    }
    if (r == Route::refused) tmp.destroy();
    note_plain_submission(r, why, /*is_long=*/false);
    return r == Route::queued ? Admission::accepted : why;
  }

  template <class F>
  Admission post_plain(F&& f, std::size_t level, bool may_block) {
    using D = std::decay_t<F>;
    Admission why = Admission::accepted;
    if constexpr (Cell::fits_inline<D> && std::is_nothrow_constructible_v<D, F&&>) {
      auto fill = [&f](Cell& c) noexcept { c.emplace(std::forward<F>(f)); };
      switch (route(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here:
          run_plain_here([&f] { f(); });
          return Admission::accepted;
        case Route::refused:
          return why;
      }
    } else {
      Cell tmp;  // box (or copy) before claiming a slot: this may throw
      tmp.emplace(std::forward<F>(f));
      auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
      switch (route(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here:
          run_plain_here([&tmp] { tmp.invoke_and_destroy(); });
          return Admission::accepted;
        case Route::refused:
          tmp.destroy();
          return why;
      }
    }
    return why;
  }

  // A plain task submitted from outside the pool while the overload
  // controller is on: a ticket first (or a refusal, before anything is
  // built), then a cell with its enqueue time (0 when its wait is not
  // timed) that owns the ticket; built in its slot when it fits, as
  // post_plain does.
  template <class F>
  Admission post_admitted(F&& f, std::size_t level, bool may_block) {
    using D = std::decay_t<F>;
    Admission why = Admission::accepted;
    if (c_.life_.closed()) [[unlikely]] {
      (void)refuse(Admission::closed, why);
      return why;
    }
    OverloadControl* ctl = c_.overload_.get();
    if (!admit_or_displace(level, 0)) {
      (void)refuse(Admission::overloaded, why);
      return why;
    }
    const std::int64_t enqueued = admitted_enqueue_ns();
    if constexpr (Cell::fits_inline<AdmittedFn<D>> && std::is_nothrow_constructible_v<D, F&&>) {
      auto fill = [&](Cell& c) noexcept {
        c.emplace(AdmittedFn<D>{ctl, enqueued, std::forward<F>(f)});
      };
      switch (route_admitted_inline(fill, level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here: {
          const TicketReturn ticket(ctl);
          D local(std::forward<F>(f));
          c_.inline_runner().run_admitted(enqueued, &call_plain<D>, &local);
          return Admission::accepted;
        }
        case Route::refused:
          ctl->release();
          return why;
      }
    } else {
      Cell tmp;
      try {
        tmp.emplace(AdmittedFn<D>{ctl, enqueued, std::forward<F>(f)});
      } catch (...) {
        ctl->release();
        throw;
      }
      auto fill = [&tmp](Cell& c) noexcept { tmp.relocate_to(c); };
      switch (route_admitted(fill_ref(fill), level, may_block, why)) {
        case Route::queued:
          return Admission::accepted;
        case Route::run_here:
          c_.inline_runner().run_cell_here(tmp);  // counts it if the cell did not
          return Admission::accepted;
        case Route::refused:
          tmp.destroy();  // returns the ticket
          break;
      }
    }
    return why;
  }

  template <class D, class F>
  TaskStateBase* make_state(F&& f, TaskOptions&& o) {
    // Most tasks have no Extras (TaskStateBase::Extras).
    std::unique_ptr<TaskStateBase::Extras> x;
    if (is_long_task_v<D> || needs_state(o)) {
      x = std::make_unique<TaskStateBase::Extras>();
      x->name = std::move(o.name);
      x->correlation_id = std::move(o.correlation_id);
      if (is_long_task_v<D>)
        x->timeout = o.timeout.count() != 0 ? o.timeout : c_.opts_.task_timeout;
      if (o.queue_timeout.count() != 0) {
        x->queue_deadline = saturating_deadline(std::chrono::steady_clock::now(), o.queue_timeout);
      }
    }
    auto* s = new TaskState<task_result_t<D>, D>(std::forward<F>(f));
    s->adopt_extras(std::move(x));
    s->id = c_.new_task_id();
    s->owner = &c_;
    s->is_long = is_long_task_v<D>;
    s->set_level(o.priority);
    return s;
  }

  // admit_or_displace() once admit() said `r` (nothing taken): at the
  // limit, a level above 0 displaces a lower level's newest task and takes
  // its ticket; else the refusal is counted. Out of line.
  bool displace_or_refuse(OverloadReason r, std::size_t level, std::int64_t queue_timeout_ns,
                          OverloadReason* reason) noexcept;

  // Hands `s` to the queue; the creator keeps its own reference.
  Admission admit_state(TaskStateBase* s, bool may_block);

  // Events of a plain submission that was queued, refused or swept.
  void note_plain_submission(Route r, Admission why, bool is_long) noexcept;

  // route() for an admitted task: while the controller reports a standing
  // queue, to its level's newest-first stack when that has room.
  Route route_admitted(FillRef fill, std::size_t level, bool may_block, Admission& why,
                       std::chrono::steady_clock::time_point give_up = TaskStateBase::kNoDeadline);
  // The same, with route()'s inline push while no queue stands.
  template <class Fill>
  Route route_admitted_inline(Fill& fill, std::size_t level, bool may_block, Admission& why) {
    if (c_.overload_->standing()) [[unlikely]]
      return route_admitted(fill_ref(fill), level, may_block, why);
    return route(fill, level, may_block, why);
  }

  // `give_up`: the task's queue deadline, past which a blocked submission
  // stops waiting for room: Route::run_here, where the caller finds the
  // deadline passed and ends the task expired.
  template <class Fill>
  Route route(Fill& fill, std::size_t level, bool may_block, Admission& why,
              std::chrono::steady_clock::time_point give_up = TaskStateBase::kNoDeadline) {
    if (c_.life_.closed()) [[unlikely]] {
      return refuse(Admission::closed, why);
    }
    if (try_queue(fill, level)) [[likely]]
      return Route::queued;
    return route_full(fill_ref(fill), level, may_block, why, give_up);
  }

  // Pushes without blocking, then wakes a worker if none spins (after_push).
  // From a worker of this pool: its own queue first, where a wait of this
  // worker finds it first (see local_queue.hpp); else the shared queue of
  // `level`: the ring of the caller's home shard inline, and if that is
  // full (or has a spill queue) the whole level out of line
  // (try_queue_shared). False if the level is full.
  template <class Fill>
  bool try_queue(Fill& fill, std::size_t level) noexcept {
    if (t_current.core == &c_) {
      LocalQueue* mine = t_current.local_queue;
      if (mine != nullptr && mine->try_push(fill)) [[likely]] {
        c_.after_push(/*own_queue=*/true);
        return true;
      }
    }
    Ring* ring = c_.home_ring(level);
    if (ring != nullptr && ring->try_push(fill)) [[likely]] {
      c_.after_push();
      return true;
    }
    return try_queue_shared(fill_ref(fill), level);
  }
  // The shared queue of `level` as a whole (Queues: every shard, with its
  // spill queue), then after_push. In src/engine/submission.cpp.
  bool try_queue_shared(FillRef fill, std::size_t level) noexcept;

  Route refuse(Admission a, Admission& why) noexcept {
    why = a;
    c_.refused_.fetch_add(1, std::memory_order_relaxed);
    return Route::refused;
  }

  // The shared queue of `level` is full (src/engine/submission.cpp): runs
  // the task here (a worker of this pool, or caller_runs), refuses it, or
  // blocks the caller until the level drains (BlockedSubmitters), at most
  // until `give_up` (then Route::run_here, the deadline passed).
  Route route_full(FillRef fill, std::size_t level, bool may_block, Admission& why,
                   std::chrono::steady_clock::time_point give_up);

  template <class G>
  void run_plain_here(G&& g) noexcept {
    const InlineRun here(&c_);
    try {
      g();
      c_.count_outcome(TaskStatus::succeeded);
    } catch (...) {
      c_.report_exception(TaskRef{}, std::current_exception());
      c_.count_outcome(TaskStatus::failed);
    }
  }

  PoolCore& c_;
};

}  // namespace crew::detail
