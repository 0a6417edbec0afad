// Option resolution and validation: what a Pool is built with, its
// defaults (from the CPUs the process may use) filled in.
#include "pool_options.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

#include "crew/detail/pool_core.hpp"
#include "crew/detail/queues.hpp"
#include "crew/error.hpp"
#include "crew/log.hpp"
#include "crew/usable_cpus.hpp"

namespace crew::detail {
namespace {

[[noreturn]] void invalid(const std::string& field, const std::string& why) {
  throw Error(Errc::invalid_options, "crew::PoolOptions." + field + ": " + why);
}

void require_non_negative(const char* field, std::chrono::nanoseconds d) {
  if (d.count() < 0)
    invalid(field, "must not be negative (got " + std::to_string(d.count()) + " ns)");
}

// One queue shard per usable CPU, at least 4 (so that a few producers
// on a small machine still get a shard each), at most 64.
constexpr std::size_t kMaxShards = 64;
std::size_t default_queue_shards() noexcept {
  return std::clamp<std::size_t>(usable_cpus(), 4, kMaxShards);
}

// Upper bound on workers: far beyond any sane setting, low enough to catch a
// negative number converted to size_t.
constexpr std::size_t kMaxWorkersLimit = 1 << 16;

// The overload controller's bounds (crew/overload.hpp): floor = the workers
// capped at the usable CPUs, at least 2; ceiling = what the queue holds
// plus the workers.
void resolve_overload(PoolOptions& o) {
  OverloadOptions& v = o.overload;
  if (v.target.count() <= 0) invalid("overload.target", "must be positive");
  if (v.interval.count() <= 0) invalid("overload.interval", "must be positive");
  if (!(v.percentile > 0 && v.percentile <= 1)) invalid("overload.percentile", "must be in (0, 1]");
  if (!(v.run_time_factor > 1)) invalid("overload.run_time_factor", "must be above 1");
  constexpr std::size_t kMaxLimit = std::size_t{1} << 40;
  if (v.max_limit == 0) {
    const std::size_t queued = o.queue_capacity == kUnbounded || o.queue_capacity >= kMaxLimit
                                   ? kMaxLimit
                                   : o.queue_capacity * o.priority_levels;
    v.max_limit = std::min(kMaxLimit, queued + o.max_workers);
  }
  if (v.min_limit == 0) v.min_limit = std::min(o.max_workers, usable_cpus());
  v.min_limit = std::max<std::size_t>(v.min_limit, 2);
  if (v.max_limit < v.min_limit) {
    invalid("overload.max_limit", std::to_string(v.max_limit) + " is below the floor (" +
                                      std::to_string(v.min_limit) + ")");
  }
}

}  // namespace

PoolOptions resolved(PoolOptions o) {
  if (o.name.empty()) invalid("name", "must not be empty");
  if (o.max_workers == 0) o.max_workers = 2 * usable_cpus();
  if (o.max_workers > kMaxWorkersLimit) {
    invalid("max_workers", std::to_string(o.max_workers) + " exceeds the limit of " +
                               std::to_string(kMaxWorkersLimit));
  }
  if (o.min_workers > o.max_workers) {
    invalid("min_workers", std::to_string(o.min_workers) + " exceeds max_workers (" +
                               std::to_string(o.max_workers) + ")");
  }
  if (o.queue_capacity == 0) o.queue_capacity = 1000 * usable_cpus();
  if (o.queue_shards == 0) o.queue_shards = default_queue_shards();
  if (o.queue_shards > kMaxShards) {
    invalid("queue_shards",
            std::to_string(o.queue_shards) + " exceeds the limit of " + std::to_string(kMaxShards));
  }
  require_non_negative("idle_timeout", o.idle_timeout);
  if (o.idle_timeout.count() == 0) invalid("idle_timeout", "must be positive");
  require_non_negative("task_timeout", o.task_timeout);
  require_non_negative("shutdown_timeout", o.shutdown_timeout);
  require_non_negative("abandon_grace", o.abandon_grace);
  require_non_negative("spin", o.spin);
  if (o.priority_levels == 0 || o.priority_levels > PopState::kMaxLevels) {
    invalid("priority_levels", std::to_string(o.priority_levels) + " is not in 1.." +
                                   std::to_string(PopState::kMaxLevels));
  }
  if (o.priority_aging == 0) invalid("priority_aging", "must be positive");
  if (o.stack_size != 0 &&
      (o.stack_size < PoolOptions::kMinStackSize || o.stack_size > PoolOptions::kMaxStackSize)) {
    invalid("stack_size", std::to_string(o.stack_size) + " is not 0 (the default) and not in " +
                              std::to_string(PoolOptions::kMinStackSize) + ".." +
                              std::to_string(PoolOptions::kMaxStackSize) + " bytes");
  }
  if (o.overflow != Overflow::block && o.overflow != Overflow::reject &&
      o.overflow != Overflow::caller_runs) {
    invalid("overflow",
            std::to_string(static_cast<int>(o.overflow)) + " is not block, reject or caller_runs");
  }
  if (!valid_shutdown_mode(o.shutdown_mode)) {
    invalid("shutdown_mode",
            std::to_string(static_cast<int>(o.shutdown_mode)) + " is not drain, soft or hard");
  }
  if (o.worker_policy != WorkerPolicy::normal && o.worker_policy != WorkerPolicy::batch) {
    invalid("worker_policy",
            std::to_string(static_cast<int>(o.worker_policy)) + " is not normal or batch");
  }
  if (o.overload.enabled) resolve_overload(o);
  if (!(o.max_start_rate >= 0 && o.max_start_rate <= 1e9)) {
    invalid("max_start_rate", std::to_string(o.max_start_rate) + " is not in 0..1e9");
  }
  if (!o.logger) o.logger = default_logger();
  for (std::size_t i = 0; i < o.observers.size(); ++i) {
    if (!o.observers[i]) invalid("observers", "entry " + std::to_string(i) + " is null");
  }
  return o;
}

std::size_t resolved_resize(std::size_t max_workers, std::size_t min_workers) {
  if (max_workers == 0) max_workers = 2 * usable_cpus();
  if (max_workers > kMaxWorkersLimit) {
    invalid("max_workers", "resize(" + std::to_string(max_workers) + ") exceeds the limit of " +
                               std::to_string(kMaxWorkersLimit));
  }
  if (max_workers < min_workers) {
    invalid("max_workers", "resize(" + std::to_string(max_workers) + ") is below min_workers (" +
                               std::to_string(min_workers) + ")");
  }
  return max_workers;
}

}  // namespace crew::detail
