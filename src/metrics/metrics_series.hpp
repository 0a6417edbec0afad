// One pool's metrics as crew::PrometheusMetrics keeps them (internal to
// crew::metrics): the counter shards its observers write and the scrape
// reads, and the gauges of the pools watched under its name.
//
// Data flow:
//   pool threads  --events-->  the observer from make_observer()  -->  the
//                              calling thread's Shard of the PoolSeries
//                              (single writer, relaxed load + store, no lock)
//   scraper       --totals()-->  sums every Shard under mu_, reads the
//                                watched pools' PoolStatsHandles under
//                                watch_mu_
//
// A Shard holds one Block of counters per task-name slot (NameTable,
// src/metrics/metrics_names.hpp), allocated by its owner on first use and published
// with a release store; Layout says where each counter sits in a Block. A
// thread finds its Shard through a one-entry thread-local cache keyed by the
// series' uid; its first event in a series binds a Shard (reusing one left
// by an exited thread), and its exit hands the Shard back, so shards do not
// pile up as elastic workers come and go. Counts are never lost: a reused
// Shard keeps its totals.
//
// Threads: the observer's callbacks run on the pool's threads (workers,
// submitters, the supervisor) for as long as the pool reports events; they
// write only their own Shard and, rarely, the shared replacement and
// abandonment counters. totals() runs on any scraping thread, concurrently
// with them. The observer keeps its PoolSeries alive, so a pool may outlive
// the PrometheusMetrics that made it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crew/detail/mutex.hpp"
#include "crew/metrics.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "metrics_names.hpp"

namespace crew::detail::prom {

// Outcome label values, in Block order.
inline constexpr std::size_t kOutcomes = 6;
inline constexpr std::array<TaskStatus, kOutcomes> kOutcomeOrder = {
    TaskStatus::succeeded, TaskStatus::failed,   TaskStatus::cancelled,
    TaskStatus::timed_out, TaskStatus::rejected, TaskStatus::shed};

using Counter = std::atomic<std::uint64_t>;

// Where each counter sits in a Block, and the bucket bounds. Shared by all
// pools of one PrometheusMetrics; immutable once built.
struct Layout {
  static constexpr std::size_t kDurationSum = kOutcomes;  // ns
  static constexpr std::size_t kWaitSum = kOutcomes + 1;  // ns
  static constexpr std::size_t kDurationBuckets = kOutcomes + 2;

  // Throws Error(invalid_options) naming the bad field of `o`.
  explicit Layout(const MetricsOptions& o);

  // The bucket of an observation: the first upper bound >= ns, or +Inf
  // (index bounds.size()), as Prometheus' `le` is inclusive. A linear scan
  // from the smallest bound: one well-predicted compare for the short tasks
  // whose overhead matters, ~20 for a task of a minute.
  static std::size_t bucket(std::span<const std::int64_t> bounds, std::int64_t ns) noexcept {
    std::size_t i = 0;
    while (i < bounds.size() && ns > bounds[i]) ++i;
    return i;
  }

  const std::vector<double> duration_bounds;  // seconds, as given
  const std::vector<double> wait_bounds;
  const std::vector<std::int64_t> duration_ns;  // the same in ns
  const std::vector<std::int64_t> wait_ns;
  const std::size_t max_names;
  const std::size_t wait_buckets;  // offset of the queue-wait buckets
  const std::size_t block_size;
};

// The counters one thread writes for one pool: a Block per task-name slot.
// Written by its owner only; read by scrapes.
class Shard {
 public:
  explicit Shard(std::size_t slots) : blocks_(new std::atomic<Counter*>[slots]()), slots_(slots) {}
  ~Shard() {
    for (std::size_t i = 0; i < slots_; ++i) {
      ::operator delete[](blocks_[i].load(std::memory_order_relaxed), kLine);
    }
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Owner only. Null if out of memory (the event is then not counted).
  Counter* block(std::size_t slot, std::size_t size) noexcept {
    Counter* b = blocks_[slot].load(std::memory_order_relaxed);
    return b != nullptr ? b : make_block(slot, size);
  }
  // Scrapers: the block of `slot` if its owner has published one.
  const Counter* published(std::size_t slot) const noexcept {
    return blocks_[slot].load(std::memory_order_acquire);
  }

 private:
  // Blocks start on a cache line of their own and fill whole lines, so two
  // threads' blocks never share one.
  static constexpr std::align_val_t kLine{64};

  // Out of line, so that block() stays a load and a test.
  [[gnu::noinline]] Counter* make_block(std::size_t slot, std::size_t size) noexcept {
    const std::size_t bytes = (size * sizeof(Counter) + 63) / 64 * 64;
    void* raw = ::operator new[](bytes, kLine, std::nothrow);
    if (raw == nullptr) return nullptr;
    Counter* b = static_cast<Counter*>(raw);
    std::uninitialized_value_construct_n(b, size);  // zeros
    blocks_[slot].store(b, std::memory_order_release);
    return b;
  }

  std::unique_ptr<std::atomic<Counter*>[]> blocks_;
  std::size_t slots_;
};

// One pool's counters, written by its observers and read by Collect().
class PoolSeries : public std::enable_shared_from_this<PoolSeries> {
 public:
  PoolSeries(std::string name, std::shared_ptr<const Layout> layout);

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  // Hot path: one task that ended. `wait` and `run` are null for a task
  // that never ran. Any thread; writes the calling thread's Shard.
  void count(std::string_view task, TaskStatus outcome, const std::chrono::nanoseconds* wait,
             const std::chrono::nanoseconds* run) noexcept;

  // Rare events: shared counters are fine.
  void count_replacement() noexcept { replacements_.fetch_add(1, std::memory_order_relaxed); }
  void count_abandonment() noexcept { abandoned_.fetch_add(1, std::memory_order_relaxed); }
  void mark_observed() noexcept { observed_.store(true, std::memory_order_relaxed); }

  // Exports `pool`'s gauges through `handle` until the pool is destroyed.
  // `queue_capacity`: the tasks its queue holds at most, kUnbounded for no
  // bound (options are fixed at construction, so read once here).
  void watch(const Pool* pool, PoolStatsHandle handle, std::size_t queue_capacity);

  // Hands a shard back when its thread exits.
  void release(Shard* shard) noexcept;

  // What Collect() exports for this pool.
  struct Totals {
    struct Slot {
      std::string label;
      std::vector<std::uint64_t> counts;  // a Block's worth, summed over shards
    };
    bool observed = false;
    std::vector<Slot> slots;  // the slots with any count, and "unnamed"
    std::optional<PoolStats> gauges;
    // Only with gauges. Unknown when any pool of the name has no bound.
    std::optional<std::size_t> queue_capacity;
    std::size_t overdue = 0;  // tasks running past their deadline
    std::chrono::nanoseconds running_age_max{0};
    std::uint64_t replacements = 0;
    std::uint64_t abandoned = 0;
  };

  // Blocks on mu_ (observers binding a shard) and on the watched pools'
  // stats() and worker books (short locks), never on their hot paths.
  Totals totals();

 private:
  struct Watched {
    const Pool* pool;  // identity only, never dereferenced
    PoolStatsHandle handle;
    std::size_t queue_capacity;
  };

  // The slow path of count(): this thread's first event in this series, or
  // it alternates between pools.
  Shard* bind_shard() noexcept;
  Shard* acquire_shard();

  const std::string name_;
  const std::shared_ptr<const Layout> layout_;
  // The layout's hot fields, copied so that count() reads no other object.
  const std::span<const std::int64_t> duration_ns_;
  const std::span<const std::int64_t> wait_ns_;
  const std::size_t wait_buckets_;
  const std::size_t block_size_;
  NameTable names_;
  const std::uint64_t uid_;
  std::atomic<bool> observed_{false};  // an observer exists: export task series
  std::atomic<std::uint64_t> replacements_{0};
  std::atomic<std::uint64_t> abandoned_{0};
  // Taken by observers, sometimes with a pool's lock held: nothing that
  // locks a pool may run under it.
  Mutex mu_;
  std::vector<std::unique_ptr<Shard>> shards_ CREW_GUARDED_BY(mu_);
  std::vector<Shard*> free_ CREW_GUARDED_BY(mu_);  // left by exited threads
  // Taken by watch() and scrapes only, which read the pools' stats under it.
  Mutex watch_mu_;
  std::vector<Watched> watched_ CREW_GUARDED_BY(watch_mu_);
};

// The observer installed in a pool: forwards the events the metrics need
// (tasks finished and rejected, workers replaced and abandoned) to `series`.
// Its callbacks run on the pool's threads until the pool is destroyed.
[[nodiscard]] std::shared_ptr<Observer> make_observer(std::shared_ptr<PoolSeries> series);

}  // namespace crew::detail::prom
