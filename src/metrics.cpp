// The Prometheus exporter (crew/metrics.hpp).
//
// Data flow:
//   pool threads  --events-->  PoolObserver  -->  this thread's Shard of the
//                              pool's PoolSeries (single writer, relaxed
//                              load + store, no lock)
//   scraper       --Collect()-->  sums every Shard of every PoolSeries under
//                                 the series' mutex, reads gauges through
//                                 the watched pools' PoolStatsHandles
//
// A Shard holds one Block of counters per task-name slot, allocated by its
// owner on first use and published with a release store. A thread finds its
// Shard through a one-entry thread-local cache keyed by the series' uid; its
// first event in a series binds a Shard (reusing one left by an exited
// thread), and its exit hands the Shard back, so shards do not pile up as
// elastic workers come and go. Counts are never lost: a reused Shard keeps
// its totals.
#include "crew/metrics.hpp"

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "crew/error.hpp"
#include "crew/pool.hpp"

namespace crew {
namespace detail::prom {
namespace {

constexpr std::size_t kMaxTaskNamesLimit = 10'000;

// Outcome label values, in Block order.
constexpr std::size_t kOutcomes = 5;
constexpr std::array<TaskStatus, kOutcomes> kOutcomeOrder = {
    TaskStatus::succeeded, TaskStatus::failed, TaskStatus::cancelled, TaskStatus::timed_out,
    TaskStatus::rejected};

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
    case TaskStatus::queued:
    case TaskStatus::running:
      break;
  }
  return kOutcomes;  // not an outcome: ignored
}

using Counter = std::atomic<std::uint64_t>;

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

// Replaces bytes that are not well-formed UTF-8 with U+FFFD: label values
// must be UTF-8, and a task name is arbitrary bytes.
std::string utf8_label(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // at most U+10FFFF
    }
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      const unsigned char b = p[i + k];
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

// Where each counter sits in a Block, and the bucket bounds. Shared by all
// pools of one PrometheusMetrics.
struct Layout {
  static constexpr std::size_t kDurationSum = kOutcomes;  // ns
  static constexpr std::size_t kWaitSum = kOutcomes + 1;  // ns
  static constexpr std::size_t kDurationBuckets = kOutcomes + 2;

  explicit Layout(const MetricsOptions& o)
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

// Task name -> slot. Slot 0 is task="unnamed", slot 1 task="other", then one
// per distinct label value, at most max_names of them. An insert-only open
// addressing table with at least twice the slots it will ever hold, whose
// entries are published with release stores: lookups take no lock, and once
// the table is full a new name goes to "other" without one either.
class NameTable {
 public:
  static constexpr std::uint32_t kUnnamed = 0;
  static constexpr std::uint32_t kOther = 1;

  explicit NameTable(std::size_t max_names)
      : max_names_(max_names),
        capacity_(std::bit_ceil(std::max<std::size_t>(8, 2 * (max_names + 2)))),
        table_(new std::atomic<const Entry*>[capacity_]()) {
    MutexLock lock(mu_);
    labels_ = {"unnamed", "other"};
    by_label_.emplace("unnamed", kUnnamed);
    by_label_.emplace("other", kOther);
    insert_locked(std::make_unique<Entry>(Entry{"unnamed", hash("unnamed"), kUnnamed}));
    insert_locked(std::make_unique<Entry>(Entry{"other", hash("other"), kOther}));
    full_.store(max_names_ == 0, std::memory_order_relaxed);
  }
  NameTable(const NameTable&) = delete;
  NameTable& operator=(const NameTable&) = delete;

  [[nodiscard]] std::size_t slots() const noexcept { return max_names_ + 2; }

  // Hot path. Out of memory on a new name counts it under "other".
  std::uint32_t slot_of(std::string_view name) noexcept {
    return name.empty() ? kUnnamed : named_slot(name);
  }

  // The label value of each slot in use, by slot.
  std::vector<std::string> labels() const {
    MutexLock lock(mu_);
    return labels_;
  }

 private:
  struct Entry {
    std::string name;
    std::size_t hash;
    std::uint32_t slot;
  };

  [[gnu::noinline]] std::uint32_t named_slot(std::string_view name) noexcept {
    const std::size_t h = hash(name);
    if (const Entry* e = find(name, h)) return e->slot;
    if (full_.load(std::memory_order_acquire)) return kOther;
    try {
      return add(name, h);
    } catch (...) {
      return kOther;
    }
  }

  static std::size_t hash(std::string_view s) noexcept { return std::hash<std::string_view>{}(s); }

  const Entry* find(std::string_view name, std::size_t h) const noexcept {
    for (std::size_t i = h & (capacity_ - 1);; i = (i + 1) & (capacity_ - 1)) {
      const Entry* e = table_[i].load(std::memory_order_acquire);
      if (e == nullptr) return nullptr;
      if (e->hash == h && e->name == name) return e;
    }
  }

  std::uint32_t add(std::string_view name, std::size_t h) {
    MutexLock lock(mu_);
    if (const Entry* e = find(name, h)) return e->slot;  // added meanwhile
    if (names_ >= max_names_) return kOther;
    // Names that differ only in bytes that are not UTF-8 share a label.
    std::string label = utf8_label(name);
    auto [it, fresh] = by_label_.try_emplace(label, static_cast<std::uint32_t>(labels_.size()));
    if (fresh) labels_.push_back(std::move(label));
    const std::uint32_t slot = it->second;
    insert_locked(std::make_unique<Entry>(Entry{std::string(name), h, slot}));
    if (++names_ == max_names_) full_.store(true, std::memory_order_release);
    return slot;
  }

  void insert_locked(std::unique_ptr<Entry> e) CREW_REQUIRES(mu_) {
    std::size_t i = e->hash & (capacity_ - 1);
    while (table_[i].load(std::memory_order_relaxed) != nullptr) i = (i + 1) & (capacity_ - 1);
    entries_.push_back(std::move(e));
    table_[i].store(entries_.back().get(), std::memory_order_release);
  }

  const std::size_t max_names_;
  const std::size_t capacity_;  // a power of two > 2 x the entries it will hold
  const std::unique_ptr<std::atomic<const Entry*>[]> table_;
  std::atomic<bool> full_{false};
  mutable Mutex mu_;
  std::size_t names_ CREW_GUARDED_BY(mu_) = 0;  // entries besides the two reserved
  std::vector<std::unique_ptr<Entry>> entries_ CREW_GUARDED_BY(mu_);  // owns table_'s entries
  std::vector<std::string> labels_ CREW_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::uint32_t> by_label_ CREW_GUARDED_BY(mu_);
};

namespace {

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

}  // namespace

// One pool's counters, written by its observers and read by Collect().
class PoolSeries : public std::enable_shared_from_this<PoolSeries> {
 public:
  PoolSeries(std::string name, std::shared_ptr<const Layout> layout)
      : name_(std::move(name)),
        layout_(std::move(layout)),
        duration_ns_(layout_->duration_ns),
        wait_ns_(layout_->wait_ns),
        wait_buckets_(layout_->wait_buckets),
        block_size_(layout_->block_size),
        names_(layout_->max_names),
        uid_(g_next_uid.fetch_add(1, std::memory_order_relaxed) + 1) {}

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  // Hot path: one task that ended. `wait` and `run` are null for a task
  // that never ran.
  void count(std::string_view task, TaskStatus outcome, const std::chrono::nanoseconds* wait,
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

  // Rare events: shared counters are fine.
  void count_replacement() noexcept { replacements_.fetch_add(1, std::memory_order_relaxed); }
  void count_abandonment() noexcept { abandoned_.fetch_add(1, std::memory_order_relaxed); }
  void mark_observed() noexcept { observed_.store(true, std::memory_order_relaxed); }

  void watch(const Pool* pool, PoolStatsHandle handle) {
    MutexLock lock(watch_mu_);
    std::erase_if(watched_, [](const Watched& w) { return !w.handle.read().has_value(); });
    // A live handle's pool is alive, so an equal address is the same pool.
    for (const Watched& w : watched_) {
      if (w.pool == pool) return;
    }
    watched_.push_back({pool, std::move(handle)});
  }

  // Hands a shard back when its thread exits.
  void release(Shard* shard) noexcept {
    MutexLock lock(mu_);
    free_.push_back(shard);  // reserved when the shard was made: cannot throw
  }

  // What Collect() exports for this pool.
  struct Totals {
    struct Slot {
      std::string label;
      std::vector<std::uint64_t> counts;  // a Block's worth, summed over shards
    };
    bool observed = false;
    std::vector<Slot> slots;  // the slots with any count, and "unnamed"
    std::optional<PoolStats> gauges;
    std::uint64_t replacements = 0;
    std::uint64_t abandoned = 0;
  };

  Totals totals() {
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
      } else {  // pools sharing a name: one set of series
        t.gauges->workers += s->workers;
        t.gauges->idle += s->idle;
        t.gauges->busy += s->busy;
        t.gauges->queued += s->queued;
        t.gauges->blocked_submitters += s->blocked_submitters;
      }
      live.push_back(std::move(w));
    }
    watched_ = std::move(live);
    return t;
  }

 private:
  struct Watched {
    const Pool* pool;  // identity only, never dereferenced
    PoolStatsHandle handle;
  };

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
  static thread_local ThreadShards t_bindings;

  // The slow path of count(): this thread's first event in this series, or
  // it alternates between pools.
  Shard* bind_shard() noexcept {
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

  Shard* acquire_shard() {
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

thread_local PoolSeries::ThreadShards PoolSeries::t_bindings;

namespace {

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

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

ClientMetric labelled(std::initializer_list<std::pair<const char*, std::string_view>> labels) {
  ClientMetric m;
  m.label.reserve(labels.size());
  for (const auto& [k, v] : labels) m.label.push_back({k, std::string(v)});
  return m;
}

// A histogram from per-bucket counts (not cumulative) and a sum in ns.
ClientMetric histogram(ClientMetric m, const std::vector<double>& bounds,
                       const std::uint64_t* buckets, std::uint64_t sum_ns) {
  std::uint64_t cumulative = 0;
  m.histogram.bucket.reserve(bounds.size() + 1);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    cumulative += buckets[i];
    m.histogram.bucket.push_back({cumulative, bounds[i]});
  }
  cumulative += buckets[bounds.size()];
  m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  // Divided, not multiplied by 1e-9 (inexact): 3352909 ns reads 0.003352909.
  m.histogram.sample_sum = static_cast<double>(sum_ns) / 1e9;
  return m;
}

// ---- the text exposition ----

// Room every number needs: the longest shortest-round-trip double
// ("-1.2345678901234567e-308") or int64 is 24 characters.
constexpr std::size_t kNumberRoom = 32;

// Shortest round-trip digits, in the style of printf's %g (and of
// TextSerializer, whose bucket bounds become `le` label values that queries
// match as strings): fixed notation for exponents -4 .. 15, so 0.0001, 60
// and integer counts read naturally; scientific otherwise (1e-05). Writes at
// most kNumberRoom characters at `p`.
char* put_number(char* p, double v) {
  const std::string_view special = std::isnan(v)   ? "NaN"
                                   : std::isinf(v) ? (v < 0 ? "-Inf" : "+Inf")
                                                   : std::string_view();
  if (!special.empty()) return std::copy(special.begin(), special.end(), p);
  auto r = std::to_chars(p, p + kNumberRoom, v, std::chars_format::scientific);
  const char* e = std::find(p, r.ptr, 'e');
  int exp = 0;
  if (e != r.ptr) std::from_chars(e + (e[1] == '+' ? 2 : 1), r.ptr, exp);
  if (exp >= -4 && exp < 16) r = std::to_chars(p, p + kNumberRoom, v, std::chars_format::fixed);
  return r.ptr;
}

char* put_number(char* p, std::uint64_t v) { return std::to_chars(p, p + kNumberRoom, v).ptr; }
char* put_number(char* p, std::int64_t v) { return std::to_chars(p, p + kNumberRoom, v).ptr; }

char* put(char* p, std::string_view s) {
  std::memcpy(p, s.data(), s.size());
  return p + s.size();
}

// Label values escape backslash, double quote and newline; HELP text
// backslash and newline. Runs without special characters are copied whole.
void append_escaped(std::string& out, std::string_view s, bool label) {
  const std::string_view special = label ? std::string_view("\\\n\"") : std::string_view("\\\n");
  for (std::size_t at = s.find_first_of(special); at != std::string_view::npos;
       at = s.find_first_of(special)) {
    out.append(s.substr(0, at));
    out += s[at] == '\n' ? "\\n" : s[at] == '"' ? "\\\"" : "\\\\";
    s.remove_prefix(at + 1);
  }
  out.append(s);
}

// A metric's labels as `a="x",b="y"`, rendered once for all its lines.
void render_labels(std::string& out, const ClientMetric& m) {
  out.clear();
  for (const ClientMetric::Label& l : m.label) {
    if (!out.empty()) out += ',';
    out += l.name;
    out += "=\"";
    append_escaped(out, l.value, true);
    out += '"';
  }
}

// Appends lines to a string through a raw pointer: each line makes room for
// its longest form first, then copies without a check per character.
class LineWriter {
 public:
  explicit LineWriter(std::string& out) : out_(out), used_(out.size()) {}
  ~LineWriter() { out_.resize(used_); }
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;

  // At least `n` writable bytes at the returned position.
  char* room(std::size_t n) {
    if (out_.size() - used_ < n) out_.resize(std::max(2 * out_.size(), used_ + n));
    return out_.data() + used_;
  }
  void done(char* end) { used_ = static_cast<std::size_t>(end - out_.data()); }

  // `name[suffix]{labels[,extra="value"]} value[ timestamp]\n`; `labels`
  // comes from render_labels, `extra_value` is already formatted.
  template <class V>
  void sample(const std::string& name, std::string_view suffix, std::string_view labels,
              const ClientMetric& m, V value, std::string_view extra = {},
              std::string_view extra_value = {}) {
    char* p = room(name.size() + suffix.size() + labels.size() + extra.size() + extra_value.size() +
                   2 * kNumberRoom + 8);
    p = put(p, name);
    p = put(p, suffix);
    if (!labels.empty() || !extra.empty()) {
      *p++ = '{';
      p = put(p, labels);
      if (!extra.empty()) {
        if (!labels.empty()) *p++ = ',';
        p = put(p, extra);
        p = put(p, "=\"");
        p = put(p, extra_value);
        *p++ = '"';
      }
      *p++ = '}';
    }
    *p++ = ' ';
    p = put_number(p, value);
    if (m.timestamp_ms != 0) {
      *p++ = ' ';
      p = put_number(p, static_cast<std::int64_t>(m.timestamp_ms));
    }
    *p++ = '\n';
    done(p);
  }

 private:
  std::string& out_;
  std::size_t used_;  // bytes of out_ written; the rest is room
};

// A bound formatted once per family: the histograms of a family usually
// share their buckets.
class BoundText {
 public:
  std::string_view operator()(std::size_t i, double bound) {
    if (i >= text_.size()) {
      text_.resize(i + 1);
      value_.resize(i + 1, std::numeric_limits<double>::quiet_NaN());
    }
    if (!(value_[i] == bound)) {  // NaN never matches: formatted each time
      char buf[kNumberRoom];
      text_[i].assign(buf, put_number(buf, bound));
      value_[i] = bound;
    }
    return text_[i];
  }

 private:
  std::vector<std::string> text_;
  std::vector<double> value_;
};

// An upper estimate of the text's size, so that the output grows once.
std::size_t estimated_size(const std::vector<prometheus::MetricFamily>& families) {
  std::size_t bytes = 0;
  for (const prometheus::MetricFamily& f : families) {
    bytes += 2 * f.name.size() + f.help.size() + 32;
    for (const ClientMetric& m : f.metric) {
      std::size_t line = f.name.size() + 48;  // suffix, braces, value, timestamp
      for (const ClientMetric::Label& l : m.label) line += l.name.size() + l.value.size() + 4;
      std::size_t lines = 1;
      if (f.type == MetricType::Histogram) lines = m.histogram.bucket.size() + 2;
      if (f.type == MetricType::Summary) lines = m.summary.quantile.size() + 2;
      bytes += lines * (line + 32);  // + an extra label
    }
  }
  return bytes;
}

std::string_view type_name(MetricType t) {
  switch (t) {
    case MetricType::Counter:
      return "counter";
    case MetricType::Gauge:
      return "gauge";
    case MetricType::Summary:
      return "summary";
    case MetricType::Histogram:
      return "histogram";
    case MetricType::Untyped:
      break;
  }
  return "untyped";
}

}  // namespace
}  // namespace detail::prom

namespace prom = detail::prom;

void append_text_exposition(std::string& out,
                            const std::vector<prometheus::MetricFamily>& families) {
  using prometheus::MetricType;
  out.reserve(out.size() + prom::estimated_size(families));
  std::string help;
  std::string labels;
  prom::LineWriter w(out);
  for (const prometheus::MetricFamily& f : families) {
    help.clear();
    prom::append_escaped(help, f.help, false);
    const std::string_view type = prom::type_name(f.type);
    char* p = w.room(2 * f.name.size() + help.size() + type.size() + 20);
    p = prom::put(p, "# HELP ");
    p = prom::put(p, f.name);
    *p++ = ' ';
    p = prom::put(p, help);
    p = prom::put(p, "\n# TYPE ");
    p = prom::put(p, f.name);
    *p++ = ' ';
    p = prom::put(p, type);
    *p++ = '\n';
    w.done(p);
    prom::BoundText bounds;
    for (const prometheus::ClientMetric& m : f.metric) {
      prom::render_labels(labels, m);
      switch (f.type) {
        case MetricType::Counter:
          w.sample(f.name, "", labels, m, m.counter.value);
          break;
        case MetricType::Gauge:
          w.sample(f.name, "", labels, m, m.gauge.value);
          break;
        case MetricType::Untyped:
          w.sample(f.name, "", labels, m, m.untyped.value);
          break;
        case MetricType::Summary:
          w.sample(f.name, "_count", labels, m, m.summary.sample_count);
          w.sample(f.name, "_sum", labels, m, m.summary.sample_sum);
          for (std::size_t i = 0; i < m.summary.quantile.size(); ++i) {
            const auto& q = m.summary.quantile[i];
            w.sample(f.name, "", labels, m, q.value, "quantile", bounds(i, q.quantile));
          }
          break;
        case MetricType::Histogram:
          w.sample(f.name, "_count", labels, m, m.histogram.sample_count);
          w.sample(f.name, "_sum", labels, m, m.histogram.sample_sum);
          for (std::size_t i = 0; i < m.histogram.bucket.size(); ++i) {
            const auto& b = m.histogram.bucket[i];
            w.sample(f.name, "_bucket", labels, m, b.cumulative_count, "le",
                     bounds(i, b.upper_bound));
          }
          break;
      }
    }
  }
}

std::string text_exposition(const std::vector<prometheus::MetricFamily>& families) {
  std::string out;
  append_text_exposition(out, families);
  return out;
}

std::vector<double> default_time_buckets() {
  return {10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 0.1,   0.25,  0.5,    1,      2.5,    5,    10,     30,   60};
}

PrometheusMetrics::PrometheusMetrics(MetricsOptions options)
    : options_(std::move(options)), layout_(std::make_shared<const prom::Layout>(options_)) {}

PrometheusMetrics::~PrometheusMetrics() = default;

std::shared_ptr<prom::PoolSeries> PrometheusMetrics::series_for(std::string_view pool) {
  if (pool.empty()) throw Error(Errc::invalid_options, "crew::PrometheusMetrics: empty pool name");
  detail::MutexLock lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) {
    it = pools_
             .emplace(std::string(pool),
                      std::make_shared<prom::PoolSeries>(std::string(pool), layout_))
             .first;
  }
  return it->second;
}

std::shared_ptr<Observer> PrometheusMetrics::observer(std::string_view pool) {
  std::shared_ptr<prom::PoolSeries> series = series_for(pool);
  series->mark_observed();
  return std::make_shared<prom::PoolObserver>(std::move(series));
}

void PrometheusMetrics::watch(const Pool& pool) {
  series_for(pool.name())->watch(&pool, pool.stats_handle());
}

std::vector<prometheus::MetricFamily> PrometheusMetrics::Collect() const {
  using prom::labelled;
  using prom::Layout;
  using prometheus::MetricType;

  std::vector<std::shared_ptr<prom::PoolSeries>> pools;
  {
    detail::MutexLock lock(mu_);
    for (const auto& [name, series] : pools_) pools.push_back(series);
  }

  auto workers =
      prom::family("crew_workers", "Worker threads of the pool by state.", MetricType::Gauge);
  auto queue =
      prom::family("crew_queue_length", "Tasks waiting in the pool's queue.", MetricType::Gauge);
  auto blocked = prom::family("crew_submit_blocked",
                              "Callers blocked in a submission, waiting for room in the queue.",
                              MetricType::Gauge);
  auto tasks = prom::family("crew_tasks_total", "Tasks that ended, by task name and outcome.",
                            MetricType::Counter);
  auto duration = prom::family("crew_task_duration_seconds",
                               "Run time of tasks that ran, by task name.", MetricType::Histogram);
  auto wait = prom::family("crew_task_queue_wait_seconds",
                           "Time tasks that ran spent queued before they started, by task name.",
                           MetricType::Histogram);
  auto replaced = prom::family("crew_worker_replacements_total",
                               "Workers started to replace one that died or was abandoned.",
                               MetricType::Counter);
  auto abandoned = prom::family(
      "crew_tasks_abandoned_total",
      "Tasks written off while still running past their deadline or stop plus the grace period.",
      MetricType::Counter);

  for (const auto& series : pools) {
    const std::string& pool = series->name();
    const prom::PoolSeries::Totals t = series->totals();
    if (t.gauges) {
      const PoolStats& s = *t.gauges;
      const std::size_t other = s.workers - std::min(s.workers, s.idle + s.busy);
      for (const auto& [state, n] : {std::pair{"busy", s.busy}, std::pair{"idle", s.idle},
                                     std::pair{"starting_or_stopping", other}}) {
        auto m = labelled({{"pool", pool}, {"state", state}});
        m.gauge.value = static_cast<double>(n);
        workers.metric.push_back(std::move(m));
      }
      auto q = labelled({{"pool", pool}});
      q.gauge.value = static_cast<double>(s.queued);
      queue.metric.push_back(q);
      q.gauge.value = static_cast<double>(s.blocked_submitters);
      blocked.metric.push_back(std::move(q));
    }
    if (!t.observed) continue;
    const Layout& l = *layout_;
    for (const auto& slot : t.slots) {
      for (std::size_t o = 0; o < prom::kOutcomes; ++o) {
        auto m = labelled(
            {{"pool", pool}, {"task", slot.label}, {"outcome", to_string(prom::kOutcomeOrder[o])}});
        m.counter.value = static_cast<double>(slot.counts[o]);
        tasks.metric.push_back(std::move(m));
      }
      duration.metric.push_back(prom::histogram(
          labelled({{"pool", pool}, {"task", slot.label}}), l.duration_bounds,
          &slot.counts[Layout::kDurationBuckets], slot.counts[Layout::kDurationSum]));
      wait.metric.push_back(prom::histogram(labelled({{"pool", pool}, {"task", slot.label}}),
                                            l.wait_bounds, &slot.counts[l.wait_buckets],
                                            slot.counts[Layout::kWaitSum]));
    }
    auto r = labelled({{"pool", pool}});
    r.counter.value = static_cast<double>(t.replacements);
    replaced.metric.push_back(r);
    r.counter.value = static_cast<double>(t.abandoned);
    abandoned.metric.push_back(std::move(r));
  }

  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&workers, &queue, &blocked, &tasks, &duration, &wait, &replaced, &abandoned}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace crew
