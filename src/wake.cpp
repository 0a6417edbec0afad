// The wake-up policy: how an idle worker spins, sleeps on its futex in the
// pool's idle stack, and is woken (by a submitter, the last spinner, a
// state change); and how a worker waits out a pause. Only the worker's own
// thread spins and sleeps; any thread wakes.
#include <algorithm>
#include <thread>

#include "control.hpp"
#include "crew/detail/futex.hpp"

namespace crew::detail {

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
// worker woken or started to become one); the last spinner to see work
// wakes another if more is queued, before it takes its own task (so that
// if the woken worker preempts it on its CPU, it holds no task meanwhile);
// one that sees a single task takes it and wakes another only if more
// arrived meanwhile. A spinner polls without giving its core away (a yield
// could cost a whole time slice while a task waits, and submitters do not
// wake anyone while it spins), and at most spinner_limit() workers spin in
// the whole process; a worker that finds every slot taken goes to sleep
// after one look at the queues.
bool Core::spin_for_work(Worker& w, Cell& cell, bool already_spinning) noexcept {
  if (!already_spinning) spinning_.fetch_add(1, std::memory_order_seq_cst);
  bool token = true;
  set_worker_state(w, WorkerState::idle);
  w.clock_ns = 0;  // the next run waited: read the clock afresh
  const bool slot = opts_.spin.count() != 0 && take_spinner_slot();
  const std::int64_t until = slot ? saturating_add(now_ns(), opts_.spin.count()) : 0;
  bool found = false;
  for (unsigned i = 0;; ++i) {
    const std::size_t queued = queue_.size();
    if (queued != 0) {
      // Help is brought in before this worker takes its task, not after: the
      // woken worker often lands on this CPU and preempts this one, which
      // then holds nothing another worker could have run. (The token is
      // held here: a failed pop below takes it back.)
      if (queued >= 2) {
        token = false;
        if (spinning_.fetch_sub(1, std::memory_order_seq_cst) == 1) bring_in_help();
      }
      if (queue_.try_pop(cell, w.pop)) {
        found = true;
        break;
      }
      if (!token) {  // taken by others meanwhile: spin on
        spinning_.fetch_add(1, std::memory_order_seq_cst);
        token = true;
      }
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
  if (token && spinning_.fetch_sub(1, std::memory_order_seq_cst) == 1 && found && !queue_.empty()) {
    bring_in_help();
  }
  return found;
}

void Core::bring_in_help() noexcept {
  if (sleepers_.load(std::memory_order_seq_cst) != 0) {
    wake_sleeper();
  } else if (live_workers_.load(std::memory_order_relaxed) <
                 max_workers_.load(std::memory_order_relaxed) &&
             state_.load(std::memory_order_relaxed) == PoolState::running) {
    grow();
  }
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

}  // namespace crew::detail
