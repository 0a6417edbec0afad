// Uses crew through its installed headers and package config.
#include <crew/pool.hpp>
#include <cstdio>
#include <memory>
#include <string>

#ifdef CONSUMER_WITH_METRICS
#include <crew/metrics.hpp>
#endif

int main() {
#ifdef CONSUMER_WITH_METRICS
  auto metrics = std::make_shared<crew::PrometheusMetrics>();
  crew::Pool pool({.name = "consumer", .observers = {metrics->observer("consumer")}});
#else
  crew::Pool pool;
#endif
  auto task = pool.submit([] { return 42; });
  const int value = task.get();
  if (value != 42) {
    std::fprintf(stderr, "consumer: expected 42, got %d\n", value);
    return 1;
  }
#ifdef CONSUMER_WITH_METRICS
  (void)pool.wait_idle();
  const std::string text = crew::text_exposition(metrics->Collect());
  if (text.find("crew_tasks_total{pool=\"consumer\",task=\"unnamed\",outcome=\"succeeded\"} 1") ==
      std::string::npos) {
    std::fprintf(stderr, "consumer: unexpected exposition:\n%s", text.c_str());
    return 1;
  }
  std::puts("consumer: metrics ok");
#endif
  std::puts("consumer: ok");
  return 0;
}
