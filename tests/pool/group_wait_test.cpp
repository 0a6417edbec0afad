// Tests of a group's waits: nested groups waited for on a one-worker pool
// (the waiting worker runs the queued tasks), the group's deadline, and
// waits that outlast a written-off callable.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "crew/group.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::until_stopped;
using test::Watchdog;

PoolOptions workers(std::size_t n) { return test::fixed_workers("group-test", n); }

// Each task of level k opens a group, submits `fanout` tasks of level k + 1
// into it and waits: the only worker must run the nested tasks itself.
void nest(Pool& pool, int level, int depth, int fanout, std::atomic<int>& leaves) {
  if (level == depth) {
    leaves.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Group g(pool);
  for (int i = 0; i < fanout; ++i) {
    ASSERT_EQ(g.submit([&pool, level, depth, fanout, &leaves] {
      nest(pool, level + 1, depth, fanout, leaves);
    }),
              Admission::accepted);
  }
  g.wait();
  EXPECT_EQ(g.stats().outcomes.succeeded, static_cast<std::uint64_t>(fanout));
}

TEST(GroupNesting, TenLevelsDeepOnAOneWorkerPoolDoNotDeadlock) {
  Watchdog dog;
  Pool pool(workers(1));
  std::atomic<int> leaves{0};
  Group top(pool);
  ASSERT_EQ(top.submit([&] { nest(pool, 1, 10, 1, leaves); }), Admission::accepted);
  top.wait();
  EXPECT_EQ(leaves.load(), 1);
  EXPECT_EQ(top.stats().outcomes.succeeded, 1u);
}

TEST(GroupNesting, TenLevelsWithTwoTasksEachOnAOneWorkerPoolRunEveryLeaf) {
  Watchdog dog;
  Pool pool(workers(1));
  std::atomic<int> leaves{0};
  Group top(pool);
  ASSERT_EQ(top.submit([&] { nest(pool, 1, 10, 2, leaves); }), Admission::accepted);
  top.wait();
  EXPECT_EQ(leaves.load(), 1 << 9);
}

TEST(GroupNesting, TimedWaitsFromTheOnlyWorkerRunTheQueuedTasks) {
  Watchdog dog;
  Pool pool(workers(1));
  std::atomic<int> depth_reached{0};
  std::function<void(int)> level = [&](int k) {
    depth_reached = std::max(depth_reached.load(), k);
    if (k == 10) return;
    Group g(pool);
    ASSERT_EQ(g.submit([&level, k] { level(k + 1); }), Admission::accepted);
    EXPECT_TRUE(g.wait_for(20s));
  };
  Group top(pool);
  ASSERT_EQ(top.submit([&] { level(1); }), Admission::accepted);
  EXPECT_TRUE(top.wait_for(30s));
  EXPECT_EQ(depth_reached.load(), 10);
}

TEST(GroupNesting, AWaitFromAWorkerRunsTheGroupsTasksOnThatWorker) {
  Watchdog dog;
  Pool pool(workers(1));
  std::mutex mu;
  std::set<std::thread::id> threads;
  Group outer(pool);
  ASSERT_EQ(outer.submit([&] {
    Group inner(pool);
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(inner.submit([&] {
        const std::lock_guard lock(mu);
        threads.insert(std::this_thread::get_id());
      }),
                Admission::accepted);
    }
    inner.wait();
    const std::lock_guard lock(mu);
    threads.insert(std::this_thread::get_id());
  }),
            Admission::accepted);
  outer.wait();
  EXPECT_EQ(threads.size(), 1u);  // all on the pool's only worker
}

TEST(GroupDeadline, QueuedTasksExpireAndLongTasksTimeOutAtTheDeadline) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool, {.name = "deadline", .timeout = 100ms});
  ASSERT_TRUE(g.deadline().has_value());
  std::atomic<bool> queued_ran{false};
  std::atomic<bool> long_started{false};
  ASSERT_EQ(g.submit([&](std::stop_token s) {
    long_started = true;
    until_stopped(s);
  }),
            Admission::accepted);
  ASSERT_EQ(g.submit([&] { queued_ran = true; }), Admission::accepted);
  g.wait();
  const auto ended = std::chrono::steady_clock::now();
  EXPECT_GE(ended, *g.deadline());
  EXPECT_TRUE(long_started.load());
  EXPECT_FALSE(queued_ran.load());
  const GroupStats s = g.stats();
  EXPECT_EQ(s.outcomes.timed_out, 1u);
  EXPECT_EQ(s.outcomes.rejected, 1u);  // expired in the queue
  EXPECT_EQ(g.submit([] {}), Admission::closed);
  EXPECT_EQ(g.stats().outcomes.rejected, 2u);
}

TEST(GroupDeadline, TheGroupDeadlineIsAnUpperBoundOfATasksOwnTimeout) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool, {.timeout = 10s});
  std::atomic<bool> stopped_early{false};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(g.submit(
                [&](const TaskContext& ctx) {
                  EXPECT_LE(ctx.deadline, t0 + 11s);
                  until_stopped(ctx.stop_token);
                  stopped_early = std::chrono::steady_clock::now() - t0 < 5s;
                },
                {.timeout = 30ms}),
            Admission::accepted);
  g.wait();
  EXPECT_TRUE(stopped_early.load());
  EXPECT_EQ(g.stats().outcomes.timed_out, 1u);
}

TEST(GroupDeadline, WaitForTheLargestDurationWaitsForEveryTask) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  Group group(pool);
  Gate gate;
  ASSERT_EQ(group.submit([&gate] { gate.wait(); }), Admission::accepted);
  std::thread opener([&gate] {
    std::this_thread::sleep_for(30ms);
    gate.open();
  });
  // now + max overflows without saturation: a deadline in the past.
  EXPECT_TRUE(group.wait_for(std::chrono::nanoseconds::max()));
  opener.join();
  EXPECT_EQ(group.stats().outcomes.succeeded, 1u);
}

// A task written off (its deadline passed, it ignored its token for
// abandon_grace) has its outcome while its callable still runs: wait() and
// ~Group() return only once the callable returned, so it never touches what
// the caller destroys after them. Its worker is replaced at once.
TEST(GroupLifetime, WaitAndTheDestructorOutlastAWrittenOffCallable) {
  Watchdog dog;
  PoolOptions o = workers(1);
  o.abandon_grace = 20ms;
  Pool pool(std::move(o));
  for (const bool destroy_only : {false, true}) {
    std::atomic<bool> finished{false};
    std::atomic<bool> other_ran{false};
    {
      Group g(pool);
      // Ignores its token: written off 20 ms after its 10 ms deadline, then
      // it throws.
      ASSERT_EQ(g.submit(
                    [&](std::stop_token) {
                      std::this_thread::sleep_for(300ms);
                      finished = true;
                      throw std::runtime_error("late");
                    },
                    {.timeout = 10ms}),
                Admission::accepted);
      // The written-off worker's slot is taken by a new one meanwhile.
      ASSERT_EQ(g.submit([&] { other_ran = true; }), Admission::accepted);
      if (!destroy_only) {
        g.wait();
        EXPECT_TRUE(finished.load()) << "wait() returned while the callable ran";
        EXPECT_TRUE(other_ran.load());
        const GroupStats s = g.stats();
        EXPECT_EQ(s.outcomes.timed_out, 1u);
        EXPECT_EQ(s.outcomes.succeeded, 1u);
        EXPECT_EQ(s.pending, 0u);
      } else {
        ASSERT_TRUE(eventually([&] { return other_ran.load(); }));
      }
    }
    EXPECT_TRUE(finished.load()) << "~Group returned while the callable ran";
  }
}

// wait_for() gives up at its deadline while a written-off callable still
// runs, and a later wait() finds it done.
TEST(GroupLifetime, WaitForTimesOutWhileAWrittenOffCallableRuns) {
  Watchdog dog;
  PoolOptions o = workers(1);
  o.abandon_grace = 10ms;
  Pool pool(std::move(o));
  Gate release;
  std::atomic<bool> finished{false};
  Group g(pool);
  ASSERT_EQ(g.submit(
                [&](std::stop_token) {
                  release.wait();
                  finished = true;
                },
                {.timeout = 5ms}),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().outcomes.timed_out == 1; }));
  EXPECT_FALSE(g.wait_for(50ms));
  EXPECT_EQ(g.stats().pending, 0u);  // its outcome is decided
  release.open();
  g.wait();
  EXPECT_TRUE(finished.load());
}

// A task without a handle holds no reference to the group's state: the
// group may be destroyed the moment its wait sees the last task end, while
// that task's worker is still leaving the group's books. Waits that sleep
// (a thread outside the pool) and waits that poll while helping (a task)
// both race that exit; under ASan a touch of the freed state shows as a use
// after free (at once for a reference dropped twice; a touch within a few
// instructions of the drop is too narrow a window to be caught reliably).
TEST(GroupLifetime, DestroyedAsSoonAsItsLastTaskEnded) {
  Watchdog dog(60s);
  Pool pool(workers(2));
  const int rounds = test::kSlowdown > 1 ? 2'000 : 5'000;
  std::atomic<long> ran{0};
  for (int i = 0; i < rounds; ++i) {
    Group g(pool);
    ASSERT_EQ(g.submit([&] { ran.fetch_add(1, std::memory_order_relaxed); }), Admission::accepted);
    g.wait();
  }
  pool.submit_wait([&] {
    for (int i = 0; i < rounds; ++i) {
      Group g(pool);
      ASSERT_EQ(g.submit([&] { ran.fetch_add(1, std::memory_order_relaxed); }),
                Admission::accepted);
      ASSERT_EQ(g.submit([&] { ran.fetch_add(1, std::memory_order_relaxed); }),
                Admission::accepted);
      g.wait();
    }
  });
  EXPECT_EQ(ran.load(), 3L * rounds);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().outcomes.succeeded, static_cast<std::uint64_t>(3L * rounds + 1));
}

}  // namespace
}  // namespace crew
