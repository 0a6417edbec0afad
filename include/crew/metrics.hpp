// crew/metrics.hpp: Prometheus metrics for crew pools (target crew::metrics,
// built when prometheus-cpp is found; docs/metrics.md lists every metric).
//
// One PrometheusMetrics object is a prometheus::Collectable that exports the
// metrics of any number of pools, each family once with a `pool` label:
//
//   auto metrics = std::make_shared<crew::PrometheusMetrics>();
//   exposer.RegisterCollectable(metrics);          // prometheus-cpp pull
//   crew::Pool pool({.name = "compute", .observers = {metrics->observer("compute")}});
//   metrics->watch(pool);
//
// observer(pool) returns the Observer that counts and times the pool's tasks;
// it goes into PoolOptions::observers because observers are fixed when a pool
// is built. watch(pool) adds the gauges (workers and their maximum, queue
// length and capacity, blocked submitters, tasks past their deadline, the
// oldest running task's age), read through a PoolStatsHandle at scrape
// time, once the pool exists: the hot path pays nothing for them. Register
// the object next to your prometheus::Registry (both with the Exposer, or
// serialize both Collect() results): a Registry only holds families it
// built itself, and one collectable for all pools is what keeps each
// family's TYPE line unique in the exposition.
//
// Cost on the pool's hot path: the observer writes into a shard owned by the
// calling thread (one per thread and pool): plain relaxed loads and stores,
// no lock, no read-modify-write, no shared cache line. Collect() sums the
// shards. Each thread's first event in a pool, and the first sight of a task
// name, take a lock once. Asking for task_finished makes the pool read the
// clock for every task (queue wait and run time), which costs more than the
// counting; docs/metrics.md has the measured overhead.
//
// Task names: the first max_task_names distinct names get their own `task`
// label value; later names are counted under task="other". Unnamed tasks are
// counted under task="unnamed". A task named "other" or "unnamed" shares
// those series.
//
// Lifetimes: the observers keep the counters they write to alive, so a pool
// may outlive its PrometheusMetrics (its events are then counted but not
// exported). A PrometheusMetrics may outlive its pools: a destroyed pool's
// gauges disappear from the exposition, its counters stay (they never go
// back). Pools sharing a name share their series.
//
// Thread safety: all member functions are thread-safe; Collect() may run
// concurrently with the pools' work and with itself.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "crew/detail/mutex.hpp"
#include "crew/observer.hpp"

namespace crew {

class Pool;

// Histogram buckets from 10 us to 60 s (upper bounds in seconds, 1-2.5-5 steps).
[[nodiscard]] std::vector<double> default_time_buckets();

struct MetricsOptions {
  // Upper bounds in seconds, strictly increasing, each at least 1e-9 (one
  // nanosecond, the resolution of the observations). +Inf is implicit.
  std::vector<double> duration_buckets = default_time_buckets();
  std::vector<double> queue_wait_buckets = default_time_buckets();
  // Distinct task names exported per pool (at most 10,000); the rest are
  // counted under task="other". 0 counts every named task under "other".
  std::size_t max_task_names = 100;
};

// Appends the Prometheus text exposition format (version 0.0.4) of
// `families`: the lines prometheus::TextSerializer writes, in its order, with
// numbers in shortest round-trip form and HELP text escaped. Several times
// faster than TextSerializer (std::to_chars into one string instead of
// iostreams, each metric's labels rendered once for all its lines), which
// matters at tens of thousands of lines (docs/metrics.md). Serve with
// Content-Type "text/plain; version=0.0.4". Thread-safe.
void append_text_exposition(std::string& out,
                            const std::vector<prometheus::MetricFamily>& families);
[[nodiscard]] std::string text_exposition(const std::vector<prometheus::MetricFamily>& families);

namespace detail::prom {
struct Layout;     // bucket bounds and counter offsets (src/metrics/metrics_series.hpp)
class PoolSeries;  // one pool's counters
}  // namespace detail::prom

class PrometheusMetrics final : public prometheus::Collectable {
 public:
  // Throws crew::Error(Errc::invalid_options) naming the bad field.
  explicit PrometheusMetrics(MetricsOptions options = {});
  ~PrometheusMetrics() override;
  PrometheusMetrics(const PrometheusMetrics&) = delete;
  PrometheusMetrics& operator=(const PrometheusMetrics&) = delete;

  // An observer counting the tasks, worker replacements and abandonments of
  // the pool named `pool`; put it in that pool's PoolOptions::observers.
  // Calls with the same name share the series. Throws
  // Error(invalid_options) for an empty name.
  [[nodiscard]] std::shared_ptr<Observer> observer(std::string_view pool);

  // Exports `pool`'s gauges from now on (until it is destroyed), under its
  // name. Does not keep the pool alive.
  void watch(const Pool& pool);

  // The families crew_* for every pool seen so far. Blocks on the pools'
  // stats() (a short lock per watched pool), never on their hot paths.
  [[nodiscard]] std::vector<prometheus::MetricFamily> Collect() const override;

  [[nodiscard]] const MetricsOptions& options() const noexcept { return options_; }

 private:
  std::shared_ptr<detail::prom::PoolSeries> series_for(std::string_view pool);

  const MetricsOptions options_;
  const std::shared_ptr<const detail::prom::Layout> layout_;
  mutable detail::Mutex mu_;
  // By pool name, so the exposition is sorted by pool.
  std::map<std::string, std::shared_ptr<detail::prom::PoolSeries>, std::less<>> pools_
      CREW_GUARDED_BY(mu_);
};

}  // namespace crew
