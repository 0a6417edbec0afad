// One pool's counters and the observer that writes them
// (src/metrics/metrics_series.hpp has the data flow and which thread touches what).
#include "metrics_series.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "crew/error.hpp"

namespace crew::detail::prom {
namespace {

constexpr std::size_t kMaxTaskNamesLimit = 10'000;

constexpr std::size_t outcome_index(TaskStatus s) noexcept {
  switch (s) {
    case TaskStatus::succeeded:
      return 0;
    case TaskStatus::failed:
      return 1;
    case TaskStatus::cancelled:
      return 2;
    case TaskStatus::timed_out:
      return 3;
    case TaskStatus::rejected:
      return 4;
    case TaskStatus::shed:
      return 5;
    case TaskStatus::queued:
    case TaskStatus::running:
      break;
  }
  return kOutcomes;  // not an outcome: ignored
}

// Adds to a counter that only the calling thread writes. A plain load and
// store: no locked instruction, and readers see either value.
inline void bump(Counter& c, std::uint64_t by = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

[[noreturn]] void invalid(const std::string& field, const std::string& why) {
  throw Error(Errc::invalid_options, "crew::MetricsOptions." + field + ": " + why);
}

std::vector<std::int64_t> to_ns(const std::vector<double>& bounds, const char* field) {
  if (bounds.empty()) invalid(field, "must list at least one bucket");
  std::vector<std::int64_t> ns;
  ns.reserve(bounds.size());
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    const double b = bounds[i];
    const std::string at = "[" + std::to_string(i) + "] = " + std::to_string(b);
    // 1e7 s (116 days) keeps the nanosecond count far from int64 overflow.
    if (!std::isfinite(b) || b < 1e-9 || b > 1e7) {
      invalid(field, at + " is outside 1e-9 .. 1e7 seconds (+Inf is implicit)");
    }
    ns.push_back(std::llround(b * 1e9));
    if (i > 0 && ns[i] <= ns[i - 1]) {
      invalid(field, at + " does not increase (by at least 1 ns) on the previous bucket");
    }
  }
  return ns;
}

// Every PoolSeries gets a uid never reused in the process, so that a
// thread's cached shard can never be mistaken for one of a later series at
// the same address.
std::atomic<std::uint64_t> g_next_uid{0};

// The shard this thread used last, and for which series. Trivially
// destructible, so reading it costs no thread-local guard.
struct LastShard {
  std::uint64_t uid = 0;
  Shard* shard = nullptr;
};
constinit thread_local LastShard t_last{};
constinit thread_local bool t_exiting = false;

// The calling thread's bindings: series -> shard, released at its exit.
struct ThreadShards {
  struct Binding {
    std::uint64_t uid;
    std::weak_ptr<PoolSeries> series;
    Shard* shard;
  };
  std::vector<Binding> bindings;
  ThreadShards() = default;
  ThreadShards(const ThreadShards&) = delete;
  ThreadShards& operator=(const ThreadShards&) = delete;
  ~ThreadShards() {
    t_exiting = true;  // later events on this thread are not counted
    t_last = {};
    for (const Binding& b : bindings) {
      if (const std::shared_ptr<PoolSeries> s = b.series.lock()) s->release(b.shard);
    }
  }
};
thread_local ThreadShards t_bindings;

// The observer installed in a pool: forwards the events the metrics need.
class PoolObserver final : public Observer {
 public:
  explicit PoolObserver(std::shared_ptr<PoolSeries> series) : series_(std::move(series)) {}

  // No task_enqueued or task_started: task_finished carries both times.
  [[nodiscard]] std::uint32_t events() const noexcept override {
    return task_finished | task_rejected | worker_events;
  }
  void on_task_finished(const TaskEvent& task, TaskStatus outcome,
                        std::chrono::nanoseconds queue_wait,
                        std::chrono::nanoseconds run_time) noexcept override {
    series_->count(task.name, outcome, &queue_wait, &run_time);
  }
  void on_task_rejected(const TaskEvent& task, TaskStatus outcome, Errc /*reason*/,
                        Admission /*admission*/) noexcept override {
    series_->count(task.name, outcome, nullptr, nullptr);
  }
  void on_worker_replaced(std::string_view /*pool*/, std::uint64_t /*worker*/) noexcept override {
    series_->count_replacement();
  }
  void on_worker_abandoned(std::string_view /*pool*/, std::uint64_t /*worker*/,
                           const TaskEvent& /*task*/) noexcept override {
    series_->count_abandonment();
  }

 private:
  const std::shared_ptr<PoolSeries> series_;
};

}  // namespace

Layout::Layout(const MetricsOptions& o)
    : duration_bounds(o.duration_buckets),
      wait_bounds(o.queue_wait_buckets),
      duration_ns(to_ns(o.duration_buckets, "duration_buckets")),
      wait_ns(to_ns(o.queue_wait_buckets, "queue_wait_buckets")),
      max_names(o.max_task_names),
      wait_buckets(kDurationBuckets + duration_ns.size() + 1),
      block_size(wait_buckets + wait_ns.size() + 1) {
  if (max_names > kMaxTaskNamesLimit) {
    invalid("max_task_names", std::to_string(max_names) + " exceeds the limit of " +
                                  std::to_string(kMaxTaskNamesLimit));
  }
}

PoolSeries::PoolSeries(std::string name, std::shared_ptr<const Layout> layout)
    : name_(std::move(name)),
      layout_(std::move(layout)),
      duration_ns_(layout_->duration_ns),
      wait_ns_(layout_->wait_ns),
      wait_buckets_(layout_->wait_buckets),
      block_size_(layout_->block_size),
      names_(layout_->max_names),
      uid_(g_next_uid.fetch_add(1, std::memory_order_relaxed) + 1) {}

void PoolSeries::count(std::string_view task, TaskStatus outcome,
                       const std::chrono::nanoseconds* wait,
                       const std::chrono::nanoseconds* run) noexcept {
  const std::size_t o = outcome_index(outcome);
  if (o == kOutcomes) return;
  Shard* shard = t_last.uid == uid_ ? t_last.shard : bind_shard();
  if (shard == nullptr) [[unlikely]]
    return;
  Counter* b = shard->block(names_.slot_of(task), block_size_);
  if (b == nullptr) [[unlikely]]
    return;
  bump(b[o]);
  if (run != nullptr) {
    const std::int64_t r = std::max<std::int64_t>(run->count(), 0);
    const std::int64_t w = std::max<std::int64_t>(wait->count(), 0);
    bump(b[Layout::kDurationSum], static_cast<std::uint64_t>(r));
    bump(b[Layout::kDurationBuckets + Layout::bucket(duration_ns_, r)]);
    bump(b[Layout::kWaitSum], static_cast<std::uint64_t>(w));
    bump(b[wait_buckets_ + Layout::bucket(wait_ns_, w)]);
  }
}

void PoolSeries::watch(const Pool* pool, PoolStatsHandle handle, std::size_t queue_capacity) {
  MutexLock lock(watch_mu_);
  std::erase_if(watched_, [](const Watched& w) { return !w.handle.read().has_value(); });
  // A live handle's pool is alive, so an equal address is the same pool.
  for (const Watched& w : watched_) {
    if (w.pool == pool) return;
  }
  watched_.push_back({pool, std::move(handle), queue_capacity});
}

void PoolSeries::release(Shard* shard) noexcept {
  MutexLock lock(mu_);
  free_.push_back(shard);  // reserved when the shard was made: cannot throw
}

PoolSeries::Totals PoolSeries::totals() {
  Totals t;
  t.observed = observed_.load(std::memory_order_relaxed);
  t.replacements = replacements_.load(std::memory_order_relaxed);
  t.abandoned = abandoned_.load(std::memory_order_relaxed);
  const std::vector<std::string> labels = names_.labels();
  const std::size_t size = block_size_;
  {
    MutexLock lock(mu_);
    for (std::size_t slot = 0; t.observed && slot < labels.size(); ++slot) {
      std::vector<std::uint64_t> sum(size, 0);
      bool any = slot == NameTable::kUnnamed;
      for (const auto& shard : shards_) {
        const Counter* b = shard->published(slot);
        if (b == nullptr) continue;
        any = true;
        for (std::size_t k = 0; k < size; ++k) sum[k] += b[k].load(std::memory_order_relaxed);
      }
      if (any) t.slots.push_back({labels[slot], std::move(sum)});
    }
  }
  MutexLock lock(watch_mu_);
  std::vector<Watched> live;
  for (Watched& w : watched_) {
    std::optional<PoolStats> s = w.handle.read();
    if (!s) continue;
    if (!t.gauges) {
      t.gauges = *s;
      t.queue_capacity = w.queue_capacity;
    } else {  // pools sharing a name: one set of series
      t.gauges->workers += s->workers;
      t.gauges->idle += s->idle;
      t.gauges->busy += s->busy;
      t.gauges->max_workers += s->max_workers;
      t.gauges->queued += s->queued;
      t.gauges->blocked_submitters += s->blocked_submitters;
      if (t.queue_capacity) *t.queue_capacity += w.queue_capacity;
    }
    if (w.queue_capacity == kUnbounded) t.queue_capacity.reset();
    for (const WorkerInfo& info : w.handle.workers().value_or(std::vector<WorkerInfo>{})) {
      if (info.overdue_for.count() > 0) ++t.overdue;
      t.running_age_max = std::max(t.running_age_max, info.running_for);
    }
    live.push_back(std::move(w));
  }
  watched_ = std::move(live);
  return t;
}

Shard* PoolSeries::bind_shard() noexcept {
  if (t_exiting) return nullptr;
  try {
    ThreadShards& mine = t_bindings;
    Shard* found = nullptr;
    std::erase_if(mine.bindings, [&](const ThreadShards::Binding& b) {
      if (b.uid == uid_) found = b.shard;
      return b.series.expired();
    });
    if (found == nullptr) {
      mine.bindings.reserve(mine.bindings.size() + 1);
      found = acquire_shard();
      mine.bindings.push_back({uid_, weak_from_this(), found});
    }
    t_last = {uid_, found};
    return found;
  } catch (...) {  // out of memory: this event is not counted
    return nullptr;
  }
}

Shard* PoolSeries::acquire_shard() {
  MutexLock lock(mu_);
  if (!free_.empty()) {
    Shard* s = free_.back();
    free_.pop_back();
    return s;
  }
  free_.reserve(shards_.size() + 1);  // so that release() cannot throw
  shards_.push_back(std::make_unique<Shard>(names_.slots()));
  return shards_.back().get();
}

std::shared_ptr<Observer> make_observer(std::shared_ptr<PoolSeries> series) {
  return std::make_shared<PoolObserver>(std::move(series));
}

}  // namespace crew::detail::prom
