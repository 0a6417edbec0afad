// Tests of the overload controller (crew/overload.hpp): its window and
// limit with a controlled clock, and through a pool: refusals past the
// limit, CoDel's shedding (counted once, never run), tickets returned, the
// options' checks.
#include <gtest/gtest.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "affinity.hpp"
#include "crew/detail/newest_first.hpp"
#include "crew/detail/overload_control.hpp"
#include "crew/detail/queues.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "crew/task.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using detail::OverloadControl;
using test::eventually;
using test::Watchdog;
using test::WorkerHold;

constexpr std::int64_t kMs = 1'000'000;

OverloadOptions options(bool adaptive = true) {
  return {.enabled = true, .target = 5ms, .interval = 100ms, .adaptive_limit = adaptive};
}

// A controller at time 0 with the limit bounds [2, 100] and one worker.
struct Controlled {
  explicit Controlled(OverloadOptions o = options(), std::size_t floor = 2,
                      std::size_t ceiling = 100, std::size_t workers = 1)
      : ctl(o, floor, ceiling, workers, /*now=*/0) {}
  // One interval in which tasks started after waiting `waits` (ms).
  void interval(std::initializer_list<double> waits) {
    for (const double w : waits) ctl.record(static_cast<std::int64_t>(w * kMs), now + 1);
    now += 100 * kMs;
    ctl.roll(now);
  }
  OverloadControl ctl;
  std::int64_t now = 0;
};

TEST(OverloadWindow, BucketsBoundTheirWaitsWithinAFifth) {
  std::size_t last = 0;
  for (std::int64_t w = 0; w < 2'000 * kMs; w = w * 5 / 4 + 997) {
    const std::size_t b = OverloadControl::bucket_of(w);
    EXPECT_GE(b, last) << w;
    last = b;
    EXPECT_GT(OverloadControl::bucket_upper_ns(b), w) << w;
    if (w > 10'000 && b + 1 < OverloadControl::kBuckets) {
      EXPECT_LE(OverloadControl::bucket_upper_ns(b), w * 13 / 10 + 1000) << w;
    }
  }
}

TEST(OverloadWindow, KeepsTheMinimumAndTheHighPercentileOfAnInterval) {
  Controlled c;
  for (int i = 1; i <= 100; ++i) c.ctl.record(i * kMs, 1);
  c.interval({});
  const OverloadStats s = c.ctl.read();
  EXPECT_EQ(s.wait_min, 1ms);
  // p90 of 1..100 ms is 90 ms; the bucket's bound is at most a fifth above.
  EXPECT_GE(s.wait_high, 90ms);
  EXPECT_LE(s.wait_high, 110ms);
  EXPECT_DOUBLE_EQ(s.start_rate, 1000.0);  // 100 starts in 100 ms
  // The next interval starts empty: one short wait is its minimum.
  c.interval({0.5});
  EXPECT_EQ(c.ctl.read().wait_min, 500us);
}

TEST(OverloadWindow, AnIntervalWithoutStartsLeavesTheStateAsItWas) {
  Controlled c;
  c.interval({20, 30});
  ASSERT_TRUE(c.ctl.read().overloaded);
  const std::size_t limit = c.ctl.read().limit;
  c.interval({});
  EXPECT_TRUE(c.ctl.read().overloaded);
  EXPECT_EQ(c.ctl.read().limit, limit);
}

TEST(OverloadCodel, OverloadedOnlyWhileAWholeIntervalWaitedOverTheTarget) {
  Controlled c;
  // A burst: long waits, but one task started at once.
  c.interval({0.1, 40, 40, 40});
  EXPECT_FALSE(c.ctl.read().overloaded);
  EXPECT_FALSE(c.ctl.on_start(40 * kMs, c.now + 1));
  // A standing queue: even the shortest wait was over the 5 ms target.
  c.interval({6, 40, 40});
  EXPECT_TRUE(c.ctl.read().overloaded);
  // Two admitted on one worker (the limit's floor): one queued behind the
  // one starting.
  for (int i = 0; i < 2; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
  EXPECT_TRUE(c.ctl.on_start(11 * kMs, c.now + 1));  // over 2 x target: shed
  EXPECT_FALSE(c.ctl.on_start(9 * kMs, c.now + 2));  // under it: runs
  // It drains: one interval whose minimum is within the target ends it.
  c.interval({1, 2});
  EXPECT_FALSE(c.ctl.read().overloaded);
}

// CoDel's backlog guard: a task that waited long while no more work was
// admitted than the pool has workers waited for a start (a busy machine,
// a worker being started), not behind a queue; shedding it frees nothing.
TEST(OverloadCodel, NothingIsShedWhileNoMoreIsAdmittedThanTheWorkers) {
  Controlled c(options(), 2, 100, /*workers=*/2);
  c.interval({6, 40, 40});
  ASSERT_TRUE(c.ctl.read().overloaded);
  ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
  ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
  EXPECT_FALSE(c.ctl.on_start(11 * kMs, c.now + 1));  // 2 admitted, 2 workers
  ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
  EXPECT_TRUE(c.ctl.on_start(11 * kMs, c.now + 2));  // 3 admitted: one queued
}

// Admits `n` at once, then returns the tickets: a peak of n in the interval.
void peak_at(OverloadControl& ctl, int n) {
  for (int i = 0; i < n; ++i) ASSERT_EQ(ctl.admit(0), OverloadReason::none);
  for (int i = 0; i < n; ++i) ctl.release();
}

TEST(OverloadCodel, TheFirstStartAfterAnIdleSpellIsNotShedForItsOwnWait) {
  Controlled c;
  // Nothing started for 5 intervals; then a task that waited 50 ms (a
  // worker being started, say) ends the window alone.
  EXPECT_FALSE(c.ctl.on_start(50 * kMs, 500 * kMs));
  EXPECT_FALSE(c.ctl.read().overloaded);
  EXPECT_EQ(c.ctl.read().wait_min, 50ms);
  // A whole interval of such waits is a standing queue.
  for (int i = 1; i <= 10; ++i) (void)c.ctl.on_start(50 * kMs, (500 + 10 * i) * kMs);
  EXPECT_TRUE(c.ctl.read().overloaded);
}

TEST(OverloadLimit, CutFromTheAdmittedPeakByHowFarThePercentileIsOverTheTarget) {
  Controlled c;
  ASSERT_EQ(c.ctl.read().limit, 100u);  // starts at the ceiling
  peak_at(c.ctl, 100);
  // p90 in the bucket [6.144, 7.168) ms: the 99 queued beyond the one
  // worker x 5 / 7.168, plus the one running.
  c.interval({6.25, 6.25, 6.25});
  EXPECT_EQ(c.ctl.read().limit, 70u);
  // From the peak in use (10), not from the limit (70): 1 + 9 x 5 / 10.24.
  peak_at(c.ctl, 10);
  c.interval({10});
  EXPECT_EQ(c.ctl.read().limit, 5u);
}

TEST(OverloadLimit, KeepsWhatTheWorkersRunAndCutsTheQueuedPart) {
  Controlled c(options(), 2, 100, /*workers=*/16);
  peak_at(c.ctl, 24);
  c.interval({10});  // 16 + 8 x 5 / 10.24
  EXPECT_EQ(c.ctl.read().limit, 20u);
  for (int i = 0; i < 5; ++i) {
    peak_at(c.ctl, static_cast<int>(c.ctl.read().limit));
    c.interval({1000});
  }
  EXPECT_EQ(c.ctl.read().limit, 16u);  // never below the workers it had busy
}

// Long waits with no more admitted than workers (the first tasks of a pool
// waiting for its workers to start, say) are no backlog: cutting the limit
// to what was in use would refuse work that idle workers could run.
TEST(OverloadLimit, IsNotCutWhileNoMoreWereAdmittedThanWorkers) {
  Controlled c(options(), 2, 100, /*workers=*/3);
  peak_at(c.ctl, 2);
  c.interval({50, 50});
  EXPECT_EQ(c.ctl.read().limit, 100u);
  peak_at(c.ctl, 3);
  c.interval({50, 50, 50});
  EXPECT_EQ(c.ctl.read().limit, 100u);
  peak_at(c.ctl, 4);  // one queued behind the three
  c.interval({50, 50, 50});
  EXPECT_LT(c.ctl.read().limit, 4u);
  EXPECT_GE(c.ctl.read().limit, 3u);
}

TEST(OverloadLimit, NeverFallsBelowItsFloor) {
  Controlled c;
  for (int i = 0; i < 50; ++i) {
    peak_at(c.ctl, static_cast<int>(c.ctl.read().limit));  // all of it in use
    c.interval({1000});
    EXPECT_GE(c.ctl.read().limit, 2u);
  }
  EXPECT_EQ(c.ctl.read().limit, 2u);
  // At the floor, tickets up to it are still given.
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::none);
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::none);
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::limit);
}

TEST(OverloadLimit, RisesByOneOnlyWhileReachedAndWithinTheTargetUpToItsCeiling) {
  Controlled c(options(), 2, 6);
  for (int i = 0; i < 10; ++i) c.interval({1000});
  ASSERT_EQ(c.ctl.read().limit, 2u);
  c.interval({1});  // not reached: stays
  EXPECT_EQ(c.ctl.read().limit, 2u);
  for (std::size_t want = 3; want <= 8; ++want) {
    // Reach the limit, then give the tickets back.
    const std::size_t limit = c.ctl.read().limit;
    for (std::size_t i = 0; i < limit; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
    EXPECT_EQ(c.ctl.admit(0), OverloadReason::limit);
    for (std::size_t i = 0; i < limit; ++i) c.ctl.release();
    c.interval({1});
    EXPECT_EQ(c.ctl.read().limit, std::min<std::size_t>(want, 6));
  }
  EXPECT_EQ(c.ctl.read().refused_limit, 6u);
  EXPECT_EQ(c.ctl.read().admitted, 0u);
}

TEST(OverloadLimit, CodelAloneKeepsTheCeiling) {
  Controlled c(options(/*adaptive=*/false));
  c.interval({1000, 1000});
  EXPECT_TRUE(c.ctl.read().overloaded);
  EXPECT_EQ(c.ctl.read().limit, 100u);
}

TEST(OverloadDeadline, RefusesWhatTheBacklogCannotStartInTime) {
  Controlled c;
  c.interval({1, 1, 1, 1, 1, 1, 1, 1, 1, 1});  // 10 starts in 100 ms: 10 ms each
  // One running (a worker) and four queued ahead: about 40 ms to start.
  for (int i = 0; i < 5; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
  EXPECT_EQ(c.ctl.admit(30 * kMs), OverloadReason::deadline);
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::none);  // without a queue timeout
  EXPECT_EQ(c.ctl.admit(100 * kMs), OverloadReason::none);
  EXPECT_EQ(c.ctl.read().refused_deadline, 1u);
  EXPECT_EQ(c.ctl.read().admitted, 7u);
}

// Tickets come back on other threads (the workers) than the one that took
// them; admit() checks a stale sum of them, but never refuses from it.
TEST(OverloadCost, ARefusalComesFromAFreshSumOfTheReturnedTickets) {
  Controlled c(options(), 2, 4);
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none) << round;
    EXPECT_EQ(c.ctl.admit(0), OverloadReason::limit);
    std::thread returner([&c] {
      for (int i = 0; i < 4; ++i) c.ctl.release();
    });
    returner.join();
    EXPECT_EQ(c.ctl.read().admitted, 0u);
  }
  EXPECT_EQ(c.ctl.read().refused_limit, 100u);
}

// Above kDenseStarts starts an interval, one admission in kSampleEvery per
// thread is timed; every one again once the pool is overloaded, or quiet.
TEST(OverloadCost, QueueWaitsAreSampledOnlyWhileStartsAreManyAndThePoolIsNotOverloaded) {
  Controlled c;
  auto timed_of = [&c](int n) {
    int timed = 0;
    for (int i = 0; i < n; ++i) timed += c.ctl.time_this() ? 1 : 0;
    return timed;
  };
  EXPECT_EQ(timed_of(100), 100);  // the first interval: every one
  for (std::int64_t i = 0; i < OverloadControl::kDenseStarts; ++i)
    c.ctl.record(kMs / 10, c.now + 1);
  c.now += 100 * kMs;
  c.ctl.roll(c.now);
  constexpr int kAdmissions = 16 * static_cast<int>(OverloadControl::kSampleEvery);
  EXPECT_EQ(timed_of(kAdmissions), 16);
  // The start rate counts the untimed ones: kSampleEvery per timed start.
  for (int i = 0; i < 100; ++i) c.ctl.record(kMs / 10, c.now + 1);
  c.now += 100 * kMs;
  c.ctl.roll(c.now);
  EXPECT_NEAR(c.ctl.read().start_rate, 100.0 * OverloadControl::kSampleEvery * 10.0, 1.0);
  EXPECT_EQ(timed_of(kAdmissions), 16);
  c.interval({20, 30});  // few starts, and a standing queue
  EXPECT_TRUE(c.ctl.read().overloaded);
  EXPECT_EQ(timed_of(kAdmissions), kAdmissions);
}

// A fill that queues a task noting `v` in `order` when it runs.
auto noting(std::vector<int>& order, int v) {
  return [&order, v](detail::Cell& c) noexcept { c.emplace([&order, v] { order.push_back(v); }); };
}

// Runs every cell `q` gives one worker's pops, in the order they come.
void drain(detail::Queues& q) {
  detail::PopState st;
  detail::Cell c;
  while (q.try_pop(c, st)) (void)c.invoke_and_destroy();
}

// A level's newest-first cells go before its ring's, except every other
// pop, which takes the ring's oldest (what queued before the standing
// queue still drains).
TEST(OverloadNewestFirst, ALevelGivesItsNewestFirstCellsBeforeItsRingsEveryOtherPop) {
  detail::Queues q(64, 1, 1, 8, /*newest_first=*/true);
  std::vector<int> order;
  auto push = [&](int v, bool newest) {
    return newest ? q.try_push_newest(noting(order, v), 0) : q.try_push(noting(order, v), 0);
  };
  for (int v : {1, 2, 3}) ASSERT_TRUE(push(v, false));
  for (int v : {11, 12, 13}) ASSERT_TRUE(push(v, true));
  EXPECT_EQ(q.size(), 6u);
  EXPECT_EQ(q.pushed(), 6u);
  drain(q);
  EXPECT_EQ(order, (std::vector<int>{13, 1, 12, 2, 11, 3}));
  EXPECT_TRUE(q.empty());
}

// With its ring empty, a level's every other pop takes the stack's oldest
// cell: the bottom of a stack that never empties still comes up.
TEST(OverloadNewestFirst, WithTheRingEmptyEveryOtherPopTakesTheStacksOldest) {
  detail::Queues q(64, 1, 1, 8, /*newest_first=*/true);
  std::vector<int> order;
  for (int v : {11, 12, 13, 14, 15, 16}) ASSERT_TRUE(q.try_push_newest(noting(order, v), 0));
  drain(q);
  EXPECT_EQ(order, (std::vector<int>{16, 11, 15, 12, 14, 13}));
  EXPECT_TRUE(q.empty());
}

// The stack is a ring of slots: cells pushed after the oldest ones left
// wrap around, and both ends stay in order.
TEST(OverloadNewestFirst, TheStackWrapsAroundItsSlots) {
  detail::NewestFirst stack(4);
  std::vector<int> order;
  auto push = [&](int v) { return stack.try_push(noting(order, v)); };
  auto run = [](detail::Cell& c) { (void)c.invoke_and_destroy(); };
  for (int v : {1, 2, 3, 4}) ASSERT_TRUE(push(v));
  EXPECT_FALSE(push(5));  // full
  detail::Cell c;
  ASSERT_TRUE(stack.try_pop_oldest(c));
  run(c);
  ASSERT_TRUE(stack.try_pop_oldest(c));
  run(c);
  for (int v : {5, 6}) ASSERT_TRUE(push(v));  // in the two freed slots
  EXPECT_FALSE(push(7));
  EXPECT_EQ(stack.size(), 4u);
  ASSERT_TRUE(stack.try_pop(c));  // the newest: 6
  run(c);
  ASSERT_TRUE(stack.try_pop_oldest(c));  // the oldest: 3
  run(c);
  while (stack.try_pop(c)) run(c);  // 5, then 4
  EXPECT_EQ(order, (std::vector<int>{1, 2, 6, 3, 5, 4}));
  EXPECT_EQ(stack.size(), 0u);
  EXPECT_FALSE(stack.try_pop_oldest(c));
  EXPECT_EQ(stack.pushed(), 6u);
}

// A higher level takes the newest-first cell of the lowest level below it
// that has one; none below, or none at all: nothing taken.
TEST(OverloadNewestFirst, ADisplacingLevelTakesTheNewestCellOfTheLowestLevelBelowIt) {
  detail::Queues q(64, 1, 3, 8, /*newest_first=*/true);
  std::vector<int> order;
  auto push = [&](int v, std::size_t level) { return q.try_push_newest(noting(order, v), level); };
  detail::Cell c;
  EXPECT_EQ(q.take_newest_below(2, c), 2u);
  ASSERT_TRUE(push(1, 1));
  ASSERT_TRUE(push(2, 1));
  ASSERT_TRUE(push(3, 2));
  EXPECT_EQ(q.take_newest_below(1, c), 1u);  // nothing below level 1
  EXPECT_EQ(q.take_newest_below(2, c), 1u);
  (void)c.invoke_and_destroy();
  EXPECT_EQ(order, std::vector<int>{2});
  EXPECT_EQ(q.level_size(1), 1u);
  EXPECT_EQ(q.level_size(2), 1u);
  while (q.try_pop(c)) c.destroy();
}

// A model of 16 workers sharing one CPU, arrivals ramping up: the k tasks
// in use at once each run k times their own 2 ms, while their queue waits
// stay short (the queue hides in the OS run queue). Returns the limit
// after 30 intervals.
std::size_t limit_on_one_cpu(bool run_time_signal) {
  OverloadOptions o = options();
  o.run_time_signal = run_time_signal;
  Controlled c(o, /*floor=*/2, /*ceiling=*/100, /*workers=*/16);
  for (int i = 0; i < 30; ++i) {
    const auto k = static_cast<int>(
        std::min<std::size_t>({c.ctl.read().limit, 16u, 1u + 2u * static_cast<std::size_t>(i)}));
    peak_at(c.ctl, k);
    for (int t = 0; t < k; ++t) {
      c.ctl.record(kMs / 2, c.now + 1);
      c.ctl.on_end(k * 2 * kMs);
    }
    c.now += 100 * kMs;
    c.ctl.roll(c.now);
  }
  return c.ctl.read().limit;
}

TEST(OverloadRunTime, BringsTheLimitOfManyWorkersOnOneCpuDownToItsFloor) {
  EXPECT_LE(limit_on_one_cpu(/*run_time_signal=*/true), 3u);
  // The queue wait alone sees nothing.
  EXPECT_EQ(limit_on_one_cpu(/*run_time_signal=*/false), 100u);
}

// The baseline is the lowest interval minimum; it rises slowly while run
// times stay within its bound (the tasks became longer), and not at all
// in an interval the signal cut.
TEST(OverloadRunTime, TheBaselineFallsAtOnceAndRisesOnlyWithinItsBound) {
  OverloadOptions o = options();
  o.run_time_signal = true;
  Controlled c(o, 2, 100, 16);
  auto interval = [&c](double run_ms) {
    c.ctl.record(kMs / 2, c.now + 1);
    c.ctl.on_end(static_cast<std::int64_t>(run_ms * kMs));
    c.now += 100 * kMs;
    c.ctl.roll(c.now);
  };
  interval(4);
  EXPECT_EQ(c.ctl.read().run_baseline, 4ms);
  interval(2);
  EXPECT_EQ(c.ctl.read().run_baseline, 2ms);
  interval(3);  // within 2 x 2 ms: up by a sixteenth of the gap
  EXPECT_EQ(c.ctl.read().run_baseline, 2ms + 62'500ns);
  const auto before = c.ctl.read().run_baseline;
  interval(20);  // over the bound: not raised
  EXPECT_EQ(c.ctl.read().run_baseline, before);
  EXPECT_GE(c.ctl.read().run_high, 20ms);
}

// ---- Through a pool ----

PoolOptions overloaded_pool(std::size_t workers, OverloadOptions o) {
  PoolOptions p = test::fixed_workers("overload", workers);
  p.overload = o;
  return p;
}

TEST(PoolOverload, OffByDefault) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  EXPECT_FALSE(pool.stats().overload.enabled);
  EXPECT_EQ(pool.overload_hint().reason, OverloadReason::none);
  EXPECT_EQ(pool.post([] {}), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().overload.admitted, 0u);  // nothing counts tickets
}

TEST(PoolOverload, OptionsAreCheckedAndTheFloorIsAtLeastTwo) {
  Pool small(overloaded_pool(1, {.enabled = true}));
  EXPECT_EQ(small.stats().overload.limit, 1000u * usable_cpus() + 1u);  // the ceiling
  Pool tiny({.max_workers = 1, .queue_capacity = 1, .overload = {.enabled = true}});
  EXPECT_EQ(tiny.stats().overload.limit, 2u);  // ceiling 1 + 1 = floor 2
  EXPECT_THROW(Pool({.overload = {.enabled = true, .target = 0ms}}), Error);
  EXPECT_THROW(Pool({.overload = {.enabled = true, .percentile = 0}}), Error);
  EXPECT_THROW(Pool({.overload = {.enabled = true, .run_time_signal = true, .run_time_factor = 1}}),
               Error);
  try {
    Pool bad({.overload = {.enabled = true, .min_limit = 1, .max_limit = 1}});
    ADD_FAILURE() << "a ceiling below the floor of 2 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("overload.max_limit"), std::string::npos) << e.what();
  }
}

TEST(PoolOverload, SubmissionsPastTheLimitAreRefusedAtOnceWithTheReason) {
  Watchdog dog;
  Pool pool(overloaded_pool(1, {.enabled = true, .max_limit = 3}));
  WorkerHold hold(pool);  // one ticket
  std::atomic<int> ran{0};
  EXPECT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  auto second = pool.submit([&] { return ran.fetch_add(1); });
  EXPECT_EQ(pool.overload_hint().reason, OverloadReason::limit);
  EXPECT_EQ(pool.refuse_if_overloaded().reason, OverloadReason::limit);  // counted
  EXPECT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::overloaded);
  auto refused = pool.submit([&] { return ran.fetch_add(1); });
  ASSERT_EQ(refused.status(), TaskStatus::rejected);
  try {
    (void)refused.get();
    ADD_FAILURE() << "get() of a refused task must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::rejected);
    EXPECT_EQ(e.admission(), Admission::overloaded);
    EXPECT_EQ(e.overload_reason(), OverloadReason::limit);
  }
  EXPECT_EQ(pool.stats().overload.admitted, 3u);
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 2);
  const PoolStats s = pool.stats();
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));  // all back
  EXPECT_EQ(s.overload.refused_limit, 3u);
  EXPECT_EQ(s.outcomes.rejected, 2u);  // the early refusal submitted nothing
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_EQ(pool.overload_hint().reason, OverloadReason::none);
}

TEST(PoolOverload, TasksOfItsOwnTasksAreNeitherCountedNorRefused) {
  Watchdog dog;
  Pool pool(overloaded_pool(2, {.enabled = true, .max_limit = 2}));
  std::atomic<int> children{0};
  auto parent = pool.submit([&] {
    for (int i = 0; i < 10; ++i) {
      if (pool.post([&] { children.fetch_add(1); }) != Admission::accepted) return false;
    }
    return true;
  });
  EXPECT_TRUE(parent.get());
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(children.load(), 10);
  // A ticket goes back just after its task's outcome is published.
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
}

// Counts what observers hear of shed tasks.
struct ShedCounter : Observer {
  std::atomic<int> shed{0};
  std::atomic<int> started{0};
  void on_task_started(const TaskEvent&, std::chrono::nanoseconds) noexcept override {
    started.fetch_add(1);
  }
  void on_task_rejected(const TaskEvent&, TaskStatus outcome, Errc reason,
                        Admission) noexcept override {
    if (outcome == TaskStatus::shed && reason == Errc::overloaded) shed.fetch_add(1);
  }
};

// get() of a shed task throws Errc::overloaded with the reason.
void expect_shed(Task<void>& t, OverloadReason why) {
  try {
    t.get();
    ADD_FAILURE() << "get() of a shed task must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::overloaded);
    EXPECT_EQ(e.overload_reason(), why);
  }
}

// One worker, held for several intervals while tasks queue, each task
// then taking longer than the target: the first interval after the hold
// has only waits over the target, so CoDel sheds the rest of the backlog.
// `handles`: submitted with Task handles (task states) and an observer, or
// posted plain.
void shed_backlog(bool handles) {
  Watchdog dog;
  constexpr int kTasks = 40;
  auto seen = std::make_shared<ShedCounter>();
  PoolOptions o = overloaded_pool(
      1, {.enabled = true, .target = 2ms, .interval = 10ms, .adaptive_limit = false});
  if (handles) o.observers.push_back(seen);
  Pool pool(o);
  std::atomic<int> ran{0};
  auto task = [&ran] {
    ran.fetch_add(1);
    std::this_thread::sleep_for(5ms);
  };
  std::vector<Task<void>> tasks;
  {
    WorkerHold hold(pool);
    for (int i = 0; i < kTasks; ++i) {
      if (handles) {
        tasks.push_back(pool.submit(task));
      } else {
        ASSERT_EQ(pool.post(task), Admission::accepted);
      }
    }
    std::this_thread::sleep_for(50ms);  // five intervals
  }
  ASSERT_TRUE(pool.wait_idle(20s));
  const PoolStats s = pool.stats();
  EXPECT_GT(s.outcomes.shed, 0u);
  EXPECT_EQ(s.outcomes.shed, s.overload.shed_codel);
  EXPECT_EQ(s.outcomes.succeeded, static_cast<std::uint64_t>(ran.load()) + 1);  // + the hold
  EXPECT_EQ(static_cast<std::uint64_t>(ran.load()) + s.outcomes.shed, std::uint64_t{kTasks});
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  if (handles) {
    int shed = 0;
    for (auto& t : tasks) {
      if (t.status() != TaskStatus::shed) continue;
      ++shed;
      // Its wait until it was shed, over twice the target; it never ran.
      EXPECT_GT(t.queue_wait(), 4ms);
      EXPECT_EQ(t.run_time(), 0ns);
      expect_shed(t, OverloadReason::codel);
    }
    EXPECT_EQ(static_cast<std::uint64_t>(shed), s.outcomes.shed);
    EXPECT_EQ(seen->shed.load(), shed);               // heard once each
    EXPECT_EQ(seen->started.load(), ran.load() + 1);  // shed ones never started
  }
}

TEST(PoolOverload, CodelShedsAStandingBacklogOfTaskStatesUnrunAndCountsEachOnce) {
  shed_backlog(/*handles=*/true);
}

TEST(PoolOverload, CodelShedsAStandingBacklogOfPlainTasksUnrunAndCountsEachOnce) {
  shed_backlog(/*handles=*/false);
}

TEST(PoolOverload, ASoftShutdownReturnsTheTicketsOfWhatItDrops) {
  Watchdog dog;
  Pool pool(overloaded_pool(1, {.enabled = true}));
  {
    WorkerHold hold(pool);
    for (int i = 0; i < 5; ++i) ASSERT_EQ(pool.post([] {}), Admission::accepted);
    auto t = pool.submit([] { return 1; });
    EXPECT_EQ(pool.stats().overload.admitted, 7u);
    std::thread releaser([&hold] {
      std::this_thread::sleep_for(20ms);
      hold.release();
    });
    (void)pool.shutdown(ShutdownMode::soft, 10s);
    releaser.join();
  }
  // A ticket goes back just after its task's outcome is published.
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  EXPECT_EQ(pool.stats().outcomes.rejected, 6u);
}

// While the controller reports a standing queue (here: the limit was
// reached, and no interval ends), admitted tasks queue newest first (every
// other pop taking the level's oldest); until then, oldest first.
TEST(PoolOverload, AStandingQueueGivesTheNewestTaskFirst) {
  Watchdog dog;
  Pool pool(overloaded_pool(1, {.enabled = true, .interval = 60s, .max_limit = 4}));
  std::mutex mu;
  std::vector<int> order;
  auto task = [&](int v) {
    return [&mu, &order, v] {
      const std::lock_guard<std::mutex> lock(mu);
      order.push_back(v);
    };
  };
  {
    WorkerHold hold(pool);  // one ticket
    for (int v : {0, 1, 2})
      ASSERT_EQ(pool.post(task(v)), Admission::accepted);  // the last at the limit
    EXPECT_EQ(pool.post(task(99)), Admission::overloaded);
  }
  ASSERT_TRUE(pool.wait_idle(10s));
  {
    WorkerHold hold(pool);  // still standing: the limit was reached this interval
    for (int v : {3, 4, 5}) ASSERT_EQ(pool.post(task(v)), Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(10s));
  const std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{2, 0, 1, 5, 3, 4}));
}

// At the limit, a higher priority's submission displaces the newest task a
// lower level queued newest first: that one ends shed (reason priority)
// unrun, counted once; the arrival is admitted and runs. With nothing
// lower to displace, it is refused (reason limit).
void displaced_by_priority(bool handles) {
  Watchdog dog;
  PoolOptions o = overloaded_pool(1, {.enabled = true, .interval = 60s, .max_limit = 4});
  o.priority_levels = 2;
  auto seen = std::make_shared<ShedCounter>();
  if (handles) o.observers.push_back(seen);
  Pool pool(o);
  std::atomic<int> ran{0};
  auto low = [&ran] { ran.fetch_add(1); };
  Task<void> displaced;
  Task<int> high;
  {
    WorkerHold hold(pool);
    ASSERT_EQ(pool.post(low), Admission::accepted);
    ASSERT_EQ(pool.post(low), Admission::accepted);
    if (handles) {
      displaced = pool.submit(low);  // at the limit: queued newest first
      ASSERT_EQ(displaced.status(), TaskStatus::queued);
    } else {
      ASSERT_EQ(pool.post(low), Admission::accepted);
    }
    high = pool.submit([] { return 7; }, {.priority = 1});
    EXPECT_NE(high.status(), TaskStatus::rejected);
    EXPECT_EQ(pool.post([] {}, {.priority = 1}), Admission::overloaded);  // nothing lower left
    EXPECT_EQ(pool.post(low), Admission::overloaded);                     // no lower level
  }
  EXPECT_EQ(high.get(), 7);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.shed, 1u);
  EXPECT_EQ(s.overload.shed_priority, 1u);
  EXPECT_EQ(s.overload.shed_codel, 0u);
  EXPECT_EQ(s.overload.refused_limit, 2u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  if (handles) {
    EXPECT_EQ(displaced.status(), TaskStatus::shed);
    expect_shed(displaced, OverloadReason::priority);
    EXPECT_EQ(seen->shed.load(), 1);
  }
}

TEST(PoolOverload, AHigherPriorityAtTheLimitDisplacesTheNewestLowerTaskState) {
  displaced_by_priority(/*handles=*/true);
}

TEST(PoolOverload, AHigherPriorityAtTheLimitDisplacesTheNewestLowerPlainTask) {
  displaced_by_priority(/*handles=*/false);
}

// Spins until this thread has used `cpu` of CPU time: work of a fixed
// size, whose run time grows with the threads sharing its CPU.
void burn(std::chrono::nanoseconds cpu) {
  auto used = [] {
    timespec ts{};
    (void)clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  const auto end = used() + cpu;
  while (used() < end) {
  }
}

// 16 workers pinned to one CPU (a queue hidden in the OS run queue), tasks
// of 1 ms of CPU: arrivals trickle in first (tasks run alone: the
// baseline), then flood. The run-time signal brings the limit down to a
// few tasks at once; the queue wait alone would keep it at 16 or more
// (OverloadRunTime.BringsTheLimitOfManyWorkersOnOneCpuDownToItsFloor).
TEST(PoolOverload, TheRunTimeSignalBringsTheLimitOfSixteenWorkersOnOneCpuNearItsFloor) {
  Watchdog dog;
  const int cpu = test::first_cpu();
  ASSERT_GE(cpu, 0);
  PoolOptions o = overloaded_pool(
      16, {.enabled = true, .interval = 20ms, .max_limit = 64, .run_time_signal = true});
  o.on_worker_start = [cpu](std::uint64_t) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<std::size_t>(cpu), &one);
    EXPECT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  };
  Pool pool(o);
  auto task = [] { burn(1ms); };
  for (int i = 0; i < 100; ++i) {
    (void)pool.post(task);
    std::this_thread::sleep_for(3ms);
  }
  const auto flood_end = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < flood_end) {
    (void)pool.post(task);
    std::this_thread::sleep_for(100us);
  }
  const OverloadStats s = pool.stats().overload;
  EXPECT_LE(s.limit, 5u) << "baseline " << s.run_baseline.count() << " ns, run p90 "
                         << s.run_high.count() << " ns";
  EXPECT_GT(s.run_baseline, 0ns);
  EXPECT_GT(s.refused_limit, 0u);
}

}  // namespace
}  // namespace crew
