// Tests of the parallel loops (parallel_for, parallel_for_blocks): coverage
// of the range, blocks, exceptions, helpers, and loops run from a task, on a
// paused or closed pool, and concurrently.
#include "crew/parallel_for.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/pool.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Watchdog;

PoolOptions workers(std::size_t n) { return test::fixed_workers("loop-test", n); }

TEST(ParallelFor, VisitsEveryIndexExactlyOnce) {
  Watchdog dog;
  Pool pool(workers(2));
  constexpr std::size_t kN = 100'003;
  std::vector<int> hits(kN, 0);
  parallel_for(pool, std::size_t{0}, kN, [&hits](std::size_t i) { ++hits[i]; });
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
}

TEST(ParallelFor, ByDefaultALoopTakesOneThreadPerUsableCpu) {
  Pool wide({.name = "wide", .max_workers = 1000});
  EXPECT_EQ(detail::loop_threads(wide, {}), usable_cpus());
  Pool by_default;  // 2 x usable CPUs workers: room for every thread
  EXPECT_EQ(detail::loop_threads(by_default, {}), usable_cpus());
  Pool narrow(workers(1));  // the caller and one worker at most
  EXPECT_EQ(detail::loop_threads(narrow, {}), std::min<std::size_t>(usable_cpus(), 2));
}

TEST(ParallelFor, HandlesSignedMixedAndEmptyRanges) {
  Watchdog dog;
  Pool pool(workers(2));
  std::atomic<long> sum{0};
  parallel_for(pool, -50, 50L, [&](long i) { sum.fetch_add(i); });
  EXPECT_EQ(sum.load(), -50);
  std::atomic<int> calls{0};
  parallel_for(pool, 5, 5, [&](int) { calls.fetch_add(1); });
  parallel_for(pool, 9, 3, [&](int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 0);
}

TEST(ParallelForBlocks, CoverTheRangeWithTheRequestedNumberOfBlocks) {
  Watchdog dog;
  Pool pool(workers(2));
  std::mutex mu;
  std::vector<std::pair<int, int>> blocks;
  parallel_for_blocks(pool, 0, 1000,
                      [&](int b, int e) {
                        const std::lock_guard lock(mu);
                        blocks.emplace_back(b, e);
                      },
                      {.blocks = 7});
  ASSERT_EQ(blocks.size(), 7u);
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(blocks.front().first, 0);
  EXPECT_EQ(blocks.back().second, 1000);
  for (std::size_t k = 1; k < blocks.size(); ++k) {
    EXPECT_EQ(blocks[k].first, blocks[k - 1].second);
    const int size = blocks[k].second - blocks[k].first;
    EXPECT_TRUE(size == 142 || size == 143) << size;  // even split
  }
}

TEST(ParallelFor, RethrowsTheFirstExceptionAfterEveryStartedBlockEnded) {
  Watchdog dog;
  Pool pool(workers(2));
  std::atomic<int> running{0};
  std::atomic<int> blocks_run{0};
  EXPECT_THROW(parallel_for_blocks(pool, 0, 64,
                                   [&](int b, int) {
                                     running.fetch_add(1);
                                     blocks_run.fetch_add(1);
                                     std::this_thread::sleep_for(1ms);
                                     running.fetch_sub(1);
                                     if (b == 0) throw std::runtime_error("block 0");
                                   },
                                   {.blocks = 64}),
               std::runtime_error);
  EXPECT_EQ(running.load(), 0);      // nothing still running after the call
  EXPECT_LT(blocks_run.load(), 64);  // the rest were skipped
}

TEST(ParallelFor, PostsOneHelperPerExtraThreadNotOnePerBlock) {
  Watchdog dog;
  Pool pool(workers(2));
  ASSERT_TRUE(pool.wait_idle(5s));
  const std::uint64_t before = pool.stats().submitted;
  std::atomic<int> n{0};
  parallel_for(pool, 0, 10'000, [&](int) { n.fetch_add(1, std::memory_order_relaxed); },
               {.max_threads = 3, .blocks = 500});
  EXPECT_EQ(n.load(), 10'000);
  EXPECT_LE(pool.stats().submitted - before, 2u);
}

TEST(ParallelFor, WithOneThreadRunsOnTheCallerAlone) {
  Watchdog dog;
  Pool pool(workers(2));
  ASSERT_TRUE(pool.wait_idle(5s));
  const std::uint64_t before = pool.stats().submitted;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  parallel_for(pool, 0, 1000,
               [&](int) {
                 if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
               },
               {.max_threads = 1});
  EXPECT_EQ(elsewhere.load(), 0);
  EXPECT_EQ(pool.stats().submitted, before);
}

TEST(ParallelFor, InsideATaskOfAOneWorkerPoolFinishes) {
  Watchdog dog;
  Pool pool(workers(1));
  const long sum = pool.submit_wait([&pool] {
    std::atomic<long> s{0};
    parallel_for(pool, 0, 100'000, [&](int i) { s.fetch_add(i, std::memory_order_relaxed); });
    return s.load();
  });
  EXPECT_EQ(sum, 100'000L * 99'999 / 2);
}

TEST(ParallelFor, OnAPausedPoolTheCallerDoesAllTheWorkAndLateHelpersFindNone) {
  Watchdog dog;
  PoolOptions o = workers(2);
  o.min_workers = 0;  // no worker yet: pause() holds every task in the queue
  Pool pool(std::move(o));
  pool.pause();
  std::vector<int> hits(5000, 0);
  parallel_for(pool, 0, 5000, [&](int i) { ++hits[static_cast<std::size_t>(i)]; },
               {.max_threads = 3});
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  EXPECT_EQ(pool.stats().queued, 2u);  // the helpers, not started
  pool.resume();                       // the helpers run now, after the loop's frame is gone
  ASSERT_TRUE(pool.wait_idle(5s));
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
}

TEST(ParallelFor, OnAClosedPoolRunsOnTheCaller) {
  Watchdog dog;
  Pool pool(workers(2));
  (void)pool.shutdown(ShutdownMode::drain, 0ns);
  std::atomic<int> n{0};
  parallel_for(pool, 0, 1000, [&](int) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 1000);
}

TEST(ParallelFor, APriorityThePoolLacksIsRefusedBeforeAnyWork) {
  Watchdog dog;
  Pool pool(workers(2));
  std::atomic<int> calls{0};
  try {
    parallel_for(pool, 0, 1000, [&](int) { calls.fetch_add(1); }, {.priority = 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("ParallelOptions.priority"), std::string::npos);
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(ParallelFor, ManyConcurrentLoopsOnOnePool) {
  Watchdog dog(std::chrono::seconds(60));
  Pool pool(workers(2));
  std::vector<std::thread> callers;
  std::atomic<long> total{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int k = 0; k < 20; ++k) {
        std::atomic<long> s{0};
        parallel_for(pool, 0, 2000, [&](int i) { s.fetch_add(i, std::memory_order_relaxed); },
                     {.max_threads = 3});
        total.fetch_add(s.load());
      }
    });
  }
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(total.load(), 4L * 20 * (2000L * 1999 / 2));
}

}  // namespace
}  // namespace crew
