// Tests of the Prometheus exporter: the numbers per pool, task name and
// outcome, the histograms, the task-name cap, gauges and lifetimes. The
// text format itself: text_exposition_test.cpp; a real workload's
// exposition checked by promtool: promtool_test.cpp.
#include "crew/metrics.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <latch>
#include <limits>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/log.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using test::eventually;
using test::Gate;
using test::Watchdog;

using Labels = std::initializer_list<std::pair<std::string, std::string>>;

const MetricFamily* find_family(const std::vector<MetricFamily>& all, const std::string& name) {
  for (const MetricFamily& f : all) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool has_labels(const ClientMetric& m, Labels want) {
  return std::all_of(want.begin(), want.end(), [&](const auto& kv) {
    return std::any_of(m.label.begin(), m.label.end(), [&](const ClientMetric::Label& l) {
      return l.name == kv.first && l.value == kv.second;
    });
  });
}

// The one sample of `family` with these labels, or null.
const ClientMetric* sample(const std::vector<MetricFamily>& all, const std::string& family,
                           Labels labels) {
  const MetricFamily* f = find_family(all, family);
  if (f == nullptr) return nullptr;
  const ClientMetric* found = nullptr;
  for (const ClientMetric& m : f->metric) {
    if (!has_labels(m, labels)) continue;
    EXPECT_EQ(found, nullptr) << "two samples of " << family << " match";
    found = &m;
  }
  return found;
}

double counter(const std::vector<MetricFamily>& all, const std::string& family, Labels labels) {
  const ClientMetric* m = sample(all, family, labels);
  return m == nullptr ? -1 : m->counter.value;
}

double gauge(const std::vector<MetricFamily>& all, const std::string& family, Labels labels) {
  const ClientMetric* m = sample(all, family, labels);
  return m == nullptr ? -1 : m->gauge.value;
}

double tasks(const std::vector<MetricFamily>& all, const std::string& pool, const std::string& task,
             const std::string& outcome) {
  return counter(all, "crew_tasks_total", {{"pool", pool}, {"task", task}, {"outcome", outcome}});
}

// The cumulative count of the bucket with upper bound `le`.
std::uint64_t bucket(const ClientMetric& m, double le) {
  for (const auto& b : m.histogram.bucket) {
    if (b.upper_bound == le) return b.cumulative_count;
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return 0;
}

std::set<std::string> task_labels(const std::vector<MetricFamily>& all, const std::string& pool) {
  std::set<std::string> out;
  const MetricFamily* f = find_family(all, "crew_tasks_total");
  if (f == nullptr) return out;
  for (const ClientMetric& m : f->metric) {
    if (!has_labels(m, {{"pool", pool}})) continue;
    for (const auto& l : m.label) {
      if (l.name == "task") out.insert(l.value);
    }
  }
  return out;
}

PoolOptions observed(PrometheusMetrics& metrics, std::string name, PoolOptions o = {}) {
  o.name = std::move(name);
  o.observers.push_back(metrics.observer(o.name));
  return o;
}

TEST(MetricsOptions, InvalidValuesAreRejectedWithTheFieldName) {
  auto message = [](MetricsOptions o) -> std::string {
    try {
      PrometheusMetrics m(std::move(o));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_options);
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({.duration_buckets = {0.1, 0.1}}).find("duration_buckets"), std::string::npos);
  EXPECT_NE(message({.duration_buckets = {}}).find("duration_buckets"), std::string::npos);
  EXPECT_NE(message({.queue_wait_buckets = {-1}}).find("queue_wait_buckets"), std::string::npos);
  EXPECT_NE(message({.queue_wait_buckets = {std::numeric_limits<double>::infinity()}})
                .find("queue_wait_buckets"),
            std::string::npos);
  EXPECT_NE(message({.max_task_names = 1'000'000}).find("max_task_names"), std::string::npos);
  PrometheusMetrics ok;
  EXPECT_THROW((void)ok.observer(""), Error);
}

TEST(MetricsOptions, DefaultBucketsSpanTenMicrosecondsToSixtySeconds) {
  const std::vector<double> b = default_time_buckets();
  ASSERT_FALSE(b.empty());
  EXPECT_DOUBLE_EQ(b.front(), 10e-6);
  EXPECT_DOUBLE_EQ(b.back(), 60.0);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(MetricsOptions{}.max_task_names, 100u);
}

TEST(PrometheusMetrics, CountsEveryOutcomePerTaskName) {
  Watchdog dog;
  PrometheusMetrics metrics;
  {
    Pool pool(observed(metrics, "work", {.max_workers = 2, .abandon_grace = 10s}));
    for (int i = 0; i < 3; ++i) (void)pool.submit([] { return 1; }, {.name = "resize"});
    (void)pool.submit([]() -> int { throw std::runtime_error("no"); }, {.name = "resize"});
    for (int i = 0; i < 5; ++i) ASSERT_EQ(pool.post([] {}), Admission::accepted);
    (void)pool.submit(
        [](std::stop_token st) {
          while (!st.stop_requested()) std::this_thread::sleep_for(1ms);
        },
        {.name = "slow", .timeout = 5ms});
    // Cancelled while queued: the pool is paused.
    pool.pause();
    auto queued = pool.submit([] {}, {.name = "resize"});
    EXPECT_EQ(queued.cancel(), CancelResult::cancelled);
    pool.resume();
    ASSERT_TRUE(pool.wait_idle(10s));
    (void)pool.shutdown(ShutdownMode::drain, 0s);
    EXPECT_EQ(pool.post([] {}, {.name = "late"}), Admission::closed);  // rejected
  }
  const auto all = metrics.Collect();
  EXPECT_EQ(tasks(all, "work", "resize", "succeeded"), 3);
  EXPECT_EQ(tasks(all, "work", "resize", "failed"), 1);
  EXPECT_EQ(tasks(all, "work", "resize", "cancelled"), 1);
  EXPECT_EQ(tasks(all, "work", "resize", "timed_out"), 0);
  EXPECT_EQ(tasks(all, "work", "resize", "rejected"), 0);
  EXPECT_EQ(tasks(all, "work", "unnamed", "succeeded"), 5);
  EXPECT_EQ(tasks(all, "work", "slow", "timed_out"), 1);
  EXPECT_EQ(tasks(all, "work", "late", "rejected"), 1);
  EXPECT_EQ(task_labels(all, "work"), (std::set<std::string>{"late", "resize", "slow", "unnamed"}));

  // Histograms count the tasks that ran: not the cancelled or rejected ones.
  const ClientMetric* resize =
      sample(all, "crew_task_duration_seconds", {{"pool", "work"}, {"task", "resize"}});
  ASSERT_NE(resize, nullptr);
  EXPECT_EQ(resize->histogram.sample_count, 4u);
  const ClientMetric* late =
      sample(all, "crew_task_queue_wait_seconds", {{"pool", "work"}, {"task", "late"}});
  ASSERT_NE(late, nullptr);
  EXPECT_EQ(late->histogram.sample_count, 0u);
}

TEST(PrometheusMetrics, HistogramsBucketRunTimeAndQueueWait) {
  Watchdog dog;
  PrometheusMetrics metrics;
  constexpr int kTasks = 6;
  Pool pool(observed(metrics, "timed", {.max_workers = 2}));
  pool.pause();
  const auto paused_at = std::chrono::steady_clock::now();
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([] { std::this_thread::sleep_for(3ms); }, {.name = "sleeper"}),
              Admission::accepted);
  }
  std::this_thread::sleep_for(30ms);
  const double min_wait =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - paused_at).count() - 0.001;
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));

  const auto all = metrics.Collect();
  const ClientMetric* run =
      sample(all, "crew_task_duration_seconds", {{"pool", "timed"}, {"task", "sleeper"}});
  const ClientMetric* wait =
      sample(all, "crew_task_queue_wait_seconds", {{"pool", "timed"}, {"task", "sleeper"}});
  ASSERT_NE(run, nullptr);
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(run->histogram.sample_count, static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(bucket(*run, 0.0025), 0u);  // every run slept 3 ms
  EXPECT_EQ(bucket(*run, std::numeric_limits<double>::infinity()), kTasks);
  EXPECT_GE(run->histogram.sample_sum, kTasks * 0.003);
  EXPECT_EQ(wait->histogram.sample_count, static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(bucket(*wait, 0.025), 0u);  // every task waited out the 30 ms pause
  EXPECT_GE(wait->histogram.sample_sum, kTasks * std::min(min_wait, 0.025));
  // Buckets are cumulative and end with +Inf.
  const auto& b = run->histogram.bucket;
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.cumulative_count < y.cumulative_count;
  }));
  EXPECT_EQ(b.size(), default_time_buckets().size() + 1);
  EXPECT_EQ(tasks(all, "timed", "sleeper", "succeeded"), kTasks);
}

TEST(PrometheusMetrics, NamesBeyondTheCapAreCountedAsOther) {
  Watchdog dog;
  PrometheusMetrics metrics({.max_task_names = 3});
  // One worker: names are first seen in submission order.
  Pool pool(observed(metrics, "capped", {.max_workers = 1}));
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(pool.post([] {}, {.name = "job" + std::to_string(i)}), Admission::accepted);
    ASSERT_EQ(pool.post([] {}, {.name = "job" + std::to_string(i)}), Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(10s));
  const auto all = metrics.Collect();
  EXPECT_EQ(task_labels(all, "capped"),
            (std::set<std::string>{"job0", "job1", "job2", "other", "unnamed"}));
  EXPECT_EQ(tasks(all, "capped", "job0", "succeeded"), 2);
  EXPECT_EQ(tasks(all, "capped", "job2", "succeeded"), 2);
  EXPECT_EQ(tasks(all, "capped", "other", "succeeded"), 14);
  EXPECT_EQ(tasks(all, "capped", "unnamed", "succeeded"), 0);
}

TEST(PrometheusMetrics, ReservedNamesAndBadUtf8ShareOrGetSafeLabels) {
  Watchdog dog;
  PrometheusMetrics metrics;
  Pool pool(observed(metrics, "odd", {.max_workers = 1}));
  ASSERT_EQ(pool.post([] {}, {.name = "other"}), Admission::accepted);
  ASSERT_EQ(pool.post([] {}, {.name = "unnamed"}), Admission::accepted);
  ASSERT_EQ(pool.post([] {}, {.name = std::string("bad\xff")}), Admission::accepted);
  ASSERT_EQ(pool.post([] {}, {.name = std::string("bad\xfe")}), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  const auto all = metrics.Collect();
  EXPECT_EQ(tasks(all, "odd", "other", "succeeded"), 1);
  EXPECT_EQ(tasks(all, "odd", "unnamed", "succeeded"), 1);
  EXPECT_EQ(tasks(all, "odd", "bad\xEF\xBF\xBD", "succeeded"), 2);
}

TEST(PrometheusMetrics, SeveralPoolsShareOneCollectorWithOneFamilyEach) {
  Watchdog dog;
  PrometheusMetrics metrics;
  Pool alpha(observed(metrics, "alpha"));
  Pool beta(observed(metrics, "beta"));
  metrics.watch(alpha);
  metrics.watch(beta);
  for (int i = 0; i < 7; ++i) ASSERT_EQ(alpha.post([] {}, {.name = "a"}), Admission::accepted);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(beta.post([] {}, {.name = "a"}), Admission::accepted);
  ASSERT_TRUE(alpha.wait_idle(10s));
  ASSERT_TRUE(beta.wait_idle(10s));
  const auto all = metrics.Collect();
  EXPECT_EQ(tasks(all, "alpha", "a", "succeeded"), 7);
  EXPECT_EQ(tasks(all, "beta", "a", "succeeded"), 4);
  std::set<std::string> names;
  for (const MetricFamily& f : all) EXPECT_TRUE(names.insert(f.name).second) << f.name;
  EXPECT_EQ(names,
            (std::set<std::string>{
                "crew_workers", "crew_workers_max", "crew_queue_length", "crew_queue_capacity",
                "crew_submit_blocked", "crew_tasks_overdue", "crew_task_running_age_max_seconds",
                "crew_tasks_total", "crew_task_duration_seconds", "crew_task_queue_wait_seconds",
                "crew_worker_replacements_total", "crew_tasks_abandoned_total"}));
  for (const MetricFamily& f : all) {
    for (const ClientMetric& m : f.metric) {
      ASSERT_FALSE(m.label.empty());
      EXPECT_EQ(m.label.front().name, "pool") << f.name;
    }
  }
}

TEST(PrometheusMetrics, GaugesShowWorkersQueueAndBlockedSubmitters) {
  Watchdog dog;
  PrometheusMetrics metrics;
  Pool pool(observed(metrics, "gauged", {.min_workers = 1, .max_workers = 1, .queue_capacity = 2}));
  metrics.watch(pool);
  metrics.watch(pool);  // watching twice changes nothing
  Gate gate;
  std::latch running(1);
  ASSERT_EQ(pool.post([&] {
    running.count_down();
    gate.wait();
  }),
            Admission::accepted);
  running.wait();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  std::thread blocked([&] { EXPECT_EQ(pool.post([] {}), Admission::accepted); });
  ASSERT_TRUE(eventually([&] { return pool.stats().blocked_submitters == 1; }));

  const auto all = metrics.Collect();
  EXPECT_EQ(gauge(all, "crew_workers", {{"pool", "gauged"}, {"state", "busy"}}), 1);
  EXPECT_EQ(gauge(all, "crew_workers", {{"pool", "gauged"}, {"state", "idle"}}), 0);
  EXPECT_EQ(gauge(all, "crew_workers", {{"pool", "gauged"}, {"state", "starting_or_stopping"}}), 0);
  EXPECT_EQ(gauge(all, "crew_queue_length", {{"pool", "gauged"}}), 2);
  EXPECT_EQ(gauge(all, "crew_submit_blocked", {{"pool", "gauged"}}), 1);
  gate.open();
  blocked.join();
  ASSERT_TRUE(pool.wait_idle(10s));
  const auto after = metrics.Collect();
  EXPECT_EQ(gauge(after, "crew_queue_length", {{"pool", "gauged"}}), 0);
  EXPECT_EQ(gauge(after, "crew_submit_blocked", {{"pool", "gauged"}}), 0);
  EXPECT_EQ(tasks(after, "gauged", "unnamed", "succeeded"), 4);
}

// Shed tasks are counted by reason: codel, and priority for a task a
// higher priority's submission displaced at the limit.
TEST(PrometheusMetrics, ShedTasksAreCountedByReasonPriorityIncluded) {
  Watchdog dog;
  PrometheusMetrics metrics;
  PoolOptions o = observed(metrics, "shedding",
                           {.min_workers = 1,
                            .max_workers = 1,
                            .priority_levels = 2,
                            .overload = {.enabled = true, .interval = 60s, .max_limit = 4}});
  Pool pool(o);
  metrics.watch(pool);
  {
    test::WorkerHold hold(pool);
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(pool.post([] {}), Admission::accepted);                 // the last at the limit
    ASSERT_EQ(pool.post([] {}, {.priority = 1}), Admission::accepted);  // displaces it
  }
  ASSERT_TRUE(pool.wait_idle(10s));
  const auto all = metrics.Collect();
  EXPECT_EQ(counter(all, "crew_tasks_shed_total", {{"pool", "shedding"}, {"reason", "priority"}}),
            1);
  EXPECT_EQ(counter(all, "crew_tasks_shed_total", {{"pool", "shedding"}, {"reason", "codel"}}), 0);
  EXPECT_EQ(counter(all, "crew_tasks_shed_total", {{"pool", "shedding"}, {"reason", "limit"}}), 0);
}

// The gauges read at scrape time from the pool's options and its workers:
// the limits, and a task that keeps running past its deadline.
TEST(PrometheusMetrics, GaugesShowLimitsAndATaskRunningPastItsDeadline) {
  Watchdog dog;
  PrometheusMetrics metrics;
  auto gate = std::make_shared<Gate>();
  Pool pool(observed(metrics, "late",
                     {.max_workers = 2,
                      .queue_capacity = 3,
                      .priority_levels = 2,
                      .abandon_grace = 60s,
                      .logger = std::make_shared<StderrLogger>(LogLevel::error)}));
  metrics.watch(pool);
  const Labels late = {{"pool", "late"}};
  auto idle = metrics.Collect();
  EXPECT_EQ(gauge(idle, "crew_workers_max", late), 2);
  EXPECT_EQ(gauge(idle, "crew_queue_capacity", late), 6);  // per priority level
  EXPECT_EQ(gauge(idle, "crew_tasks_overdue", late), 0);
  EXPECT_EQ(gauge(idle, "crew_task_running_age_max_seconds", late), 0);

  // Ignores its stop until the gate opens: overdue from 5 ms on.
  auto stubborn =
      pool.submit([gate](std::stop_token) { gate->wait(); }, {.name = "stubborn", .timeout = 5ms});
  ASSERT_TRUE(
      eventually([&] { return gauge(metrics.Collect(), "crew_tasks_overdue", late) == 1; }));
  const auto overdue = metrics.Collect();
  EXPECT_GE(gauge(overdue, "crew_task_running_age_max_seconds", late), 0.005);
  pool.resize(5);
  EXPECT_EQ(gauge(metrics.Collect(), "crew_workers_max", late), 5);

  gate->open();
  ASSERT_TRUE(stubborn.wait_for(10s));
  EXPECT_EQ(stubborn.status(), TaskStatus::timed_out);
  ASSERT_TRUE(pool.wait_idle(10s));
  const auto after = metrics.Collect();
  EXPECT_EQ(gauge(after, "crew_tasks_overdue", late), 0);
  EXPECT_EQ(gauge(after, "crew_task_running_age_max_seconds", late), 0);
  EXPECT_EQ(tasks(after, "late", "stubborn", "timed_out"), 1);
}

TEST(PrometheusMetrics, AnUnboundedQueueHasNoCapacitySeries) {
  Watchdog dog;
  PrometheusMetrics metrics;
  Pool pool(observed(metrics, "endless", {.queue_capacity = kUnbounded}));
  metrics.watch(pool);
  const auto all = metrics.Collect();
  EXPECT_EQ(find_family(all, "crew_queue_capacity"), nullptr);
  EXPECT_GT(gauge(all, "crew_workers_max", {{"pool", "endless"}}), 0);
}

TEST(PrometheusMetrics, ReplacementsAndAbandonmentsMatchThePoolsStats) {
  Watchdog dog;
  PrometheusMetrics metrics;
  auto gate = std::make_shared<Gate>();
  std::atomic<int> starts{0};
  {
    Pool pool(observed(metrics, "rough",
                       {.min_workers = 1,
                        .max_workers = 1,
                        .abandon_grace = 10ms,
                        .on_worker_start =
                            [&](std::uint64_t) {
                              if (starts.fetch_add(1) == 0) throw std::runtime_error("bad start");
                            },
                        .logger = std::make_shared<StderrLogger>(LogLevel::error)}));
    // Watched too: scrapes read the pool's stats (its lock) while the
    // supervisor reports the abandonment with that lock held.
    metrics.watch(pool);
    auto hung = pool.submit([gate](std::stop_token) { gate->wait(); },
                            {.name = "stubborn", .timeout = 5ms});
    ASSERT_TRUE(eventually([&] {
      (void)metrics.Collect();
      return pool.stats().abandoned == 1;
    }));
    EXPECT_EQ(pool.submit([] { return 1; }).get(), 1);
    // The abandoned worker's replacement may still be on its way.
    const auto same = [&] {
      const PoolStats s = pool.stats();
      const auto all = metrics.Collect();
      return s.workers_replaced >= 1 &&
             counter(all, "crew_tasks_abandoned_total", {{"pool", "rough"}}) ==
                 static_cast<double>(s.abandoned) &&
             counter(all, "crew_worker_replacements_total", {{"pool", "rough"}}) ==
                 static_cast<double>(s.workers_replaced);
    };
    EXPECT_TRUE(eventually(same));
    const auto all = metrics.Collect();
    EXPECT_EQ(tasks(all, "rough", "stubborn", "timed_out"), 1);
    (void)pool.shutdown(ShutdownMode::soft, 0s);
  }
  gate->open();
}

TEST(PrometheusMetrics, MetricsOutlivingAPoolKeepItsCountersAndDropItsGauges) {
  Watchdog dog;
  PrometheusMetrics metrics;
  {
    Pool pool(observed(metrics, "gone"));
    metrics.watch(pool);
    ASSERT_EQ(pool.post([] {}), Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
    EXPECT_EQ(gauge(metrics.Collect(), "crew_queue_length", {{"pool", "gone"}}), 0);
  }
  const auto all = metrics.Collect();
  EXPECT_EQ(find_family(all, "crew_queue_length"), nullptr);
  EXPECT_EQ(tasks(all, "gone", "unnamed", "succeeded"), 1);

  // A new pool with the same name continues the same counters.
  Pool again(observed(metrics, "gone"));
  metrics.watch(again);
  ASSERT_EQ(again.post([] {}), Admission::accepted);
  ASSERT_TRUE(again.wait_idle(10s));
  const auto later = metrics.Collect();
  EXPECT_EQ(tasks(later, "gone", "unnamed", "succeeded"), 2);
  EXPECT_EQ(gauge(later, "crew_queue_length", {{"pool", "gone"}}), 0);
}

TEST(PrometheusMetrics, APoolOutlivingItsMetricsKeepsWorking) {
  Watchdog dog;
  auto metrics = std::make_shared<PrometheusMetrics>();
  Pool pool(observed(*metrics, "orphan"));
  metrics->watch(pool);
  ASSERT_EQ(pool.post([] {}, {.name = "x"}), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  metrics.reset();
  for (int i = 0; i < 100; ++i) ASSERT_EQ(pool.post([] {}, {.name = "x"}), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().outcomes.succeeded, 101u);
}

// Elastic workers exit and start again between bursts; each new thread
// reuses a shard an exited one left, and no count is lost.
TEST(PrometheusMetrics, CountsSurviveWorkerThreadsComingAndGoing) {
  Watchdog dog;
  PrometheusMetrics metrics;
  Pool pool(observed(metrics, "elastic", {.max_workers = 2, .idle_timeout = 1ms}));
  std::uint64_t posted = 0;
  for (int burst = 0; burst < 5; ++burst) {
    for (int i = 0; i < 50; ++i, ++posted) {
      ASSERT_EQ(pool.post([] {}, {.name = "burst"}), Admission::accepted);
    }
    ASSERT_TRUE(pool.wait_idle(10s));
    ASSERT_TRUE(eventually([&] { return pool.stats().workers == 0; }));
  }
  EXPECT_EQ(tasks(metrics.Collect(), "elastic", "burst", "succeeded"), static_cast<double>(posted));
}

// Scrapes race with producers on several threads (TSan checks the shards'
// single-writer protocol); the final totals are exact.
TEST(PrometheusMetrics, ScrapesDuringTheWorkloadSeeMonotonicCountsAndExactTotals) {
  Watchdog dog(60s);
  PrometheusMetrics metrics;
  Pool pool(observed(metrics, "busy", {.max_workers = 2}));
  constexpr int kProducers = 3;
  constexpr int kPerProducer = 2000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    double last = 0;
    while (!done.load()) {
      // -1 until the first "t1" task is counted.
      const double now = std::max(tasks(metrics.Collect(), "busy", "t1", "succeeded"), 0.0);
      EXPECT_GE(now, last);
      last = now;
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        EXPECT_EQ(pool.post([] {}, {.name = "t" + std::to_string((i + p) % 3)}),
                  Admission::accepted);
      }
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(pool.wait_idle(30s));
  done = true;
  scraper.join();
  const auto all = metrics.Collect();
  double total = 0;
  for (const char* t : {"t0", "t1", "t2"}) total += tasks(all, "busy", t, "succeeded");
  EXPECT_EQ(total, kProducers * kPerProducer);
}

}  // namespace
}  // namespace crew
