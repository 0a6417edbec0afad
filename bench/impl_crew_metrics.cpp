// bench/impl_crew_metrics.cpp: crew with the Prometheus exporter attached
// ("crew_metrics"): the same pool as impl "crew", plus a PrometheusMetrics
// whose observer counts and times every task and which watches the pool's
// gauges, alive for the whole measurement as in a service. Its ratio to
// "crew" in the same round is the exporter's cost on the hot path.
//
// "crew_null_observer" installs an observer that asks for the same events
// and does nothing: the part of that cost the pool's observed path takes
// (it reads the clock for every task), the rest being the exporter's own.
//
// Also the scrape measurement (workload "metrics_scrape"): 10 pools x 100
// task names, time of Collect() plus text exposition.
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <crew/metrics.hpp>
#include <crew/observer.hpp>
#include <crew/pool.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crew_extras.hpp"
#include "harness.hpp"

namespace bench {
namespace {

// Subscribes to what PrometheusMetrics' observer subscribes to.
class NullObserver final : public crew::Observer {
 public:
  explicit NullObserver(std::uint32_t events) : events_(events) {}
  [[nodiscard]] std::uint32_t events() const noexcept override { return events_; }

 private:
  std::uint32_t events_;
};

// As impl "crew" (default options but for kWorkers workers), plus the observer.
crew::PoolOptions observed_options(std::shared_ptr<crew::Observer> observer) {
  crew::PoolOptions o;
  o.name = "bench";
  o.min_workers = kWorkers;
  o.max_workers = kWorkers;
  o.observers.push_back(std::move(observer));
  return o;
}

// kNull: the null observer instead of the exporter's.
template <bool kNull>
struct CrewObserved {
  static constexpr std::string_view kName = kNull ? "crew_null_observer" : "crew_metrics";
  static constexpr std::string_view kAllocNote = kCrewAllocNote;

  // Declared before the pool: destroyed after it, like a process-wide one.
  std::shared_ptr<crew::PrometheusMetrics> metrics = std::make_shared<crew::PrometheusMetrics>();
  crew::Pool pool{
      observed_options(kNull ? std::make_shared<NullObserver>(metrics->observer("bench")->events())
                             : metrics->observer("bench"))};

  CrewObserved() {
    if (!kNull) metrics->watch(pool);
  }

  template <class F>
  void post(F&& f) {
    if (pool.post(std::forward<F>(f)) != crew::Admission::accepted) fail("crew refused a task");
  }
  template <class F>
  auto submit(F&& f) {
    return pool.submit(std::forward<F>(f));
  }
  template <class Fn>
  void produce(Fn&& fn) {
    fn();
  }
  static std::string_view skip_reason(Workload w) {
    return w == Workload::long_deadline ? "crew-only workload; see impl crew" : "";
  }
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

std::unique_ptr<Impl> make_crew_metrics_impl() {
  return std::make_unique<AdapterImpl<CrewObserved<false>>>();
}
std::unique_ptr<Impl> make_crew_null_observer_impl() {
  return std::make_unique<AdapterImpl<CrewObserved<true>>>();
}

MetricsScrape measure_metrics_scrape(int runs) {
  MetricsScrape out;
  out.runs = runs;
  auto metrics = std::make_shared<crew::PrometheusMetrics>();
  std::vector<std::unique_ptr<crew::Pool>> pools;
  for (std::size_t p = 0; p < out.pools; ++p) {
    crew::PoolOptions o;
    o.name = "pool" + std::to_string(p);
    o.max_workers = kWorkers;
    o.observers.push_back(metrics->observer(o.name));
    pools.push_back(std::make_unique<crew::Pool>(std::move(o)));
    metrics->watch(*pools.back());
    for (std::size_t t = 0; t < out.task_names; ++t) {
      crew::TaskOptions named;
      named.name = "task_" + std::to_string(t);
      if (pools.back()->post([] {}, std::move(named)) != crew::Admission::accepted) {
        fail("crew refused a task");
      }
    }
  }
  for (auto& p : pools) p->wait_idle();

  std::vector<double> total, collect, text, theirs;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<prometheus::MetricFamily> families = metrics->Collect();
    const auto t1 = std::chrono::steady_clock::now();
    const std::string exposition = crew::text_exposition(families);
    const auto t2 = std::chrono::steady_clock::now();
    const std::string serialized = prometheus::TextSerializer().Serialize(families);
    const auto t3 = std::chrono::steady_clock::now();
    collect.push_back(ms_between(t0, t1));
    text.push_back(ms_between(t1, t2));
    total.push_back(ms_between(t0, t2));
    theirs.push_back(ms_between(t2, t3));
    out.bytes = exposition.size();
    out.lines = static_cast<std::size_t>(std::count(exposition.begin(), exposition.end(), '\n'));
  }
  out.ms = median_of(total);
  out.ms_max = *std::max_element(total.begin(), total.end());
  out.collect_ms = median_of(collect);
  out.text_ms = median_of(text);
  out.text_serializer_ms = median_of(theirs);
  return out;
}

}  // namespace bench
