// Tests of batch mode (run_batch) and the parallel loops (parallel_for,
// parallel_for_blocks).
#include "crew/batch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <numeric>
#include <ranges>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::until_stopped;
using test::Watchdog;

PoolOptions workers(std::size_t n) { return test::fixed_workers("batch-test", n); }

// ---- run_batch ----

TEST(RunBatch, ReturnsEveryOutcomeInInputOrder) {
  Watchdog dog;
  Pool pool(workers(2));
  std::vector<std::function<int()>> tasks;
  for (int i = 0; i < 200; ++i) {
    if (i % 50 == 7) {
      tasks.emplace_back([i]() -> int { throw std::runtime_error("task " + std::to_string(i)); });
    } else {
      tasks.emplace_back([i] { return i * 2; });
    }
  }
  BatchResult<int> r = run_batch(pool, tasks);
  ASSERT_EQ(r.outcomes.size(), 200u);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.counts.succeeded, 196u);
  EXPECT_EQ(r.counts.failed, 4u);
  EXPECT_FALSE(r.all_succeeded());
  for (int i = 0; i < 200; ++i) {
    const Outcome<int>& o = r.outcomes[static_cast<std::size_t>(i)];
    EXPECT_NE(o.id, 0u);
    if (i % 50 == 7) {
      EXPECT_EQ(o.status, TaskStatus::failed);
      EXPECT_THROW((void)o.get(), std::runtime_error);
    } else {
      ASSERT_TRUE(o.ok());
      EXPECT_EQ(o.get(), i * 2);
    }
  }
  try {
    r.check();
    FAIL() << "check() did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task 7");  // the first failure in input order
  }
}

TEST(RunBatch, AppliesOneFunctionToEveryInputInPlace) {
  Watchdog dog;
  Pool pool(workers(2));
  std::vector<std::string> inputs = {"a", "bb", "ccc", "dddd"};
  const std::string* first = inputs.data();
  BatchResult<std::size_t> r = run_batch(pool, inputs, [first](std::string& s) {
    // In place: the task sees the caller's element, not a copy.
    EXPECT_GE(&s, first);
    EXPECT_LT(&s, first + 4);
    return s.size();
  });
  ASSERT_TRUE(r.all_succeeded());
  for (std::size_t i = 0; i < inputs.size(); ++i) EXPECT_EQ(r.outcomes[i].get(), i + 1);
}

// A range whose elements are values made on the fly (std::string(i, 'x')),
// not references into storage; written out because clang 14 cannot compile
// libstdc++ 12's views.
class MadeStrings {
 public:
  class Iterator {
   public:
    using value_type = std::string;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    explicit Iterator(std::size_t i) : i_(i) {}
    std::string operator*() const { return std::string(i_, 'x'); }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    void operator++(int) { ++i_; }
    bool operator==(const Iterator&) const = default;

   private:
    std::size_t i_ = 0;
  };
  explicit MadeStrings(std::size_t n) : n_(n) {}
  [[nodiscard]] Iterator begin() const { return Iterator(0); }
  [[nodiscard]] Iterator end() const { return Iterator(n_); }

 private:
  std::size_t n_;
};
static_assert(std::ranges::input_range<MadeStrings>);

TEST(RunBatch, MovesValuesOfARangeThatYieldsValues) {
  Watchdog dog;
  Pool pool(workers(2));
  BatchResult<std::size_t> r =
      run_batch(pool, MadeStrings(64), [](std::string&& s) { return s.size(); });
  ASSERT_EQ(r.outcomes.size(), 64u);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_EQ(r.outcomes[i].get(), i);
}

TEST(RunBatch, VoidTasksAndLongTasksTakingAContext) {
  Watchdog dog;
  Pool pool(workers(2));
  std::atomic<int> ran{0};
  std::vector<std::function<void()>> tasks(10, [&ran] { ran.fetch_add(1); });
  BatchResult<void> r = run_batch(pool, tasks, {.name = "voids"});
  EXPECT_TRUE(r.all_succeeded());
  EXPECT_EQ(ran.load(), 10);
  r.check();

  const std::vector<int> ids = {1, 2, 3};
  BatchResult<std::string> named = run_batch(
      pool, ids,
      [](int i, const TaskContext& ctx) { return std::string(ctx.name) + "/" + std::to_string(i); },
      {.name = "ctx"});
  ASSERT_TRUE(named.all_succeeded());
  EXPECT_EQ(named.outcomes[2].get(), "ctx/3");
}

TEST(RunBatch, OnATemporaryPoolRunsEveryTaskAndTheCallerHelps) {
  Watchdog dog;
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::vector<int> inputs(2'000);
  std::iota(inputs.begin(), inputs.end(), 0);
  BatchResult<int> r = run_batch(PoolOptions{.name = "temp", .max_workers = 2}, inputs, [&](int i) {
    {
      const std::lock_guard lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    return i + 1;
  });
  ASSERT_TRUE(r.all_succeeded());
  EXPECT_EQ(r.outcomes[1999].get(), 2000);
  EXPECT_LE(threads.size(), 3u);  // 2 workers and the caller
}

TEST(RunBatch, TheTotalTimeoutCancelsWhatHasNotEnded) {
  Watchdog dog;
  Pool pool(workers(1));
  std::atomic<int> short_ran{0};
  std::vector<std::function<void(std::stop_token)>> tasks;
  tasks.emplace_back([](std::stop_token s) { until_stopped(s); });  // runs until stopped
  for (int i = 0; i < 5; ++i) tasks.emplace_back([&](std::stop_token) { short_ran.fetch_add(1); });
  const auto t0 = std::chrono::steady_clock::now();
  BatchResult<void> r = run_batch(pool, tasks, {.timeout = 50ms});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(r.timed_out);
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 5s * test::kSlowdown);
  EXPECT_EQ(r.counts.cancelled, 6u);
  EXPECT_EQ(short_ran.load(), 0);
  EXPECT_EQ(r.outcomes[0].reason, Errc::cancelled);
  EXPECT_NE(r.outcomes[0].id, 0u);
  try {
    r.check();
    FAIL() << "check() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::cancelled);
  }
}

TEST(RunBatch, ARefusedTaskIsRejectedWithThePoolsReason) {
  Watchdog dog;
  Pool pool(workers(1));
  (void)pool.shutdown(ShutdownMode::drain, 0ns);
  std::vector<std::function<int()>> tasks(3, [] { return 1; });
  BatchResult<int> r = run_batch(pool, tasks);
  EXPECT_EQ(r.counts.rejected, 3u);
  EXPECT_EQ(r.outcomes[0].status, TaskStatus::rejected);
  EXPECT_EQ(r.outcomes[0].reason, Errc::rejected);
  EXPECT_THROW((void)r.outcomes[0].get(), Error);
}

TEST(RunBatch, AnEmptyRangeGivesAnEmptyResult) {
  Watchdog dog;
  Pool pool(workers(1));
  const std::vector<int> none;
  BatchResult<int> r = run_batch(pool, none, [](int i) { return i; });
  EXPECT_TRUE(r.outcomes.empty());
  EXPECT_TRUE(r.all_succeeded());
}

TEST(RunBatch, CalledFromATaskOfAOneWorkerPoolDoesNotDeadlock) {
  Watchdog dog;
  Pool pool(workers(1));
  const int total = pool.submit_wait([&pool] {
    std::vector<int> inputs(100, 1);
    BatchResult<int> r = run_batch(pool, inputs, [](int i) { return i; });
    int sum = 0;
    for (const Outcome<int>& o : r.outcomes) sum += o.get();
    return sum;
  });
  EXPECT_EQ(total, 100);
}

TEST(RunBatch, TasksTakeTheBatchsPriority) {
  Watchdog dog;
  PoolOptions o = workers(1);
  o.priority_levels = 2;
  Pool pool(std::move(o));
  const std::vector<int> inputs = {1, 2, 3};
  BatchResult<int> r = run_batch(pool, inputs, [](int i) { return i; }, {.priority = 1});
  EXPECT_TRUE(r.all_succeeded());
  EXPECT_THROW((void)run_batch(pool, inputs, [](int i) { return i; }, {.priority = 2}), Error);
}

// ---- parallel loops ----

TEST(ParallelFor, VisitsEveryIndexExactlyOnce) {
  Watchdog dog;
  Pool pool(workers(2));
  constexpr std::size_t kN = 100'003;
  std::vector<int> hits(kN, 0);
  parallel_for(pool, std::size_t{0}, kN, [&hits](std::size_t i) { ++hits[i]; });
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
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
