// The parts of PoolCore that are neither the workers (worker.cpp, wake.cpp,
// run.cpp, help.cpp), the supervisor (supervisor.cpp), shutdown
// (shutdown.cpp), the control calls (pool_control.cpp) nor the options
// (pool_options.cpp): construction, growth, exception reports and logs.
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
#include "crew/detail/suspended_tasks.hpp"
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

// The events that make a plain task go through a task's observer path
// (PoolCore::observes_tasks).
constexpr std::uint32_t kTaskEvents = Observer::task_enqueued | Observer::task_started |
                                      Observer::task_finished | Observer::task_rejected;

// PoolCore::rings_ for `q`: per level and shard, the shard's ring, or null
// where a spill queue sits behind it.
std::unique_ptr<Ring* []> ring_table(Queues& q) {
  const std::size_t shards = q.level(0).shards();
  auto rings = std::make_unique<Ring*[]>(q.levels() * shards);
  for (std::size_t l = 0; l < q.levels(); ++l) {
    for (std::size_t i = 0; i < shards; ++i) rings[l * shards + i] = q.level(l).plain_ring(i);
  }
  return rings;
}

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
    : forks_at_start_(forks_so_far()),
      opts_(resolved(std::move(options))),
      log_level_(opts_.logger->level()),
      observed_(ObserverHub::events_wanted(opts_)),
      timed_((observed_ & (Observer::task_started | Observer::task_finished)) != 0),
      task_observed_((observed_ & kTaskEvents) != 0),
      overload_(opts_.overload.enabled ? std::make_unique<OverloadControl>(
                                             opts_.overload, opts_.overload.min_limit,
                                             opts_.overload.max_limit, opts_.max_workers, now_ns())
                                       : nullptr),
      time_handles_(opts_.time_tasks),
      queue_(opts_.queue_capacity, opts_.queue_shards, opts_.priority_levels, opts_.priority_aging,
             /*newest_first=*/opts_.overload.enabled),
      rings_(ring_table(queue_.get())),
      shard_mask_(queue_->level(0).shards() - 1),
      max_workers_(opts_.max_workers),
      rt_(std::make_unique<PoolRuntime>(*this, opts_)) {
  enable_light_fences();
}

PoolCore::~PoolCore() = default;

PoolCore::OwnedSuspended::~OwnedSuspended() { delete p.load(std::memory_order_acquire); }

SuspendedTasks* PoolCore::install_suspended(std::unique_ptr<SuspendedTasks> s) noexcept {
  SuspendedTasks* expected = nullptr;
  if (suspended_.p.compare_exchange_strong(expected, s.get(), std::memory_order_acq_rel)) {
    return s.release();
  }
  return expected;
}

void PoolCore::grow() noexcept {
  std::size_t live = live_workers_.load(std::memory_order_relaxed);
  while (live < max_workers_.load(std::memory_order_relaxed)) {
    if (live_workers_.compare_exchange_weak(live, live + 1, std::memory_order_relaxed)) {
      // The token keeps other submitters from starting more workers until
      // this one has found work (and then brings in help if more is queued).
      idle_.hand_token();
      MutexLock lock(rt_->registry.mu);
      if (state() >= PoolState::stopped || rt_->shutdowns.workers_closed()) {
        // A submission that raced a shutdown past its wait for the
        // workers: the shutdown's last sweep or the submitter
        // (on_push_after_close) handles what it queued, and a worker
        // started now would run tasks after shutdown() returned, or outlive
        // the pool's last join.
        (void)idle_.give_token();
        live_workers_.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      rt_->registry.spawn_locked(false, /*spinning=*/true);
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

// Workers start at submission, one at a time; after a pause, a resize or at
// the start of a drain, what is queued may need more than were started.
void PoolCore::grow_for_queued() noexcept {
  const std::size_t queued = queue_->size();
  for (std::size_t i = 0; i < queued && live_workers_.load() < max_workers_.load(); ++i) grow();
}

bool PoolCore::inherited_by_fork() const noexcept { return forks_at_start_ != forks_so_far(); }

bool PoolCore::in_own_task() const noexcept {
  if (t_current.core == this) return true;
  for (const InlineRun* r = t_inline_run; r != nullptr; r = r->outer) {
    if (r->core == this) return true;
  }
  return false;
}

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
