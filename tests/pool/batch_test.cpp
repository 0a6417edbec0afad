// Tests of batch mode (run_batch): outcomes in input order, timeouts,
// refusals, priorities, and batches run from inside a task.
#include "crew/batch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
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
using test::until_stopped;
using test::Watchdog;

PoolOptions workers(std::size_t n) { return test::fixed_workers("batch-test", n); }

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

// Shrunk from a random program of the model test (model_test.cpp): a
// batch whose timeout cancels its task while it is still queued (the only
// worker is busy). When run_batch returns, the pool's stats() count that
// task, and its callable is gone.
TEST(RunBatch, ATaskItsTimeoutCancelledInTheQueueIsCountedWhenItReturns) {
  Watchdog dog;
  Pool pool(workers(1));
  test::WorkerHold hold(pool);
  std::atomic<bool> destroyed{false};
  std::vector<std::function<void()>> tasks;
  tasks.emplace_back([p = std::make_shared<test::DestructionProbe>(&destroyed, 0ms)] {});
  const PoolStats before = pool.stats();
  BatchResult<void> r = run_batch(pool, tasks, {.timeout = 5ms});
  EXPECT_TRUE(r.timed_out);
  ASSERT_EQ(r.outcomes.size(), 1u);
  EXPECT_EQ(r.outcomes[0].status, TaskStatus::cancelled);
  EXPECT_EQ(pool.stats().outcomes.cancelled, before.outcomes.cancelled + 1);
  tasks.clear();  // the range's copy of the callable
  EXPECT_TRUE(destroyed);
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

// The timeout cancels the queued tasks before it stops the running ones: a
// running task that returns at its stop request frees its worker, and that
// worker must not find a task of the batch still queued. The stop callback
// runs in the thread that requests the stop, and holds it (up to 200 ms)
// until a short task ran, so cancelling in the other order fails every time.
// The callback outlives the task: destroying it in the task would wait for
// it to return, and keep the worker from the queue.
TEST(RunBatch, AStoppedTaskDoesNotLetAQueuedOneStart) {
  Watchdog dog;
  Pool pool(workers(1));
  std::atomic<int> short_ran{0};
  auto wait_for_a_short_task = [&] {
    const auto until = std::chrono::steady_clock::now() + 200ms;
    while (short_ran.load() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
  };
  std::optional<std::stop_callback<decltype(wait_for_a_short_task)>> hold;
  std::vector<std::function<void(std::stop_token)>> tasks;
  tasks.emplace_back([&](const std::stop_token& s) {
    hold.emplace(s, wait_for_a_short_task);
    until_stopped(s);
  });
  for (int i = 0; i < 5; ++i) tasks.emplace_back([&](std::stop_token) { short_ran.fetch_add(1); });
  BatchResult<void> r = run_batch(pool, tasks, {.timeout = 20ms});
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(short_ran.load(), 0);
  EXPECT_EQ(r.counts.cancelled, 6u);
}

// A batch task written off (the batch's timeout stopped it, and it ignored
// its token for abandon_grace) has its outcome at once, but run_batch returns only after
// its callable returned: the callable refers to the caller's range.
TEST(RunBatch, ReturnsOnlyAfterAWrittenOffCallableReturned) {
  Watchdog dog;
  PoolOptions o = workers(2);
  o.abandon_grace = 10ms;
  Pool pool(std::move(o));
  std::atomic<bool> finished{false};
  std::vector<std::function<void(std::stop_token)>> tasks;
  tasks.emplace_back([&](std::stop_token) {
    std::this_thread::sleep_for(200ms);  // ignores its token
    finished = true;
  });
  tasks.emplace_back([](std::stop_token) {});
  BatchResult<void> r = run_batch(pool, tasks, {.timeout = 20ms});
  EXPECT_TRUE(finished.load()) << "run_batch returned while a callable ran";
  EXPECT_TRUE(r.timed_out);
  ASSERT_EQ(r.outcomes.size(), 2u);
  EXPECT_EQ(r.outcomes[0].status, TaskStatus::cancelled);
  EXPECT_EQ(r.outcomes[0].reason, Errc::abandoned);
  EXPECT_EQ(r.outcomes[1].status, TaskStatus::succeeded);
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

// Both tasks are queued on a paused pool, which resumes 30 ms after both
// were submitted; its one worker then runs them in turn, 20 ms each.
TEST(BatchOutcome, EachOutcomeCarriesItsQueueWaitAndRunTime) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .time_tasks = true});
  pool.pause();
  std::jthread resumer([&pool] {
    (void)test::eventually([&pool] { return pool.stats().submitted == 2; });
    std::this_thread::sleep_for(30ms);
    pool.resume();
  });
  std::vector<std::function<void()>> tasks(2, [] { std::this_thread::sleep_for(20ms); });
  const BatchResult<void> r = run_batch(pool, tasks);
  ASSERT_TRUE(r.all_succeeded());
  for (const Outcome<void>& o : r.outcomes) {
    EXPECT_GE(o.queue_wait, 30ms);
    EXPECT_GE(o.run_time, 20ms);
    EXPECT_LT(o.run_time, 20ms + 5s * test::kSlowdown);
  }
  // The one that ran second also waited for the first.
  EXPECT_GE(std::max(r.outcomes[0].queue_wait, r.outcomes[1].queue_wait), 50ms);
}

}  // namespace
}  // namespace crew
