// Tests of crew::ShardedPool: placement, combined stats, merged shutdown,
// nested submissions and lifetime.
#include "crew/sharded_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "crew/pool.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::until_stopped;
using test::Watchdog;

// Workers start on demand (min_workers 0), so that pause() right after
// construction holds every task in the queue.
ShardedPoolOptions shards(std::size_t n, std::size_t workers_each,
                          Placement placement = Placement::round_robin) {
  ShardedPoolOptions o;
  o.shards = n;
  o.placement = placement;
  o.pool.name = "sharded";
  o.pool.max_workers = workers_each;
  return o;
}

TEST(ShardedPool, RoundRobinPlacesTasksOnEveryShardInTurn) {
  Watchdog dog;
  ShardedPool sp(shards(4, 1));
  ASSERT_EQ(sp.shards(), 4u);
  EXPECT_EQ(sp.placement(), Placement::round_robin);
  std::atomic<int> ran{0};
  for (int i = 0; i < 400; ++i)
    ASSERT_EQ(sp.post([&ran] { ran.fetch_add(1); }), Admission::accepted);
  ASSERT_TRUE(sp.wait_idle(5s));
  EXPECT_EQ(ran.load(), 400);
  const std::vector<PoolStats> per = sp.shard_stats();
  ASSERT_EQ(per.size(), 4u);
  for (const PoolStats& s : per) EXPECT_EQ(s.submitted, 100u);
  EXPECT_EQ(sp.shard(2).name(), "sharded-2");
}

TEST(ShardedPool, LeastLoadedSteersAroundAShardThatDoesNotProgress) {
  Watchdog dog;
  ShardedPool sp(shards(2, 1, Placement::least_loaded));
  sp.shard(0).pause();  // tasks placed on shard 0 stay queued
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(sp.post([&ran] { ran.fetch_add(1); }), Admission::accepted);
    // Let shard 1 finish its task so that its load is back to 0.
    ASSERT_TRUE(eventually([&] { return sp.load(1) == 0; }));
  }
  EXPECT_LE(sp.load(0), 1u);  // at most the first task, on a tie
  EXPECT_GE(ran.load(), 49);
  sp.shard(0).resume();
  ASSERT_TRUE(sp.wait_idle(5s));
  EXPECT_EQ(ran.load(), 50);
  EXPECT_EQ(sp.load(0), 0u);
  EXPECT_EQ(sp.load(1), 0u);
}

TEST(ShardedPool, LeastLoadedSpreadsBlockedTasksEvenly) {
  Watchdog dog;
  ShardedPool sp(shards(3, 4, Placement::least_loaded));
  Gate release;
  std::vector<Task<void>> tasks;
  for (int i = 0; i < 9; ++i) tasks.push_back(sp.submit([&release] { release.wait(); }));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(sp.load(i), 3u);
  release.open();
  for (Task<void>& t : tasks) t.get();
  ASSERT_TRUE(eventually([&] { return sp.load(0) + sp.load(1) + sp.load(2) == 0; }));
}

TEST(ShardedPool, StatsAddUpTheShards) {
  Watchdog dog;
  ShardedPoolOptions o = shards(3, 2);
  o.pool.min_workers = 2;
  ShardedPool sp(o);
  for (int i = 0; i < 30; ++i) ASSERT_EQ(sp.post([] {}), Admission::accepted);
  for (int i = 0; i < 3; ++i) {
    (void)sp.submit([] { throw std::runtime_error("x"); });
  }
  ASSERT_TRUE(sp.wait_idle(5s));
  const PoolStats s = sp.stats();
  EXPECT_EQ(s.state, PoolState::running);
  EXPECT_EQ(s.workers, 6u);
  EXPECT_EQ(s.max_workers, 6u);
  EXPECT_EQ(s.submitted, 33u);
  EXPECT_EQ(s.outcomes.succeeded, 30u);
  EXPECT_EQ(s.outcomes.failed, 3u);
  sp.shard(1).pause();
  EXPECT_EQ(sp.stats().state, PoolState::running);  // mixed running and paused
  sp.pause();
  EXPECT_EQ(sp.stats().state, PoolState::paused);
  sp.resume();
}

TEST(ShardedPool, SubmitWaitReturnsTheValueAndLongTasksGetTheirToken) {
  Watchdog dog;
  ShardedPool sp(shards(2, 1));
  EXPECT_EQ(sp.submit_wait([] { return 42; }), 42);
  Task<int> t = sp.submit(
      [](std::stop_token s) {
        until_stopped(s);
        return 7;
      },
      {.name = "long", .timeout = 10ms});
  t.wait();
  EXPECT_EQ(t.status(), TaskStatus::timed_out);
  EXPECT_EQ(t.name(), "long");
}

TEST(ShardedPool, OneShutdownStopsEveryShardAndMergesTheReports) {
  Watchdog dog;
  ShardedPool sp(shards(4, 1));
  sp.pause();
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(sp.post([] {}, {.name = "job-" + std::to_string(i)}), Admission::accepted);
  }
  for (int i = 0; i < 4; ++i) ASSERT_EQ(sp.post([] {}), Admission::accepted);
  const ShutdownReport r = sp.shutdown(ShutdownMode::soft, 0ns);
  EXPECT_EQ(r.mode, ShutdownMode::soft);
  EXPECT_FALSE(r.escalated);
  EXPECT_EQ(r.final_state, PoolState::stopped);
  EXPECT_EQ(r.rejected.size(), 8u);
  EXPECT_EQ(r.rejected_unnamed, 4u);
  EXPECT_EQ(r.during.rejected, 12u);
  EXPECT_EQ(r.lifetime.rejected, 12u);
  std::set<std::string> names;
  for (const TaskRef& t : r.rejected) names.insert(t.name);
  EXPECT_EQ(names.size(), 8u);
  EXPECT_EQ(sp.stats().state, PoolState::stopped);
  EXPECT_EQ(sp.post([] {}), Admission::closed);
  // Idempotent: the same merged report again.
  const ShutdownReport again = sp.shutdown();
  EXPECT_EQ(again.rejected.size(), 8u);
  EXPECT_TRUE(sp.restart());
  EXPECT_EQ(sp.submit_wait([] { return 1; }), 1);
}

TEST(ShardedPool, ShardsShutDownTogetherUnderOneTimeout) {
  Watchdog dog;
  ShardedPool sp(shards(4, 1));
  std::atomic<int> started{0};
  // Shards still running when a task's token was stopped by its shard's
  // escalation: none if the shutdowns run in parallel (every one began
  // before any timed out); shutdowns one after the other leave the later
  // shards running through the first one's whole timeout.
  std::atomic<int> running_at_stop{0};
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(sp.post([&](std::stop_token s) {
      started.fetch_add(1);
      until_stopped(s);
      for (const PoolStats& shard : sp.shard_stats()) {
        if (shard.state == PoolState::running) running_at_stop.fetch_add(1);
      }
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(eventually([&] { return started.load() == 4; }));
  const auto timeout = 200ms * test::kSlowdown;  // far beyond starting four threads
  const auto t0 = std::chrono::steady_clock::now();
  const ShutdownReport r = sp.shutdown(ShutdownMode::drain, timeout);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(r.escalated);
  EXPECT_EQ(r.final_state, PoolState::stopped_timeout);
  EXPECT_EQ(r.during.cancelled, 4u);
  EXPECT_GE(took, timeout);
  // In parallel: one timeout, not one per shard.
  EXPECT_EQ(running_at_stop.load(), 0);
  EXPECT_EQ(sp.stats().state, PoolState::stopped_timeout);
}

// As on a Pool: from a task of one of its shards, wait_idle() and
// shutdown() would wait for that task.
TEST(ShardedPool, WaitIdleAndShutdownFromAShardsTaskThrowAtOnce) {
  Watchdog dog;
  ShardedPool sp(shards(2, 1));
  auto code_of = [](auto&& call) -> int {
    try {
      call();
    } catch (const Error& e) {
      return static_cast<int>(e.code());
    }
    return -1;
  };
  auto idle = sp.submit([&] { return code_of([&] { (void)sp.wait_idle(); }); });
  auto drain =
      sp.submit([&] { return code_of([&] { (void)sp.shutdown(ShutdownMode::drain, 0s); }); });
  for (auto* t : {&idle, &drain}) {
    ASSERT_TRUE(t->wait_for(5s * test::kSlowdown)) << "a shard's task waited for itself";
    EXPECT_EQ(t->get(), static_cast<int>(Errc::would_deadlock));
  }
  EXPECT_TRUE(sp.wait_idle(10s));
  EXPECT_EQ(sp.shutdown(ShutdownMode::drain, 0s).final_state, PoolState::stopped);
}

TEST(ShardedPool, ATaskSubmittingFromInsideAShardStaysOnItAndNeverDeadlocks) {
  Watchdog dog;
  ShardedPool sp(shards(4, 1, Placement::least_loaded));
  std::atomic<int> same_thread{0};
  std::vector<Task<int>> outer;
  for (int i = 0; i < 16; ++i) {
    outer.push_back(sp.submit([&sp, &same_thread] {
      const std::thread::id me = std::this_thread::get_id();
      // The only worker of this shard waits for its subtask: it must be on
      // the same shard, where the wait runs it inline.
      return sp.submit_wait([&same_thread, me] {
        if (std::this_thread::get_id() == me) same_thread.fetch_add(1);
        return 1;
      });
    }));
  }
  int sum = 0;
  for (Task<int>& t : outer) sum += t.get();
  EXPECT_EQ(sum, 16);
  EXPECT_EQ(same_thread.load(), 16);
}

TEST(ShardedPool, LeastLoadedCountsEndForDroppedAndRefusedTasks) {
  Watchdog dog;
  ShardedPool sp(shards(2, 1, Placement::least_loaded));
  sp.pause();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(sp.post([] {}), Admission::accepted);
  EXPECT_EQ(sp.load(0) + sp.load(1), 10u);
  (void)sp.shutdown(ShutdownMode::soft, 0ns);
  EXPECT_EQ(sp.load(0) + sp.load(1), 0u);
  EXPECT_EQ(sp.post([] {}), Admission::closed);
  EXPECT_EQ(sp.load(0) + sp.load(1), 0u);
}

TEST(ShardedPool, BadOptionsAreRejectedNamingTheField) {
  ShardedPoolOptions o = shards(2, 1);
  o.pool.min_workers = 3;  // above max_workers
  try {
    ShardedPool sp(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    const std::string what = e.what();
    EXPECT_NE(what.find("ShardedPoolOptions.pool"), std::string::npos) << what;
    EXPECT_NE(what.find("min_workers"), std::string::npos) << what;
  }
}

TEST(ShardedPool, TooManyShardsOrAnUnknownPlacementIsAnError) {
  const auto code_and_what = [](const ShardedPoolOptions& o) -> std::string {
    try {
      ShardedPool sp(o);
    } catch (const Error& e) {
      return e.code() == Errc::invalid_options ? e.what() : "";
    }
    return "";
  };
  ShardedPoolOptions many = shards(ShardedPoolOptions::kMaxShards + 1, 1);
  EXPECT_NE(code_and_what(many).find("ShardedPoolOptions.shards"), std::string::npos);
  ShardedPoolOptions odd = shards(2, 1);
  odd.placement = static_cast<Placement>(7);
  EXPECT_NE(code_and_what(odd).find("ShardedPoolOptions.placement"), std::string::npos);
}

TEST(ShardedPool, ZeroShardsMeansOnePerUsableCpu) {
  ShardedPoolOptions o;
  o.pool.max_workers = 1;
  ShardedPool sp(o);
  EXPECT_EQ(sp.shards(), usable_cpus());
}

TEST(ShardedPool, ManyProducersOnBothPlacements) {
  Watchdog dog(std::chrono::seconds(60));
  for (Placement p : {Placement::round_robin, Placement::least_loaded}) {
    ShardedPool sp(shards(3, 1, p));
    std::atomic<int> ran{0};
    constexpr int kEach = test::kThreadSanitizer ? 2'000 : 20'000;
    std::vector<std::thread> producers;
    for (int t = 0; t < 4; ++t) {
      producers.emplace_back([&] {
        for (int i = 0; i < kEach; ++i) {
          ASSERT_EQ(sp.post([&ran] { ran.fetch_add(1, std::memory_order_relaxed); }),
                    Admission::accepted);
        }
      });
    }
    for (std::thread& t : producers) t.join();
    ASSERT_TRUE(sp.wait_idle(30s));
    EXPECT_EQ(ran.load(), 4 * kEach) << to_string(p);
    EXPECT_EQ(sp.stats().outcomes.succeeded, static_cast<std::uint64_t>(4 * kEach));
  }
}

TEST(ShardedPoolLifetime, AnAbandonedTaskEndsItsCountAfterThePoolIsGone) {
  Watchdog dog;
  std::atomic<bool> finished{false};
  {
    ShardedPoolOptions o = shards(2, 1, Placement::least_loaded);
    o.pool.abandon_grace = 20ms;
    o.pool.shutdown_mode = ShutdownMode::hard;
    ShardedPool sp(o);
    std::atomic<bool> started{false};
    ASSERT_EQ(sp.post([&](std::stop_token) {
      started = true;
      std::this_thread::sleep_for(300ms);  // ignores its token
      finished = true;
    }),
              Admission::accepted);
    ASSERT_TRUE(eventually([&] { return started.load(); }));
  }  // hard shutdown: the task is abandoned, the ShardedPool destroyed
  ASSERT_TRUE(eventually([&] { return finished.load(); }));
  std::this_thread::sleep_for(20ms);  // let it end its count
}

}  // namespace
}  // namespace crew
