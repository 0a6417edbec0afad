// The wake-up policy: how an idle worker spins, sleeps on its futex in the
// pool's idle stack, and is woken (by a submitter, the last spinner, a
// state change); and how a worker waits out a pause. Only the worker's own
// thread spins and sleeps; any thread wakes.
#include <sched.h>

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
  const bool slot = opts_.spin.count() != 0 && !w.crowded && take_spinner_slot();
  const std::int64_t until = slot ? saturating_add(now_ns(), opts_.spin.count()) : 0;
  bool found = false;
  for (unsigned i = 0;; ++i) {
    const std::size_t queued = queue_.size();
    if (queued == 0) {
      w.backlog_since_ns = 0;
    } else {
      // Help is brought in before this worker takes its task, not after: the
      // woken worker often lands on this CPU and preempts this one, which
      // then holds nothing another worker could have run. (The token is
      // held here: a failed pop below takes it back.)
      if (queued >= 2 && help_due(w, queued)) {
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
  if (token && spinning_.fetch_sub(1, std::memory_order_seq_cst) == 1 && found && !queue_.empty() &&
      help_due(w, queue_.size())) {
    bring_in_help();
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
bool Core::help_due(Worker& w, std::size_t queued) noexcept {
  if (queued >= kBurst || watchers_.load(std::memory_order_seq_cst) == 0) return true;
  const std::int64_t now = now_ns();
  if (w.backlog_since_ns == 0) {
    w.backlog_since_ns = now;
    return false;
  }
  if (now - w.backlog_since_ns < kBacklogNs) return false;
  w.backlog_since_ns = now;
  return true;
}

// A worker popping without spinning after it deferred help looks again
// every 8th task: the backlog may have outlasted kBacklogNs meanwhile.
void Core::help_with_backlog(Worker& w) noexcept {
  if ((++w.drained & 7) != 0) return;
  const std::size_t queued = queue_.size();
  if (queued == 0) {
    w.backlog_since_ns = 0;
  } else if (spinning_.load(std::memory_order_seq_cst) == 0 && help_due(w, queued)) {
    bring_in_help();
  }
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

// A submitter that found no spinner. A worker that is awake without a
// spinning token and has (almost) nothing queued is most often between two
// short tasks and takes a token again within a microsecond; a wake-up costs
// the submitter a system call and, on a machine without an idle CPU,
// preempts it or the worker. So then the submitter polls spinning_ for about
// a microsecond before it wakes anyone: a worker that is really busy (a long
// task) costs its submitters that microsecond and nothing more. With a
// backlog queued the awake workers are busy clearing it, and help is brought
// in at once, as a burst needs.
void Core::help_submitter() noexcept {
  static constexpr int kPolls = 16;
  const int sleeping = sleepers_.load(std::memory_order_seq_cst);
  if (sleeping != 0 &&
      live_workers_.load(std::memory_order_relaxed) > static_cast<std::size_t>(sleeping) &&
      queue_.size() <= 2) {
    for (int i = 0; i < kPolls; ++i) {
      for (int k = 0; k < 4; ++k) cpu_relax();
      if (spinning_.load(std::memory_order_seq_cst) != 0) return;  // it takes the task
    }
  }
  bring_in_help();
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
  w->waker_cpu = sched_getcpu();
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
    w->waker_cpu = -1;
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
    std::vector<Worker*>& idle = ctl_->idle;
    idle.push_back(&w);
    if (w.crowded) std::rotate(idle.begin(), idle.end() - 1, idle.end());  // to the bottom
    w.in_idle_stack = true;
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
  }
  w.crowded = false;
  // Woken by a waker (it handed over a spinning token): note whether this
  // worker landed on the waker's CPU.
  auto handed = [&] {
    const int cpu = w.waker_cpu;
    w.crowded = cpu >= 0 && cpu == sched_getcpu();
    return Slept::woken_spinning;
  };
  auto told_to_look = [&] {
    return attention_.load(std::memory_order_acquire) != w.seen_attention ||
           state_.load(std::memory_order_seq_cst) >= PoolState::stopping;
  };
  // After announcing ourselves (seq_cst), re-check: a submitter that pushed
  // before it could see us has published its task by now.
  if (told_to_look() || !queue_.empty()) return leave_idle_stack(w) ? Slept::woken : handed();
  std::int64_t expire_at = 0;
  for (;;) {
    const bool may_expire = live_workers_.load(std::memory_order_relaxed) > opts_.min_workers;
    const std::int64_t now = now_ns();
    if (!may_expire) {
      expire_at = 0;
    } else if (expire_at == 0) {
      expire_at = saturating_add(now, opts_.idle_timeout.count());
    }
    // While another worker is awake, look at the queue every kWatchNs: a
    // worker that took a task and deferred help for what it left queued
    // (help_due) may be in a long task.
    std::int64_t wake_at = expire_at;
    const bool watch = live_workers_.load(std::memory_order_relaxed) >
                       static_cast<std::size_t>(sleepers_.load(std::memory_order_seq_cst));
    if (watch) {
      const std::int64_t watch_at = saturating_add(now, kWatchNs);
      wake_at = wake_at == 0 ? watch_at : std::min(wake_at, watch_at);
      watchers_.fetch_add(1, std::memory_order_seq_cst);
    }
    futex_wait(w.wake_word, key, time_point_of(wake_at));
    if (watch) watchers_.fetch_sub(1, std::memory_order_seq_cst);
    if (w.wake_word.load(std::memory_order_acquire) != key) return handed();
    // Timed out or woken spuriously: queued work a spinner will take is not
    // a reason to leave.
    if (told_to_look() || (!queue_.empty() && spinning_.load(std::memory_order_seq_cst) == 0)) {
      return leave_idle_stack(w) ? Slept::woken : handed();
    }
    if (expire_at != 0 && now_ns() >= expire_at) {
      if (!leave_idle_stack(w)) return handed();
      if (try_retire(live_workers_, opts_.min_workers)) return Slept::retired;
      return Slept::woken;  // needed after all: the minimum would be crossed
    }
  }
}

}  // namespace crew::detail
