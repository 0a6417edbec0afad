// PoolControl and PoolSnapshot (crew/detail/pool_control.hpp): the pool's
// control calls and its stats, on the engine's units.
#include "crew/detail/pool_control.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "crew/detail/pool_core.hpp"
#include "pool_options.hpp"
#include "pool_runtime.hpp"

namespace crew::detail {

void PoolControl::start() {
  // The supervisor first: the only step that can throw, so a constructor
  // that fails leaves no worker behind (it would idle forever).
  c_.rt_->supervisor.start();
  {
    WorkerRegistry& registry = c_.rt_->registry;
    MutexLock lock(registry.mu);
    c_.set_state(PoolState::running);
    for (std::size_t i = 0; i < c_.opts_.min_workers; ++i) {
      c_.live_workers_.fetch_add(1, std::memory_order_relaxed);
      registry.spawn_locked(false);
    }
  }
  // Last, after the threads: registering cannot throw (RootStop).
  c_.rt_->supervisor.watch(c_.opts_.stop_token);
}

void PoolControl::pause() {
  if (c_.transition(PoolState::running, PoolState::paused)) {
    c_.life_.call_attention();
  }
}

void PoolControl::resume() {
  {
    MutexLock lock(c_.rt_->registry.mu);
    if (!c_.transition(PoolState::paused, PoolState::running)) return;
    c_.life_.call_attention();
  }
  c_.rt_->registry.changed.notify_all();
  c_.rt_->wake.wake_all();
  // Tasks queued while paused may need workers that were never started.
  c_.grow_for_queued();
}

void PoolControl::resize(std::size_t max_workers) {
  max_workers = resolved_resize(max_workers, c_.opts_.min_workers);
  c_.max_workers_.store(max_workers, std::memory_order_seq_cst);
  c_.life_.call_attention();
  c_.rt_->wake.wake_all();
  if (c_.state() == PoolState::running) c_.grow_for_queued();
}

bool PoolControl::stop_worker(std::uint64_t id, WorkerStop how) {
  StopTarget target;
  WorkerRegistry& registry = c_.rt_->registry;
  {
    MutexLock lock(registry.mu);
    Worker* const found = registry.find_locked(id);
    if (found == nullptr) return false;
    Worker& w = *found;
    if (w.exit_requested.exchange(true)) return true;
    if (how == WorkerStop::hard) {
      w.run.mu.lock();
      (void)prepare_stop_locked(w, StopReason::cancelled, target);
      w.run.mu.unlock();
    }
    c_.life_.call_attention();
  }
  target.fire();  // user stop callbacks run outside our locks
  c_.rt_->wake.wake_all();
  registry.changed.notify_all();  // a paused worker exits too
  c_.rt_->supervisor.wake();      // keeps min_workers, watches the grace period
  return true;
}

bool PoolControl::wait_idle(std::chrono::steady_clock::time_point deadline) {
  auto nap = std::chrono::microseconds(50);
  for (;;) {
    const PoolStats s = PoolSnapshot(c_).stats();
    // A task is counted before its handlers and observers run (see
    // run_claimed): idle once those have run too.
    if (s.outcomes.total() >= s.submitted && c_.epilogues_.load(std::memory_order_seq_cst) == 0) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(5));
  }
}

PoolStats PoolSnapshot::stats() const {
  PoolStats s;
  MutexLock lock(c_.rt_->registry.mu);
  s.state = c_.state();
  s.max_workers = c_.max_workers_.load(std::memory_order_relaxed);
  s.queued = c_.queue_->size();
  s.blocked_submitters = c_.rt_->blocked.count();
  // Outcomes first: each one is counted after its submission, so read in
  // this order every outcome in the snapshot belongs to a counted
  // submission, and outcomes >= submitted (wait_idle) proves they all ended.
  c_.rt_->registry.add_stats_locked(s);
  // Coroutine steps taken before the pushes: each one read here is among
  // them (a step still queued counts as pending work).
  const std::uint64_t steps = c_.steps_.load(std::memory_order_acquire);
  s.submitted = c_.queue_->pushed() + c_.refused_.load(std::memory_order_relaxed) +
                c_.ran_inline_.load(std::memory_order_relaxed) - steps;
  s.helped += c_.inline_.helped();
  if (c_.overload_ != nullptr) s.overload = c_.overload_->read();
  return s;
}

std::vector<WorkerInfo> PoolSnapshot::workers() const { return c_.rt_->registry.snapshot(); }

ShutdownReport PoolControl::shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout) {
  return c_.rt_->shutdown.run(mode, timeout);
}

bool PoolControl::restart() { return c_.rt_->shutdown.restart(); }

void PoolControl::stop_supervisor() noexcept { c_.rt_->supervisor.stop(); }

}  // namespace crew::detail
