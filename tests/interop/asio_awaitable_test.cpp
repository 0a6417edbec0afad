// crew/asio.hpp with C++20 coroutines: co_await on a submission made with
// net::use_awaitable returns its value or throws its error, and many
// coroutines await at once (callbacks and futures: asio_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <crew/asio.hpp>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "asio_test_util.hpp"
#include "test_util.hpp"

namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using crew::test::kSlowdown;
using crew::test::WorkerHold;

#if defined(BOOST_ASIO_HAS_CO_AWAIT)

// Inside a coroutine, TaskOptions are a named variable, not a braced
// temporary in the co_await expression: GCC 12 miscompiles such a temporary
// holding a std::string (its destructor frees a pointer into the old stack
// copy). Documented in docs/api.md.
net::awaitable<int> sum_of_squares(crew::Pool& pool, int n) {
  const auto ex = co_await net::this_coro::executor;
  const crew::TaskOptions opts{.name = "square"};
  int sum = 0;
  for (int i = 1; i <= n; ++i) {
    sum += co_await crew::asio::async_submit(
        pool, ex, [i] { return i * i; }, opts, net::use_awaitable);
  }
  co_return sum;
}

TEST(CrewAsioCoroutine, CoAwaitReturnsTheValues) {
  net::io_context ioc;
  crew::Pool pool({.name = "asio", .max_workers = 2});
  std::future<int> f = net::co_spawn(ioc, sum_of_squares(pool, 10), net::use_future);
  ioc.run();
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(f.get(), 385);
  // A task's completion is posted before the pool records its outcome;
  // wait_idle() orders the two.
  EXPECT_TRUE(pool.wait_idle(5s * kSlowdown));
  EXPECT_EQ(pool.stats().outcomes.succeeded, 10u);
}

TEST(CrewAsioCoroutine, ErrorsAreThrownFromCoAwait) {
  net::io_context ioc;
  crew::Pool pool(
      {.name = "asio", .max_workers = 1, .queue_capacity = 1, .overflow = crew::Overflow::reject});
  std::vector<std::string> seen;
  auto body = [&]() -> net::awaitable<void> {
    const auto ex = co_await net::this_coro::executor;
    // The task's own exception.
    try {
      co_await crew::asio::async_submit(
          pool, ex, []() -> int { throw std::runtime_error("task failed"); }, net::use_awaitable);
    } catch (const std::runtime_error& e) {
      seen.emplace_back(e.what());
    }
    // A long task past its deadline.
    const crew::TaskOptions slow{.name = "slow", .timeout = 10ms};
    try {
      co_await crew::asio::async_submit(
          pool, ex,
          [](std::stop_token stop) {
            while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
          },
          slow, net::use_awaitable);
    } catch (const crew::Error& e) {
      seen.emplace_back(e.code() == crew::Errc::timed_out ? "timed_out" : "?");
    }
    // Refused: the queue (1) is taken while the worker is held.
    {
      WorkerHold hold(pool);
      try {
        crew::asio::async_try_submit(
            pool, ex, [] { return 0; }, [](std::exception_ptr, int) {});
        co_await crew::asio::async_try_submit(
            pool, ex, [] { return 0; }, net::use_awaitable);
      } catch (const crew::Error& e) {
        seen.emplace_back(std::string(e.code() == crew::Errc::rejected ? "rejected" : "?") + "/" +
                          (e.admission() == crew::Admission::full ? "full" : "?"));
      }
    }
    (void)pool.wait_idle(5s);
    // Dropped: queued behind a held worker, then a soft shutdown.
    WorkerHold hold(pool);
    std::thread stopper([&pool, &hold] {
      std::this_thread::sleep_for(20ms);  // the task below is queued by then
      (void)shut_down_soft_while_held(pool, hold);
    });
    try {
      co_await crew::asio::async_submit(
          pool, ex, [] { return 0; }, net::use_awaitable);
    } catch (const crew::Error& e) {
      seen.emplace_back(e.code() == crew::Errc::shutdown_dropped ? "shutdown_dropped" : "?");
    }
    stopper.join();
  };
  net::co_spawn(ioc, body(), net::detached);
  ioc.run();
  EXPECT_EQ(seen, (std::vector<std::string>{"task failed", "timed_out", "rejected/full",
                                            "shutdown_dropped"}));
}

// Many coroutines on a strand-less io_context run by two threads, each
// awaiting tasks in turn: all complete, each on the io_context's threads.
TEST(CrewAsioCoroutine, ManyCoroutinesAwaitConcurrently) {
  net::io_context ioc(2);
  crew::Pool pool({.name = "asio", .max_workers = 2});
  std::atomic<int> total{0};
  constexpr int kCoroutines = 200;
  for (int c = 0; c < kCoroutines; ++c) {
    net::co_spawn(
        ioc,
        [&pool, &total]() -> net::awaitable<void> { total += co_await sum_of_squares(pool, 5); },
        net::detached);
  }
  std::thread second([&ioc] { ioc.run(); });
  ioc.run();
  second.join();
  EXPECT_EQ(total.load(), kCoroutines * 55);
}

#else
TEST(CrewAsioCoroutine, NeedsCoAwait) { GTEST_SKIP() << "this compiler lacks Asio's co_await"; }
#endif

}  // namespace
