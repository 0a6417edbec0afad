// The Prometheus exporter (crew/metrics.hpp): PrometheusMetrics, which
// hands out the observers, watches the pools and turns their counters into
// the crew_* families on Collect().
//
// Units of crew::metrics:
//   metrics.cpp          this file: the PoolSeries by pool name, Collect()
//   metrics_series.*     one pool's counters, sharded per thread, and the
//                        observer that writes them (the hot path)
//   metrics_names.*      the task-name label table and its cap
//   text_exposition.cpp  the text format, for any prometheus::MetricFamily
//
// Threads: observer() and watch() run on whatever thread builds the pools;
// Collect() on any scraping thread, concurrently with itself and with the
// pools' work. pools_ is guarded by mu_, held only to find or add a series;
// each PoolSeries guards its own state (src/metrics/metrics_series.hpp).
#include "crew/metrics.hpp"

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "metrics_series.hpp"

namespace crew {
namespace detail::prom {
namespace {

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

}  // namespace
}  // namespace detail::prom

namespace prom = detail::prom;

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
  return prom::make_observer(std::move(series));
}

void PrometheusMetrics::watch(const Pool& pool) {
  const PoolOptions& o = pool.options();
  const std::size_t capacity =
      o.queue_capacity == kUnbounded ? kUnbounded : o.queue_capacity * o.priority_levels;
  series_for(pool.name())->watch(&pool, pool.stats_handle(), capacity);
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
  auto workers_max =
      prom::family("crew_workers_max", "Worker threads the pool may run at most (max_workers).",
                   MetricType::Gauge);
  auto capacity = prom::family(
      "crew_queue_capacity",
      "Tasks the pool's queue holds at most, over all priority levels (absent when unbounded).",
      MetricType::Gauge);
  auto overdue = prom::family("crew_tasks_overdue",
                              "Tasks running past their deadline on a worker, not yet written off.",
                              MetricType::Gauge);
  auto running_age =
      prom::family("crew_task_running_age_max_seconds",
                   "How long the longest-running task the pool times has been running (0 if none).",
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
  auto limit =
      prom::family("crew_admission_limit",
                   "The overload controller's limit on admitted tasks (queued plus running).",
                   MetricType::Gauge);
  auto admitted = prom::family(
      "crew_admission_admitted",
      "Tasks the overload controller admitted that have not ended (queued plus running).",
      MetricType::Gauge);
  auto overloaded = prom::family(
      "crew_overloaded",
      "1 while the overload controller sheds tasks that waited over twice its target (CoDel).",
      MetricType::Gauge);
  auto shed = prom::family("crew_tasks_shed_total",
                           "Tasks the overload controller refused at admission (reason limit or "
                           "deadline), shed at dequeue (reason codel), or shed for a higher "
                           "priority's submission (reason priority).",
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
      blocked.metric.push_back(q);
      q.gauge.value = static_cast<double>(s.max_workers);
      workers_max.metric.push_back(q);
      if (t.queue_capacity) {
        q.gauge.value = static_cast<double>(*t.queue_capacity);
        capacity.metric.push_back(q);
      }
      q.gauge.value = static_cast<double>(t.overdue);
      overdue.metric.push_back(q);
      q.gauge.value = std::chrono::duration<double>(t.running_age_max).count();
      running_age.metric.push_back(q);
      if (s.overload.enabled) {
        const OverloadStats& o = s.overload;
        q.gauge.value = static_cast<double>(o.limit);
        limit.metric.push_back(q);
        q.gauge.value = static_cast<double>(o.admitted);
        admitted.metric.push_back(q);
        q.gauge.value = o.overloaded ? 1 : 0;
        overloaded.metric.push_back(q);
        for (const auto& [reason, n] : {std::pair{OverloadReason::limit, o.refused_limit},
                                        std::pair{OverloadReason::deadline, o.refused_deadline},
                                        std::pair{OverloadReason::codel, o.shed_codel},
                                        std::pair{OverloadReason::priority, o.shed_priority}}) {
          auto m = labelled({{"pool", pool}, {"reason", std::string(to_string(reason))}});
          m.counter.value = static_cast<double>(n);
          shed.metric.push_back(std::move(m));
        }
      }
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
  for (auto* f :
       {&workers, &workers_max, &queue, &capacity, &blocked, &overdue, &running_age, &limit,
        &admitted, &overloaded, &shed, &tasks, &duration, &wait, &replaced, &abandoned}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace crew
