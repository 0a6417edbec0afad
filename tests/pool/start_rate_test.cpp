// Tests of PoolOptions::max_start_rate: starts spaced by the rate after the
// burst, and no worker holding a task while it waits for a token.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "crew/pool.hpp"
#include "peak.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::eventually;
using test::Watchdog;

PoolOptions paced(std::size_t workers, double rate, std::size_t burst) {
  PoolOptions o = test::fixed_workers("paced", workers);
  o.max_start_rate = rate;
  o.start_burst = burst;
  return o;
}

TEST(StartRate, StartsAreSpacedByTheRateAfterTheBurst) {
  Watchdog dog;
  const Clock::time_point created = Clock::now();
  Pool pool(paced(4, /*rate=*/50, /*burst=*/2));  // a token every 20 ms, 2 at once
  std::mutex mu;
  std::vector<Clock::time_point> starts;
  constexpr int kTasks = 8;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([&] {
      const std::lock_guard lock(mu);
      starts.push_back(Clock::now());
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(20s));
  ASSERT_EQ(starts.size(), std::size_t{kTasks});
  std::sort(starts.begin(), starts.end());
  // The k-th start (from 0) comes no earlier than (k - burst + 1) periods
  // after the pacer began (the pool's construction, after `created`).
  for (std::size_t k = 2; k < starts.size(); ++k) {
    EXPECT_GE(starts[k] - created, static_cast<int>(k - 1) * 20ms - 1ms) << "start " << k;
  }
  // Not slower than the rate by much either (bounded by the machine).
  EXPECT_LT(starts.back() - starts.front(), 2s * test::kSlowdown);
}

TEST(StartRate, WaitingForATokenHoldsNoWorkerAndNoTask) {
  Watchdog dog;
  Pool pool(paced(2, /*rate=*/4, /*burst=*/1));  // a token every 250 ms
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return ran.load() == 1; }));
  // The next token is 250 ms away: the other two wait in the queue, and
  // both workers are idle (neither holds a popped task).
  std::this_thread::sleep_for(50ms);
  const PoolStats s = pool.stats();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(s.queued, 2u);
  EXPECT_EQ(s.busy, 0u);
  // A soft shutdown finds them queued: dropped at once, not waited for.
  const Clock::time_point before = Clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 10s);
  EXPECT_LT(Clock::now() - before, 200ms * test::kSlowdown);
  EXPECT_EQ(r.rejected_unnamed, 2u);
  EXPECT_EQ(ran.load(), 1);
}

TEST(StartRate, ADrainKeepsThePace) {
  Watchdog dog;
  Pool pool(paced(2, /*rate=*/20, /*burst=*/1));  // a token every 50 ms
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i) ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  const Clock::time_point before = Clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 10s);
  EXPECT_EQ(ran.load(), 4);
  EXPECT_FALSE(r.escalated);
  EXPECT_GE(Clock::now() - before, 100ms);  // at least 2 of the 3 waits for a token
}

// A drain keeps its workers for what is queued while the rate spaces the
// starts: tasks of 200 ms at 80 starts a second overlap on up to 8 workers.
// A worker that found no token due, while another waited for it, used to
// take the closed pool for an empty one and exit, so the drain went on with
// one or two workers.
TEST(StartRate, ADrainKeepsItsWorkersWhileItWaitsForTokens) {
  Watchdog dog;
  Pool pool(paced(8, /*rate=*/80, /*burst=*/1));  // a token every 12.5 ms
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::atomic<int> ran{0};
  constexpr int kTasks = 16;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([&] {
      test::raise_peak(most, running.fetch_add(1) + 1);
      std::this_thread::sleep_for(200ms);
      running.fetch_sub(1);
      ran.fetch_add(1);
    }),
              Admission::accepted);
  }
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 30s);
  EXPECT_EQ(ran.load(), kTasks);
  EXPECT_FALSE(r.escalated);
  // 8 with every worker kept: a start every 12.5 ms, each task 200 ms long.
  // Under a sanitizer, or with the machine busy, a start can come late.
  RecordProperty("most_at_once", most.load());
  EXPECT_GE(most.load(), 5) << "the drain ran at most " << most.load() << " tasks at once";
}

TEST(StartRate, TheRateIsChecked) {
  EXPECT_THROW(Pool({.max_start_rate = -1}), Error);
  Pool unpaced({.max_workers = 1, .max_start_rate = 0});
  EXPECT_EQ(unpaced.submit([] { return 7; }).get(), 7);
}

}  // namespace
}  // namespace crew
