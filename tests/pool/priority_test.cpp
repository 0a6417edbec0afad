// Tests of priority levels: higher levels run first, a waiting lower level is
// served within the documented aging bound under a constant flood of
// higher-priority work, and a pool without priorities rejects them.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;

TEST(Priority, HigherLevelsRunFirst) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .priority_levels = 3, .priority_aging = 1000});
  pool.pause();
  std::mutex mu;
  std::vector<int> order;
  auto record = [&](int v) {
    return [&, v] {
      const std::lock_guard lock(mu);
      order.push_back(v);
    };
  };
  for (int i = 0; i < 3; ++i) ASSERT_EQ(pool.post(record(0), {.priority = 0}), Admission::accepted);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(pool.post(record(1), {.priority = 1}), Admission::accepted);
  auto top = pool.submit([&] { record(2)(); }, {.priority = 2});
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));
  top.get();
  EXPECT_EQ(order, (std::vector<int>{2, 1, 1, 1, 0, 0, 0}));
}

TEST(Priority, EqualPrioritiesKeepSubmissionOrder) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_shards = 1, .priority_levels = 2});
  pool.pause();
  std::vector<int> order;
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(pool.post([&order, i] { order.push_back(i); }, {.priority = 1}), Admission::accepted);
  }
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

// One worker, aging 8: with high-priority tasks always queued, a low one
// queued behind them runs after exactly 8 of them.
TEST(PriorityAging, ALowTaskRunsAfterAgingHighTasksOnOneWorker) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .priority_levels = 2, .priority_aging = 8});
  pool.pause();
  std::atomic<int> highs_before_low{-1};
  std::atomic<int> highs{0};
  ASSERT_EQ(pool.post([&] { highs_before_low = highs.load(); }, {.priority = 0}),
            Admission::accepted);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(pool.post([&] { highs.fetch_add(1); }, {.priority = 1}), Admission::accepted);
  }
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(highs_before_low.load(), 8);
}

// Two producers keep the high level full; each low task must still run,
// after at most `aging` high tasks taken by the worker that takes it since
// it was queued (docs/api.md, "Priorities"). The reference point is a
// pause: a worker may have popped one high task just before it saw the
// pause and holds it until resume() (docs/design/architecture.md "Pause"); that task was
// taken before the low one was queued but runs after the counts are read,
// so the bound checked here is aging + 1.
//
// The count is per worker: the worker that takes the low task runs its
// tasks one after another, so its high tasks counted when the low one
// starts are exactly those it took before. The other worker's count is not
// exact (it may take and finish high tasks between the low task's pop and
// the start of its body, as many as it likes if the low task's worker is
// preempted there), so the total is printed, not checked.
thread_local int t_worker_slot = -1;

TEST(PriorityAging, ConstantHighPriorityLoadCannotStarveALowTask) {
  Watchdog dog(60s);
  constexpr std::size_t kWorkers = 2;
  constexpr std::uint32_t kAging = 16;
  // Room for replaced workers too (a worker is replaced only if it dies).
  constexpr std::size_t kSlots = 8;
  // Declared before the pool: its destructor runs the high tasks still
  // queued, and they count here.
  std::atomic<bool> flood{true};
  std::atomic<long> highs{0};
  std::array<std::atomic<long>, kSlots> highs_by_worker{};
  std::atomic<int> next_slot{0};
  Pool pool({.min_workers = kWorkers,
             .max_workers = kWorkers,
             .queue_capacity = kUnbounded,
             .priority_levels = 4,
             .priority_aging = kAging,
             .on_worker_start = [&](std::uint64_t) { t_worker_slot = next_slot.fetch_add(1); }});
  std::vector<std::thread> producers;
  for (int p = 0; p < 2; ++p) {
    producers.emplace_back([&] {
      while (flood.load()) {
        // Keep plenty queued at the top level, never letting it run dry.
        if (pool.stats().queued < 1000) {
          for (int i = 0; i < 100; ++i) {
            (void)pool.post(
                [&] {
                  // The pool's destructor may run what is left on its own
                  // thread, which has no slot.
                  if (t_worker_slot >= 0) {
                    highs_by_worker.at(static_cast<std::size_t>(t_worker_slot)).fetch_add(1);
                  }
                  highs.fetch_add(1);
                },
                {.priority = 3});
          }
        } else {
          std::this_thread::yield();
        }
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return highs.load() > 10'000; }));
  long worst_own = 0;
  long worst_total = 0;
  for (int round = 0; round < 20; ++round) {
    // An exact reference point: paused, with nothing running, nothing can
    // happen between reading the counts and resuming.
    pool.pause();
    ASSERT_TRUE(eventually([&] { return pool.stats().busy == 0; }));
    ASSERT_TRUE(eventually([&] { return pool.stats().queued >= 500; }));
    std::array<long, kSlots> base{};
    for (std::size_t i = 0; i < kSlots; ++i) base.at(i) = highs_by_worker.at(i).load();
    const long base_total = highs.load();
    std::atomic<long> own{-1};
    std::atomic<long> total{-1};
    ASSERT_EQ(pool.post(
                  [&] {
                    const auto slot = static_cast<std::size_t>(t_worker_slot);
                    total = highs.load() - base_total;
                    own = highs_by_worker.at(slot).load() - base.at(slot);
                  },
                  {.priority = 0}),
              Admission::accepted);
    pool.resume();
    ASSERT_TRUE(eventually([&] { return own.load() >= 0; }, 10s)) << "starved";
    worst_own = std::max(worst_own, own.load());
    worst_total = std::max(worst_total, total.load());
  }
  flood = false;
  for (auto& t : producers) t.join();
  EXPECT_EQ(next_slot.load(), static_cast<int>(kWorkers)) << "a worker was replaced";
  // At most kAging taken from above by the worker, plus the one it may hold
  // across the pause.
  constexpr long kBound = static_cast<long>(kAging + 1);
  EXPECT_LE(worst_own, kBound);
  RecordProperty("worst_high_tasks_before_low_same_worker", std::to_string(worst_own));
  RecordProperty("worst_high_tasks_before_low_all_workers", std::to_string(worst_total));
  std::printf(
      "priority aging: worst case %ld high-priority tasks ran on the low task's worker "
      "before it (bound %ld); %ld on all workers (about %zu x %ld expected, not checked)\n",
      worst_own, kBound, worst_total, kWorkers, kBound);
}

TEST(Priority, APriorityAboveThePoolsLevelsIsAnError) {
  Watchdog dog;
  Pool plain;
  EXPECT_THROW((void)plain.post([] {}, {.priority = 1}), Error);
  EXPECT_THROW((void)plain.submit([] { return 1; }, {.priority = 1}), Error);
  Pool three({.priority_levels = 3});
  EXPECT_EQ(three.post([] {}, {.priority = 2}), Admission::accepted);
  try {
    (void)three.post([] {}, {.priority = 3});
    ADD_FAILURE() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("priority"), std::string::npos);
  }
  EXPECT_THROW(Pool({.priority_levels = 0}), Error);
  EXPECT_THROW(Pool({.priority_levels = 17}), Error);
  EXPECT_THROW(Pool({.priority_aging = 0}), Error);
}

TEST(Priority, LongTasksAndHandlesUseTheirLevel) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .priority_levels = 2, .priority_aging = 1000});
  pool.pause();
  std::vector<int> order;
  auto low = pool.submit([&](std::stop_token) { order.push_back(0); }, {.priority = 0});
  ASSERT_EQ(pool.post([&](std::stop_token) { order.push_back(1); }, {.priority = 1}),
            Admission::accepted);
  pool.resume();
  low.get();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(order, (std::vector<int>{1, 0}));
}

// Submitters of every level blocked on their full levels at once: each
// freed slot must reach a submitter of its own level (a wake-up taken by a
// submitter of another level, which finds its level still full, must not
// leave the right one asleep). Every submission is accepted and runs.
TEST(PriorityAdmission, BlockedSubmittersOfEveryLevelAllGetIn) {
  Watchdog dog;
  constexpr int kLevels = 3;
  constexpr int kEach = 300;
  Pool pool({.max_workers = 1,
             .queue_capacity = 1,
             .queue_shards = 1,
             .priority_levels = kLevels,
             .priority_aging = 1});
  pool.pause();
  std::atomic<int> ran{0};
  std::vector<std::thread> submitters;
  for (int level = 0; level < kLevels; ++level) {
    for (int t = 0; t < 2; ++t) {
      submitters.emplace_back([&, level] {
        for (int i = 0; i < kEach; ++i) {
          ASSERT_EQ(pool.post([&] { ran.fetch_add(1, std::memory_order_relaxed); },
                              {.priority = static_cast<std::uint8_t>(level)}),
                    Admission::accepted);
        }
      });
    }
  }
  // Every level full, with submitters of every level blocked behind it.
  ASSERT_TRUE(eventually([&] { return pool.stats().queued == kLevels * 1u; }));
  pool.resume();
  for (std::thread& t : submitters) t.join();
  ASSERT_TRUE(pool.wait_idle(30s));
  EXPECT_EQ(ran.load(), kLevels * 2 * kEach);
}

}  // namespace
}  // namespace crew
