// ShardedPool: building the shards, placement, merged stats and shutdown.
#include "crew/sharded_pool.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <string>
#include <thread>

#include "crew/usable_cpus.hpp"

namespace crew {

std::string_view to_string(Placement p) noexcept {
  switch (p) {
    case Placement::round_robin:
      return "round_robin";
    case Placement::least_loaded:
      return "least_loaded";
  }
  return "unknown";
}

namespace detail {

// The shards' slots, shared with their tasks (see ShardSlot).
class ShardBlock {
 public:
  explicit ShardBlock(std::size_t n) : slots_(std::make_unique<ShardSlot[]>(n)), live_(n) {
    for (std::size_t i = 0; i < n; ++i) slots_[i].block = this;
  }
  ShardSlot* slots() const noexcept { return slots_.get(); }
  // A slot's count reached zero.
  void slot_done() noexcept {
    if (live_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  std::unique_ptr<ShardSlot[]> slots_;
  std::atomic<std::size_t> live_;
};

void shard_unplace(ShardSlot* slot) noexcept {
  if (slot->placed.fetch_sub(1, std::memory_order_acq_rel) == 1) slot->block->slot_done();
}

}  // namespace detail

namespace {

// Throws Error(invalid_options) for a field out of range (the shards' own
// PoolOptions are checked by each Pool).
void check(const ShardedPoolOptions& o) {
  if (o.shards > ShardedPoolOptions::kMaxShards) {
    throw Error(Errc::invalid_options,
                "crew::ShardedPoolOptions.shards: " + std::to_string(o.shards) +
                    " exceeds the limit of " + std::to_string(ShardedPoolOptions::kMaxShards));
  }
  if (o.placement != Placement::round_robin && o.placement != Placement::least_loaded) {
    throw Error(Errc::invalid_options, "crew::ShardedPoolOptions.placement: " +
                                           std::to_string(static_cast<int>(o.placement)) +
                                           " is not round_robin or least_loaded");
  }
}

std::size_t shard_count(const ShardedPoolOptions& o) {
  if (o.shards != 0) return o.shards;
  return usable_cpus();
}

std::vector<std::unique_ptr<Pool>> make_shards(const ShardedPoolOptions& o) {
  check(o);
  std::vector<std::unique_ptr<Pool>> pools;
  const std::size_t n = shard_count(o);
  pools.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    PoolOptions po = o.pool;
    po.name = o.pool.name + "-" + std::to_string(i);
    try {
      pools.push_back(std::make_unique<Pool>(std::move(po)));
    } catch (const Error& e) {
      throw Error(e.code(), std::string("crew::ShardedPoolOptions.pool: ") + e.what());
    }
  }
  return pools;
}

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

ShutdownReport merge(const std::vector<ShutdownReport>& reports) {
  ShutdownReport m;
  m.mode = reports.front().mode;
  m.final_state = PoolState::stopped;
  for (const ShutdownReport& r : reports) {
    m.escalated = m.escalated || r.escalated;
    if (r.final_state == PoolState::stopped_timeout) m.final_state = PoolState::stopped_timeout;
    m.elapsed = std::max(m.elapsed, r.elapsed);
    m.during += r.during;
    m.lifetime += r.lifetime;
    append(m.rejected, r.rejected);
    append(m.cancelled, r.cancelled);
    append(m.timed_out, r.timed_out);
    append(m.abandoned, r.abandoned);
    m.rejected_unnamed += r.rejected_unnamed;
    m.abandoned_unnamed += r.abandoned_unnamed;
  }
  return m;
}

// Runs fn(i) for every shard, each on its own thread but the first (on the
// caller's), so that blocking calls (shutdown, wait_idle) overlap.
template <class Fn>
void on_every_shard(std::size_t n, Fn fn) {
  std::vector<std::exception_ptr> errors(n);
  {
    std::vector<std::jthread> threads;
    threads.reserve(n);
    for (std::size_t i = 1; i < n; ++i) {
      threads.emplace_back([&fn, &errors, i] {
        try {
          fn(i);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    try {
      fn(0);
    } catch (...) {
      errors[0] = std::current_exception();
    }
  }  // joins
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

ShardedPool::ShardedPool(ShardedPoolOptions options)
    : placement_(options.placement),
      pools_(make_shards(options)),
      block_(new detail::ShardBlock(pools_.size())) {}

ShardedPool::~ShardedPool() {
  try {
    (void)shutdown();
  } catch (...) {  // out of memory for the reports: each Pool's destructor still shuts it down
  }
  const std::size_t n = pools_.size();
  pools_.clear();
  // The ShardedPool's own count on every slot; tasks still counting (an
  // abandoned one) free the block when they end.
  for (std::size_t i = 0; i < n; ++i) detail::shard_unplace(slot_at(i));
}

detail::ShardSlot* ShardedPool::slot_at(std::size_t i) const noexcept {
  return block_->slots() + i;
}

std::size_t ShardedPool::pick() noexcept {
  const std::size_t n = pools_.size();
  detail::ShardSlot* const first = slot_at(0);
  // Nested: a task of a shard submits to its own shard.
  if (const detail::ShardSlot* cur = detail::t_shard; cur != nullptr) {
    const std::less<const detail::ShardSlot*> before;
    if (!before(cur, first) && before(cur, first + n)) return static_cast<std::size_t>(cur - first);
  }
  const std::size_t start = next_.fetch_add(1, std::memory_order_relaxed) % n;
  if (placement_ == Placement::round_robin) return start;
  // Least loaded, scanning from a rotating start so that ties spread.
  std::size_t best = start;
  std::int64_t best_load = first[start].placed.load(std::memory_order_relaxed);
  for (std::size_t k = 1; k < n && best_load > 1; ++k) {
    const std::size_t i = (start + k) % n;
    const std::int64_t load = first[i].placed.load(std::memory_order_relaxed);
    if (load < best_load) {
      best = i;
      best_load = load;
    }
  }
  return best;
}

std::size_t ShardedPool::load(std::size_t i) const noexcept {
  if (placement_ != Placement::least_loaded || i >= pools_.size()) return 0;
  const std::int64_t placed = slot_at(i)->placed.load(std::memory_order_relaxed);
  return placed > 1 ? static_cast<std::size_t>(placed - 1) : 0;
}

void ShardedPool::refuse_self_wait(const char* call) const {
  // Its shards were created together: in a child of fork(), all of them or
  // none are the parent's.
  if (pools_.front()->inherited_by_fork()) {
    throw Error(Errc::would_deadlock, std::string("crew::ShardedPool::") + call +
                                          " in a child of fork() on a pool created before the "
                                          "fork: its workers are not there");
  }
  const detail::ShardSlot* first = slot_at(0);
  const detail::ShardSlot* cur = detail::t_shard;
  const std::less<const detail::ShardSlot*> before;
  if (cur == nullptr || before(cur, first) || !before(cur, first + pools_.size())) return;
  throw Error(Errc::would_deadlock, std::string("crew::ShardedPool::") + call +
                                        " called from a task of one of its shards: it would "
                                        "wait for itself");
}

ShutdownReport ShardedPool::shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout) {
  refuse_self_wait("shutdown()");
  std::vector<ShutdownReport> reports(pools_.size());
  on_every_shard(pools_.size(),
                 [&](std::size_t i) { reports[i] = pools_[i]->shutdown(mode, timeout); });
  return merge(reports);
}

ShutdownReport ShardedPool::shutdown() {
  refuse_self_wait("shutdown()");
  std::vector<ShutdownReport> reports(pools_.size());
  on_every_shard(pools_.size(), [&](std::size_t i) { reports[i] = pools_[i]->shutdown(); });
  return merge(reports);
}

bool ShardedPool::restart() {
  bool all = true;
  for (const auto& p : pools_) all = p->restart() && all;
  return all;
}

void ShardedPool::pause() {
  for (const auto& p : pools_) p->pause();
}

void ShardedPool::resume() {
  for (const auto& p : pools_) p->resume();
}

bool ShardedPool::wait_idle(std::chrono::nanoseconds timeout) {
  refuse_self_wait("wait_idle()");
  std::vector<char> idle(pools_.size(), 0);
  on_every_shard(pools_.size(),
                 [&](std::size_t i) { idle[i] = pools_[i]->wait_idle(timeout) ? 1 : 0; });
  return std::all_of(idle.begin(), idle.end(), [](char c) { return c != 0; });
}

PoolStats ShardedPool::stats() const {
  PoolStats total;
  bool same = true, stopping = false, down = false, up = false, timeout = false;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    const PoolStats s = pools_[i]->stats();
    if (i == 0) total.state = s.state;
    same = same && s.state == total.state;
    stopping = stopping || s.state == PoolState::stopping;
    down = down || s.state == PoolState::stopped || s.state == PoolState::stopped_timeout;
    up = up || s.state < PoolState::stopping;
    timeout = timeout || s.state == PoolState::stopped_timeout;
    total.workers += s.workers;
    total.idle += s.idle;
    total.busy += s.busy;
    total.max_workers += s.max_workers;
    total.queued += s.queued;
    total.blocked_submitters += s.blocked_submitters;
    total.submitted += s.submitted;
    total.outcomes += s.outcomes;
    total.abandoned += s.abandoned;
    total.workers_replaced += s.workers_replaced;
    total.helped += s.helped;
  }
  if (!same) {
    if (stopping || (down && up)) {
      total.state = PoolState::stopping;
    } else if (down) {
      total.state = timeout ? PoolState::stopped_timeout : PoolState::stopped;
    } else {
      total.state = PoolState::running;  // running, paused or created
    }
  }
  return total;
}

std::vector<PoolStats> ShardedPool::shard_stats() const {
  std::vector<PoolStats> out;
  out.reserve(pools_.size());
  for (const auto& p : pools_) out.push_back(p->stats());
  return out;
}

}  // namespace crew
