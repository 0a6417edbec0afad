// WakePolicy (wake_policy.hpp): how an idle worker spins, sleeps on its
// futex in the pool's sleeper stack, and is woken (by a submitter, the last
// spinner, a state change); and how a worker waits out a pause. Only the
// worker's own thread spins and sleeps; any thread wakes.
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "cpu_pressure.hpp"
#include "crew/detail/suspended_tasks.hpp"
#include "crew/usable_cpus.hpp"
#include "futex.hpp"
#include "pool_runtime.hpp"
#include "wake_policy.hpp"

namespace crew::detail {

namespace {

// Workers spinning in all pools of the process, and how many may
// (spinner_limit_for).
std::atomic<int> g_spinners{0};
int spinner_limit() noexcept {
  static const int limit = spinner_limit_for(usable_cpus());
  return limit;
}

// A child of fork() has only the forking thread: the slots the parent's
// spinners held at the fork are nobody's there, and would keep the child's
// pools from ever spinning.
void spinners_in_child() noexcept { g_spinners.store(0, std::memory_order_relaxed); }
[[maybe_unused]] const int g_spinner_fork_handler =
    pthread_atfork(nullptr, nullptr, spinners_in_child);

// The pool's coroutine timers due by `now` (0: read the clock if one is
// armed), fired on this idle worker (SuspendedTasks::fire_due).
void fire_due_timers(const PoolCore& c, std::int64_t now = 0) noexcept {
  SuspendedTasks* timers = c.suspended();
  if (timers == nullptr) return;
  const std::int64_t due = timers->next_due_ns();
  if (due == 0) return;
  if (now == 0) now = now_ns();
  if (due <= now) timers->fire_due(now);
}

// A worker that sleeps until a coroutine timer wakes at it, not up to the
// default 50 us slack after it. Once per thread.
void sleep_precisely() noexcept {
  thread_local bool precise = false;
  if (!precise) {
    precise = true;
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  }
}

}  // namespace

bool take_spinner_slot() noexcept {
  int n = g_spinners.load(std::memory_order_relaxed);
  while (n < spinner_limit()) {
    if (g_spinners.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

void give_back_spinner_slot() noexcept { g_spinners.fetch_sub(1, std::memory_order_relaxed); }

int spinner_slots_taken() noexcept { return g_spinners.load(std::memory_order_relaxed); }

// Polls the queues for opts_.spin. Always gives up the spinning token.
//
// The wake-up policy, after Go's scheduler: a submitter wakes a sleeper
// only when no worker of the pool is actually spinning: holds a spinning
// token and beat within IdleCounts::kStaleUs (a spinner), or was woken or
// started to become one within IdleCounts::kWakeGraceUs. The last spinner
// to see work wakes another if more is queued, before it takes its own task
// (so that if the woken worker preempts it on its CPU, it holds no task
// meanwhile); one that sees a single task takes it and wakes another only
// if more arrived meanwhile. A spinner polls with `pause` and gives its core
// away only when it sees work it cannot take (below); if it loses its CPU
// anyway, its beat goes stale and submitters wake a sleeper. At most
// spinner_limit() workers spin in the whole process; a worker that finds
// every slot taken goes to sleep after one look at the queues. While the
// machine's CPUs are contended (cpu_pressure.hpp) a spin lasts at most
// kContendedSpinNs, unless PoolOptions::spin_when_contended. A worker that
// has kept its CPU for kSpinYieldNs (tasks and spins, no sleep) yields it
// when it sees nothing queued: a thread waiting for that CPU (crewd's I/O
// thread, the next task's producer) would otherwise wait out the spinner's
// time slice, which a spinner that finds a task every few microseconds
// never ends on its own.
bool WakePolicy::spin_for_work(Worker& w, Cell& cell, bool already_spinning) noexcept {
  if (!already_spinning) core_.idle_.take_token();
  bool token = true;
  // With the token held: the resumptions go to this worker's own queue
  // and wake nobody.
  fire_due_timers(core_);
  set_worker_state(w, WorkerState::idle);
  w.run.clock_ns = 0;  // the next run waited: read the clock afresh
  const bool may_spin = core_.opts_.spin.count() != 0 && !w.wake.crowded;
  std::int64_t last_look = may_spin ? now_ns() : 0;
  // On a contended machine the spin lasts about what a wake-up costs.
  std::int64_t window = may_spin && !core_.opts_.spin_when_contended && cpus_contended(last_look)
                            ? std::min(kContendedSpinNs, core_.opts_.spin.count())
                            : core_.opts_.spin.count();
  const bool slot = may_spin && take_spinner_slot();
  std::int64_t until = saturating_add(last_look, window);
  if (slot) core_.idle_.beat();
  bool found = false;
  unsigned stuck = 0;  // looks in a row that saw work and could not take it
  for (unsigned i = 0;; ++i) {
    const std::size_t queued = core_.queue_->size();
    if (queued == 0) {
      w.wake.backlog_since_ns = 0;
      stuck = 0;
    } else {
      // Help is brought in before this worker takes its task, not after: the
      // woken worker often lands on this CPU and preempts this one, which
      // then holds nothing another worker could have run. (The token is
      // held here: a failed pop below takes it back.)
      // Under a start-rate limit, no token: nothing to take (the caller
      // sleeps, or waits for the token in WorkerLoop::pace_start).
      const bool paced = core_.rt_->pacer != nullptr && !core_.life_.dropping();
      std::int64_t token_wait = 0;
      if (paced && !core_.rt_->pacer->try_take(now_ns(), token_wait)) break;
      if (queued >= 2 && wake_due(w, queued)) {
        token = false;
        if (core_.idle_.give_token()) wake_or_grow();
      }
      if (core_.queue_->try_pop(cell, w.pop)) {
        found = true;
        break;
      }
      if (paced) core_.rt_->pacer->give_back();
      if (!token) {  // taken by others meanwhile: spin on
        core_.idle_.take_token();
        token = true;
      }
      // Work in the shared queue that stays untakeable look after look: its
      // submitter claimed the slot and has not written the cell, so it is
      // not running, and it may be waiting for this very CPU (a worker woken
      // onto it preempted the submitter). Yield it.
      if (++stuck == kStuckLooks) {
        stuck = 0;
        if (core_.queue_->shared_size() != 0) sched_yield();
      }
    }
    if (!slot || core_.life_.attention(std::memory_order_relaxed) != w.seen_attention ||
        core_.life_.closed(std::memory_order_relaxed)) {
      break;
    }
    if ((i & 3) == 3) core_.idle_.beat();
    if ((i & 15) == 15) {
      // A spinner that lost its CPU meanwhile (preempted, or its virtual
      // CPU descheduled) starts its window afresh: the time it did not run
      // was not spent looking, and a spin cut short by it leaves the next
      // task to a wake-up.
      const std::int64_t now = now_ns();
      fire_due_timers(core_, now);
      if (now - last_look > kLostCpuNs) {
        until = saturating_add(now, window);
      } else if (now >= until) {
        break;
      }
      if (queued == 0) {
        if (w.wake.on_cpu_since_ns == 0) {
          w.wake.on_cpu_since_ns = now;
        } else if (now - w.wake.on_cpu_since_ns > kSpinYieldNs) {
          sched_yield();
          w.wake.on_cpu_since_ns = now_ns();
        }
      }
      if (window > kContendedSpinNs && !core_.opts_.spin_when_contended && cpus_contended(now)) {
        window = kContendedSpinNs;
        until = std::min(until, saturating_add(now, window));
      }
      last_look = now;
    }
    for (int k = 0; k < 8; ++k) cpu_relax();
  }
  if (slot) give_back_spinner_slot();
  // The last spinner to find work brings in help if more is queued (a
  // sleeper, else a new worker): a burst ramps up with one wake-up per
  // worker, and a submitter that saw this spinner is never left alone.
  if (token && core_.idle_.give_token() && found && !core_.queue_->empty() &&
      wake_due(w, core_.queue_->size())) {
    wake_or_grow();
  }
  return found;
}

// Whether a worker that sees `queued` tasks (beside the one it takes)
// brings in help now. One worker clears a short backlog faster than another
// wakes up, and the woken worker, on a machine whose other CPUs are busy,
// lands on this one's CPU and preempts it: so help for a few tasks waits
// until the backlog has lasted kBacklogNs. It waits only while some sleeper
// watches (it looks at the queue every kWatchNs, see sleep_for_work): if
// this worker then runs a long task, that sleeper takes what it left queued
// within kWatchNs. With no watcher (all others asleep without a deadline, or
// no sleeper at all: help is then a new worker) or kBurst or more tasks
// queued, help comes now.
bool WakePolicy::wake_due(Worker& w, std::size_t queued) noexcept {
  if (queued >= kBurst || core_.idle_.watchers() == 0) return true;
  const std::int64_t now = now_ns();
  if (w.wake.backlog_since_ns == 0) {
    w.wake.backlog_since_ns = now;
    return false;
  }
  if (now - w.wake.backlog_since_ns < kBacklogNs) return false;
  w.wake.backlog_since_ns = now;
  return true;
}

// A worker popping without spinning after it deferred help looks again
// every 8th task: the backlog may have outlasted kBacklogNs meanwhile.
void WakePolicy::wake_for_backlog(Worker& w) noexcept {
  if ((++w.wake.drained & 7) != 0) return;
  const std::size_t queued = core_.queue_->size();
  if (queued == 0) {
    w.wake.backlog_since_ns = 0;
  } else if (!core_.idle_.spinner_running() && wake_due(w, queued)) {
    wake_or_grow();
  }
}

void WakePolicy::after_batch(Worker& w) noexcept {
  if (w.pop.moved == 0) return;
  const std::size_t moved = std::exchange(w.pop.moved, 0);
  if (core_.life_.state(std::memory_order_seq_cst) != PoolState::running) return;
  // A worker holding a token steals them if this one does not come back.
  // Else help as for a spinner's backlog: deferred only while a sleeper
  // watches, and that sleeper, finding them on a look, brings in help for
  // what it leaves (Slept::saw_work). After spin_for_work this repeats its
  // own decision for the same cells, and wake_due says no the second time.
  // Nobody to bring in is the common case of a saturated pool: it returns
  // before anything reads the other workers' queues or the clock.
  if (core_.idle_.spinning() != 0) return;
  if (core_.idle_.sleepers() == 0 && core_.live_workers_.load(std::memory_order_relaxed) >=
                                         core_.max_workers_.load(std::memory_order_relaxed)) {
    return;
  }
  if (wake_due(w, moved)) wake_or_grow();
}

void WakePolicy::wake_or_grow() noexcept {
  if (core_.idle_.sleepers() != 0) {
    (void)wake_one(sched_getcpu());
  } else if (core_.live_workers_.load(std::memory_order_relaxed) <
                 core_.max_workers_.load(std::memory_order_relaxed) &&
             core_.life_.state(std::memory_order_relaxed) == PoolState::running) {
    core_.grow();
  }
}

// A submitter that found no spinner running.
//
// A token held without a recent beat belongs to a worker that lost its CPU
// (preempted, often by this very submitter, or its virtual CPU descheduled);
// a task left to it waits up to a time slice. A sleeper is woken instead,
// which the kernel places on an idle CPU if there is one. No worker is
// started for it: the holder is alive and comes back.
//
// With no token held: a worker that is awake and has (almost) nothing
// queued is most often between two short tasks and takes a token again
// within a microsecond; a wake-up costs the submitter a system call and, on
// a machine without an idle CPU, preempts it or the worker. So then the
// submitter polls the tokens for about a microsecond before it wakes anyone:
// a worker that is really busy (a long task) costs its submitters that
// microsecond and nothing more. With a backlog queued the awake workers are
// busy clearing it, and help is brought in at once, as a burst needs. With
// PoolOptions::spin 0 no worker between two tasks beats, so one look (for a
// worker woken within IdleCounts::kWakeGraceUs) replaces the poll.
void WakePolicy::wake_for_push() noexcept {
  static constexpr int kPolls = 16;
  const int sleeping = core_.idle_.sleepers();
  if (core_.idle_.spinning() != 0) {
    if (sleeping != 0) (void)wake_one(sched_getcpu());
    return;
  }
  if (sleeping != 0 &&
      core_.live_workers_.load(std::memory_order_relaxed) > static_cast<std::size_t>(sleeping) &&
      core_.queue_->size() <= 2) {
    const int polls = core_.opts_.spin.count() != 0 ? kPolls : 1;
    for (int i = 0; i < polls; ++i) {
      for (int k = 0; k < 4; ++k) cpu_relax();
      if (core_.idle_.spinner_running()) return;  // it takes the task
    }
  }
  wake_or_grow();
}

void WakePolicy::unlink_locked(Worker& w) noexcept {
  WakeSlot& slot = w.wake;
  (slot.above != nullptr ? slot.above->wake.below : top_) = slot.below;
  (slot.below != nullptr ? slot.below->wake.above : bottom_) = slot.above;
  slot.above = nullptr;
  slot.below = nullptr;
  slot.in_idle_stack = false;
}

// Takes `w` off the stack and wakes it.
void WakePolicy::pop_locked(Worker& w, int waker_cpu) noexcept {
  unlink_locked(w);
  core_.idle_.remove_sleeper();
  core_.idle_.hand_token();  // to the woken worker
  w.wake.waker_cpu = waker_cpu;
  w.wake.word.fetch_add(1, std::memory_order_release);
  futex_wake(w.wake.word, 1);
}

bool WakePolicy::wake_one(int waker_cpu) noexcept {
  MutexLock lock(mu_);
  if (top_ == nullptr) return false;
  pop_locked(*top_, waker_cpu);
  return true;
}

// Callers change what sleepers re-check (state, attention) before calling,
// so a worker that goes to sleep afterwards sees the change and does not
// stay asleep.
void WakePolicy::wake_all() noexcept {
  MutexLock lock(mu_);
  while (top_ != nullptr) pop_locked(*top_, -1);
}

void WakePolicy::push(Worker& w, bool bottom) noexcept {
  MutexLock lock(mu_);
  WakeSlot& slot = w.wake;
  if (bottom) {
    slot.above = bottom_;
    (bottom_ != nullptr ? bottom_->wake.below : top_) = &w;
    bottom_ = &w;
  } else {
    slot.below = top_;
    (top_ != nullptr ? top_->wake.above : bottom_) = &w;
    top_ = &w;
  }
  slot.in_idle_stack = true;
  core_.idle_.add_sleeper();
}

bool WakePolicy::leave(Worker& w) noexcept {
  MutexLock lock(mu_);
  if (!w.wake.in_idle_stack) return false;
  unlink_locked(w);
  core_.idle_.remove_sleeper();
  return true;
}

void WakePolicy::quiesce() noexcept { MutexLock lock(mu_); }

// Holds the worker (and the cell it popped) while the pool is paused.
// resume() and shutdown() change the state under the registry's mutex and
// notify.
void WakePolicy::wait_out_pause(Worker& w) {
  set_worker_state(w, WorkerState::idle);
  WorkerRegistry& registry = core_.rt_->registry;
  MutexLock lock(registry.mu);
  while (core_.life_.state() == PoolState::paused) {
    registry.changed.wait(lock.native());
  }
}

bool WakePolicy::paced_out() const noexcept {
  return core_.rt_->pacer != nullptr && core_.rt_->pacer->someone_waits();
}

WakePolicy::Slept WakePolicy::sleep_for_work(Worker& w) noexcept {
  const std::uint32_t key = w.wake.word.load(std::memory_order_acquire);
  set_worker_state(w, WorkerState::idle);
  push(w, /*bottom=*/w.wake.crowded);
  w.wake.crowded = false;
  // Woken by a waker (it handed over a spinning token): note whether this
  // worker landed on the waker's CPU.
  auto handed = [&] {
    const int cpu = w.wake.waker_cpu;
    w.wake.crowded = cpu >= 0 && cpu == sched_getcpu();
    return Slept::woken_spinning;
  };
  // Leaves the idle stack on its own for `why`, unless a waker took it off
  // meanwhile (then it holds a token).
  auto leave_for = [&](Slept why) { return leave(w) ? why : handed(); };
  auto told_to_look = [&] {
    return core_.life_.attention(std::memory_order_acquire) != w.seen_attention ||
           core_.life_.closed(std::memory_order_seq_cst);
  };
  // After announcing ourselves (seq_cst), re-check: a submitter that pushed
  // before it could see us has published its task by now.
  // Under a start-rate limit, work it saw is work to wait for a token for
  // (the worker loop's plain look), not to spin for.
  const Slept saw_work = core_.rt_->pacer != nullptr ? Slept::woken : Slept::saw_work;
  if (told_to_look()) return leave_for(Slept::woken);
  if (!core_.queue_->empty() && !paced_out()) return leave_for(saw_work);
  // A watcher stays counted from its first timed sleep until it stops
  // watching, across the looks between sleeps: a worker that sees the count
  // drop while a watcher is only looking would bring in help at once
  // (wake_due), and on a busy machine that look has preempted it, so tasks
  // are queued. It stops after kWatchLooks looks that found nothing to do,
  // once the queues are empty: each look costs a busy machine two context
  // switches, and a steady load that never defers help (wake_due) has no
  // use for them. A worker that defers help after that wakes it instead.
  bool watching = false;
  int looks = 0;
  struct WatchEnd {
    IdleCounts& idle;
    bool& on;
    ~WatchEnd() {
      if (on) idle.end_watch();
    }
  } watch_end{core_.idle_, watching};
  std::int64_t expire_at = 0;
  for (;;) {
    const bool may_expire =
        core_.live_workers_.load(std::memory_order_relaxed) > core_.opts_.min_workers;
    const std::int64_t now = now_ns();
    if (!may_expire) {
      expire_at = 0;
    } else if (expire_at == 0) {
      expire_at = saturating_add(now, core_.opts_.idle_timeout.count());
    }
    // While another worker is awake, look at the queue every kWatchNs: a
    // worker that took a task and deferred help for what it left queued
    // (wake_due) may be in a long task. One watcher is enough for that, so
    // a sleeper watches only while no other does (two may, for a moment,
    // when both read 0): with every sleeper watching, crewd's 64 jobs
    // workers on one CPU woke 2,700 times in 3 s to find nothing, and each
    // of those wake-ups delayed the I/O thread (docs/bench/overload.md).
    std::int64_t wake_at = expire_at;
    bool watch = looks < kWatchLooks &&
                 core_.live_workers_.load(std::memory_order_relaxed) >
                     static_cast<std::size_t>(core_.idle_.sleepers()) &&
                 (watching || core_.idle_.watchers() == 0);
    if (watch != watching) {
      watching = watch;
      if (watch) {
        core_.idle_.begin_watch();
      } else {
        core_.idle_.end_watch();
        // A worker that saw this one watching may have deferred help for
        // what is queued (it read the count after the queue; this reads the
        // queue after the count, both seq_cst): then watch on.
        if (!core_.queue_->empty()) {
          core_.idle_.begin_watch();
          watching = watch = true;
          looks = 0;
        }
      }
    }
    if (watch) {
      const std::int64_t watch_at = saturating_add(now, kWatchNs);
      wake_at = wake_at == 0 ? watch_at : std::min(wake_at, watch_at);
    }
    // Until the earliest coroutine timer at the latest: this worker fires
    // it (SuspendedTasks), on its way through spin_for_work.
    SuspendedTasks* const timers = core_.suspended();
    const std::int64_t due = timers != nullptr ? timers->next_due_ns() : 0;
    const bool timed = due != 0 && (wake_at == 0 || due <= wake_at);
    if (timed) {
      wake_at = std::max<std::int64_t>(due - kTimerLeadNs, 1);
      sleep_precisely();
      timers->begin_timer_watch(due);
    }
    futex_wait(w.wake.word, key, time_point_of(wake_at));
    w.wake.on_cpu_since_ns = 0;
    if (timed) {
      // Up to the timer on the CPU (unless woken early for something else,
      // or a waker takes this worker).
      for (std::int64_t t = now_ns(); t < due && due - t <= 2 * kTimerLeadNs &&
                                      w.wake.word.load(std::memory_order_acquire) == key;
           t = now_ns()) {
        for (int k = 0; k < 8; ++k) cpu_relax();
      }
      timers->end_timer_watch();
    }
    if (w.wake.word.load(std::memory_order_acquire) != key) return handed();
    if (timed && now_ns() >= due) return leave_for(Slept::woken);
    if (watching) ++looks;
    // Timed out or woken spuriously: queued work a running spinner will
    // take is not a reason to leave.
    if (told_to_look()) return leave_for(Slept::woken);
    if (!core_.queue_->empty() && !core_.idle_.spinner_running() && !paced_out())
      return leave_for(saw_work);
    if (expire_at != 0 && now_ns() >= expire_at) {
      if (!leave(w)) return handed();
      if (try_retire(core_.live_workers_, core_.opts_.min_workers)) return Slept::retired;
      return Slept::woken;  // needed after all: the minimum would be crossed
    }
  }
}

void PoolCore::wake_for_push() noexcept { rt_->wake.wake_for_push(); }

}  // namespace crew::detail
