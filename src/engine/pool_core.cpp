// The parts of PoolCore that are neither the workers (worker.cpp, wake.cpp,
// run.cpp, help.cpp), the supervisor (supervisor.cpp), shutdown
// (shutdown.cpp) nor the options (pool_options.cpp): start-up, growth,
// pause / resize / stop_worker, stats.
#include "crew/detail/pool_core.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <thread>

#include "crew/detail/assert.hpp"
#include "crew/detail/barrier.hpp"
#include "crew/observer.hpp"
#include "crew/stacktrace.hpp"
#include "crew/usable_cpus.hpp"
#include "pool_options.hpp"
#include "pool_runtime.hpp"

namespace crew {
namespace detail {
namespace {

// Forks this process descends from: counted in each child, for
// PoolCore::inherited_by_fork.
std::atomic<std::uint32_t> g_forks{0};
void count_fork() noexcept { g_forks.fetch_add(1, std::memory_order_relaxed); }
[[maybe_unused]] const int g_fork_counter = pthread_atfork(nullptr, nullptr, count_fork);
std::uint32_t forks_so_far() noexcept { return g_forks.load(std::memory_order_relaxed); }

}  // namespace

void SharedCounters::add(TaskStatus outcome) noexcept {
  if (auto* field = outcome_field(*this, outcome)) field->fetch_add(1, std::memory_order_acq_rel);
}

OutcomeCounts SharedCounters::read() const noexcept {
  return {succeeded.load(std::memory_order_acquire), failed.load(std::memory_order_acquire),
          cancelled.load(std::memory_order_acquire), timed_out.load(std::memory_order_acquire),
          rejected.load(std::memory_order_acquire),  shed.load(std::memory_order_acquire)};
}

void WorkerCounters::add(TaskStatus outcome) noexcept {
  if (auto* field = outcome_field(*this, outcome)) field->inc();
}

OutcomeCounts WorkerCounters::read() const noexcept {
  return {succeeded.get(), failed.get(),   cancelled.get(),
          timed_out.get(), rejected.get(), shed.get()};
}

PoolCore::PoolCore(PoolOptions options)
    : opts_(resolved(std::move(options))),
      log_level_(opts_.logger->level()),
      observed_(ObserverHub::events_wanted(opts_)),
      timed_((observed_ & (Observer::task_started | Observer::task_finished)) != 0),
      overload_(opts_.overload.enabled ? std::make_unique<OverloadControl>(
                                             opts_.overload, opts_.overload.min_limit,
                                             opts_.overload.max_limit, opts_.max_workers, now_ns())
                                       : nullptr),
      time_handles_(opts_.time_tasks),
      queue_(opts_.queue_capacity, opts_.queue_shards, opts_.priority_levels, opts_.priority_aging),
      max_workers_(opts_.max_workers),
      rt_(std::make_unique<PoolRuntime>(*this, opts_)),
      forks_at_start_(forks_so_far()) {
  enable_light_fences();
}

PoolCore::~PoolCore() = default;

void PoolCore::start() {
  // The supervisor first: the only step that can throw, so a constructor
  // that fails leaves no worker behind (it would idle forever).
  rt_->supervisor.start();
  {
    WorkerRegistry& registry = rt_->registry;
    MutexLock lock(registry.mu);
    set_state(PoolState::running);
    for (std::size_t i = 0; i < opts_.min_workers; ++i) {
      live_workers_.fetch_add(1, std::memory_order_relaxed);
      registry.spawn_locked(false);
    }
  }
  // Last, after the threads: registering cannot throw (RootStop).
  rt_->supervisor.watch(opts_.stop_token);
}

void PoolCore::grow() noexcept {
  std::size_t live = live_workers_.load(std::memory_order_relaxed);
  while (live < max_workers_.load(std::memory_order_relaxed)) {
    if (live_workers_.compare_exchange_weak(live, live + 1, std::memory_order_relaxed)) {
      // The token keeps other submitters from starting more workers until
      // this one has found work (and then brings in help if more is queued).
      idle_.hand_token();
      WorkerRegistry& registry = rt_->registry;
      MutexLock lock(registry.mu);
      if (state() >= PoolState::stopped) {
        // A submission that raced the end of a shutdown: the submitter
        // sweeps what it queued (on_push_after_close), and a worker started
        // now could outlive the pool's last join.
        (void)idle_.give_token();
        live_workers_.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      registry.spawn_locked(false, /*spinning=*/true);
      return;
    }
  }
}

void PoolCore::set_state(PoolState to) noexcept { rt_->observers.pool_state(life_.set(to), to); }

bool PoolCore::transition(PoolState from, PoolState to) noexcept {
  if (!life_.transition(from, to)) return false;
  rt_->observers.pool_state(from, to);
  return true;
}

void PoolCore::pause() {
  if (transition(PoolState::running, PoolState::paused)) {
    life_.call_attention();
  }
}

void PoolCore::resume() {
  {
    MutexLock lock(rt_->registry.mu);
    if (!transition(PoolState::paused, PoolState::running)) return;
    life_.call_attention();
  }
  rt_->registry.changed.notify_all();
  rt_->wake.wake_all();
  // Tasks queued while paused may need workers that were never started.
  grow_for_queued();
}

void PoolCore::resize(std::size_t max_workers) {
  max_workers = resolved_resize(max_workers, opts_.min_workers);
  max_workers_.store(max_workers, std::memory_order_seq_cst);
  life_.call_attention();
  rt_->wake.wake_all();
  if (state() == PoolState::running) grow_for_queued();
}

// Workers start at submission, one at a time; after a pause, a resize or at
// the start of a drain, what is queued may need more than were started.
void PoolCore::grow_for_queued() noexcept {
  const std::size_t queued = queue_.size();
  for (std::size_t i = 0; i < queued && live_workers_.load() < max_workers_.load(); ++i) grow();
}

bool PoolCore::stop_worker(std::uint64_t id, WorkerStop how) {
  StopTarget target;
  WorkerRegistry& registry = rt_->registry;
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
    life_.call_attention();
  }
  target.fire();  // user stop callbacks run outside our locks
  rt_->wake.wake_all();
  registry.changed.notify_all();  // a paused worker exits too
  rt_->supervisor.wake();         // keeps min_workers, watches the grace period
  return true;
}

bool PoolCore::inherited_by_fork() const noexcept { return forks_at_start_ != forks_so_far(); }

bool PoolCore::in_own_task() const noexcept {
  if (t_current.core == this) return true;
  for (const InlineRun* r = t_inline_run; r != nullptr; r = r->outer) {
    if (r->core == this) return true;
  }
  return false;
}

bool PoolCore::wait_idle(std::chrono::steady_clock::time_point deadline) {
  auto nap = std::chrono::microseconds(50);
  for (;;) {
    const PoolStats s = stats();
    // A task is counted before its handlers and observers run (see
    // run_claimed): idle once those have run too.
    if (s.outcomes.total() >= s.submitted && epilogues_.load(std::memory_order_seq_cst) == 0) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(5));
  }
}

PoolStats PoolCore::stats() const {
  PoolStats s;
  MutexLock lock(rt_->registry.mu);
  s.state = state();
  s.max_workers = max_workers_.load(std::memory_order_relaxed);
  s.queued = queue_.size();
  s.blocked_submitters = rt_->blocked.count();
  // Outcomes first: each one is counted after its submission, so read in
  // this order every outcome in the snapshot belongs to a counted
  // submission, and outcomes >= submitted (wait_idle) proves they all ended.
  rt_->registry.add_stats_locked(s);
  s.submitted = queue_.pushed() + refused_.load(std::memory_order_relaxed) +
                ran_inline_.load(std::memory_order_relaxed);
  s.helped += helped_.load(std::memory_order_relaxed);
  if (overload_ != nullptr) s.overload = overload_->read();
  return s;
}

std::vector<WorkerInfo> PoolCore::workers() const { return rt_->registry.snapshot(); }

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
  }
  return "an exception not derived from std::exception";
}

}  // namespace

void PoolCore::report_exception(const TaskRef& task, std::exception_ptr e) const noexcept {
  if (opts_.on_exception) {
    try {
      opts_.on_exception(task, e);
      return;
    } catch (...) {
      log(LogLevel::error, {.pool = opts_.name}, "the on_exception handler threw");
    }
  }
  if (!logs(LogLevel::error)) return;
  try {
    const bool plain = task.id == 0 && task.name.empty();
    // Empty unless the program links crew::stacktrace (crew/stacktrace.hpp).
    const std::string trace = throw_trace(e);
    log(LogLevel::error,
        {.pool = opts_.name,
         .task = task.name,
         .task_id = task.id,
         .correlation_id = task.correlation_id},
        (plain ? "a fire-and-forget task threw: " : "task threw: ") + what_of(e) +
            (trace.empty() ? "" : "; thrown at:\n" + trace));
  } catch (...) {  // out of memory while formatting: drop the line
  }
}

void PoolCore::log_hook_failure(std::string_view hook, std::uint64_t worker,
                                std::exception_ptr e) const noexcept {
  if (!logs(LogLevel::error)) return;
  try {
    log(LogLevel::error, {.pool = opts_.name, .worker_id = worker},
        std::string(hook) + " hook threw: " + what_of(e));
  } catch (...) {
  }
}

void PoolCore::log(LogLevel level, const LogContext& context,
                   std::string_view message) const noexcept {
  if (logs(level)) opts_.logger->log(level, context, message);
}

}  // namespace detail

}  // namespace crew
