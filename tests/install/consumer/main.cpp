// Uses crew through its installed headers and package config. The umbrella
// header first: every public header compiles against the installed set.
#include <crew/crew.hpp>
// Directly too.
#include <crew/coro.hpp>
#include <crew/pool.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

// The forwarding header kept for one release still names the pool's core.
#include <crew/detail/core.hpp>
static_assert(std::is_same_v<crew::detail::Core, crew::detail::PoolCore>,
              "crew/detail/core.hpp forwards to detail::PoolCore");

#ifdef CONSUMER_WITH_METRICS
#include <crew/metrics.hpp>
#endif
#ifdef CONSUMER_WITH_ASIO
#include <boost/asio/io_context.hpp>
#include <crew/asio.hpp>
#endif

namespace {
crew::Co<int> doubled(int v) {
  co_await crew::yield();
  co_return 2 * v;
}
}  // namespace

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
#ifdef CONSUMER_WITH_ASIO
  boost::asio::io_context ioc;
  int from_asio = 0;
  crew::asio::async_submit(
      pool, ioc.get_executor(), [] { return 7; },
      [&from_asio](std::exception_ptr e, int v) { from_asio = e ? -1 : v; });
  ioc.run();  // returns once the completion has run
  if (from_asio != 7) {
    std::fprintf(stderr, "consumer: crew::asio gave %d\n", from_asio);
    return 1;
  }
  std::puts("consumer: asio ok");
#endif
  // A coroutine task, through the installed coroutine headers.
  const int twice = crew::spawn(pool, doubled(21)).get();
  if (twice != 42) {
    std::fprintf(stderr, "consumer: coroutine gave %d\n", twice);
    return 1;
  }
  std::puts("consumer: coroutine ok");
  std::puts("consumer: ok");
  return 0;
}
