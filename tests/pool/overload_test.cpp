// Tests of the overload controller's parts (crew/overload.hpp): its window,
// CoDel's state and its limit with a controlled clock, the newest-first
// queues and the run-time signal. Through a pool: pool_overload_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "crew/detail/newest_first.hpp"
#include "crew/detail/overload_control.hpp"
#include "crew/detail/queues.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using detail::OverloadControl;
using test::Watchdog;

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

// Admits up to the limit, has one more refused (the limit was reached this
// interval), then gives the tickets back.
void reach_limit(OverloadControl& ctl) {
  const std::size_t limit = ctl.read().limit;
  for (std::size_t i = 0; i < limit; ++i) ASSERT_EQ(ctl.admit(0), OverloadReason::none);
  EXPECT_EQ(ctl.admit(0), OverloadReason::limit);
  for (std::size_t i = 0; i < limit; ++i) ctl.release();
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
    reach_limit(c.ctl);
    c.interval({1});
    EXPECT_EQ(c.ctl.read().limit, std::min<std::size_t>(want, 6));
  }
  EXPECT_EQ(c.ctl.read().refused_limit, 6u);
  EXPECT_EQ(c.ctl.read().admitted, 0u);
}

// An onset of overload: while the limit stands at its ceiling, a start
// that waited over 4 x target (20 ms) ends the interval at once, once a
// tenth of it has run, and the limit is cut from what is admitted;
// CoDel's state still waits for a whole interval.
TEST(OverloadLimit, AWaitFarOverTheTargetAtTheCeilingCutsTheLimitBeforeTheIntervalEnds) {
  Controlled c;
  for (int i = 0; i < 30; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
  (void)c.ctl.on_start(25 * kMs, 5 * kMs);  // within the interval's first tenth
  EXPECT_EQ(c.ctl.read().limit, 100u);
  (void)c.ctl.on_start(19 * kMs, 20 * kMs);  // not over 4 x target
  EXPECT_EQ(c.ctl.read().limit, 100u);
  (void)c.ctl.on_start(25 * kMs, 20 * kMs);
  const std::size_t cut = c.ctl.read().limit;
  EXPECT_LT(cut, 10u);  // 1 running + 29 queued x 5 / about 25
  EXPECT_GE(cut, 2u);
  EXPECT_FALSE(c.ctl.read().overloaded);
  // Below the ceiling now: long waits wait for the interval's end.
  (void)c.ctl.on_start(80 * kMs, 60 * kMs);
  EXPECT_EQ(c.ctl.read().limit, cut);
  for (int i = 0; i < 30; ++i) c.ctl.release();
}

// An early end that cut nothing (the percentile within the target) is not
// repeated before the next whole interval ends: CoDel still gets whole
// intervals to decide on.
TEST(OverloadLimit, AnEarlyEndIsNotRepeatedWithinTheNextInterval) {
  Controlled c;
  for (int i = 0; i < 20; ++i) c.ctl.record(1 * kMs, 10 * kMs);
  (void)c.ctl.on_start(25 * kMs, 20 * kMs);  // ends the window: p90 1 ms, no cut
  ASSERT_EQ(c.ctl.read().limit, 100u);
  ASSERT_EQ(c.ctl.read().wait_min, 1ms);
  for (int i = 0; i < 20; ++i) c.ctl.record(2 * kMs, 40 * kMs);
  (void)c.ctl.on_start(25 * kMs, 50 * kMs);  // no second early end
  EXPECT_EQ(c.ctl.read().wait_min, 1ms);
  (void)c.ctl.on_start(2 * kMs, 121 * kMs);  // the whole interval's end (20 + 100 ms)
  EXPECT_EQ(c.ctl.read().wait_min, 2ms);
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

// Far from the limit a thread takes its tickets in batches (credit); a
// refusal still counts only what was admitted: another thread's unspent
// credit is not, and is given back once the limit is reached.
TEST(OverloadCost, CreditAnotherThreadHoldsIsNotCountedAsAdmitted) {
  Watchdog dog;
  Controlled c;                                     // limit 100
  ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);  // and credit for more
  int admitted_there = 0;
  std::thread other([&c, &admitted_there] {
    while (admitted_there < 1000 && c.ctl.admit(0) == OverloadReason::none) ++admitted_there;
  });
  other.join();
  EXPECT_EQ(admitted_there, 99);
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::limit);  // its credit was given back
  EXPECT_EQ(c.ctl.read().admitted, 100u);
  EXPECT_EQ(c.ctl.read().refused_limit, 2u);
  for (int i = 0; i < 100; ++i) c.ctl.release();
  EXPECT_EQ(c.ctl.read().admitted, 0u);
}

// More threads than ledgers at once: the rest count one by one in shared
// counters, and every ticket still counts exactly.
TEST(OverloadCost, TicketsAreCountedExactlyWithMoreThreadsThanLedgers) {
  Watchdog dog;
  Controlled c;  // limit 100
  constexpr std::size_t kThreads = OverloadControl::kLedgers + 4;
  std::latch admitted(kThreads), checked(1);
  std::vector<std::jthread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3; ++i) EXPECT_EQ(c.ctl.admit(0), OverloadReason::none);
      admitted.count_down();
      checked.wait();
      for (int i = 0; i < 3; ++i) c.ctl.release();
    });
  }
  admitted.wait();
  EXPECT_EQ(c.ctl.ledgers_owned(), static_cast<std::int64_t>(OverloadControl::kLedgers));
  EXPECT_EQ(c.ctl.read().admitted, 3 * kThreads);
  checked.count_down();
  threads.clear();  // joins
  EXPECT_EQ(c.ctl.read().admitted, 0u);
  EXPECT_EQ(c.ctl.ledgers_owned(), 0);  // given back as each thread exited
  for (int i = 0; i < 100; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none) << i;
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::limit);
  // A thread leaving gives its ledger back, with the credit in it.
  std::thread([&c] {
    c.ctl.release();
    c.ctl.leave();
  }).join();
  EXPECT_EQ(c.ctl.read().admitted, 99u);
}

// A thread that is no worker gives its ledger (and the credit in it) back
// as it exits: threads that come and go, many more than kLedgers, leave
// every ledger free and nothing admitted, and the next thread gets a
// ledger of its own.
TEST(OverloadCost, ThreadsThatExitGiveTheirLedgersBack) {
  Watchdog dog;
  Controlled c;  // limit 100
  for (std::size_t t = 0; t < 3 * OverloadControl::kLedgers; ++t) {
    std::thread([&c] {
      for (int i = 0; i < 3; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none);
      EXPECT_EQ(c.ctl.ledgers_owned(), 1);
      c.ctl.release();  // two tickets left, one held as credit or not
    }).join();
    EXPECT_EQ(c.ctl.ledgers_owned(), 0) << t;
    EXPECT_EQ(c.ctl.read().admitted, 2 * (t + 1)) << t;
  }
  for (std::size_t i = 0; i < 2 * 3 * OverloadControl::kLedgers; ++i) c.ctl.release();
  EXPECT_EQ(c.ctl.read().admitted, 0u);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(c.ctl.admit(0), OverloadReason::none) << i;
  EXPECT_EQ(c.ctl.admit(0), OverloadReason::limit);
}

// A thread that outlives a controller it used: the controller's
// destruction takes it off the list the thread's exit walks (under ASan, a
// stale entry would be a use after free).
TEST(OverloadCost, AThreadOutlivingAControllerItUsedExitsCleanly) {
  Watchdog dog;
  auto c = std::make_unique<Controlled>();
  Controlled other;  // alive across the thread's exit
  std::latch used(1), destroyed(1);
  std::jthread t([&] {
    EXPECT_EQ(c->ctl.admit(0), OverloadReason::none);
    EXPECT_EQ(other.ctl.admit(0), OverloadReason::none);
    used.count_down();
    destroyed.wait();
    other.ctl.release();
  });
  used.wait();
  c.reset();
  destroyed.count_down();
  t.join();
  EXPECT_EQ(other.ctl.ledgers_owned(), 0);
  EXPECT_EQ(other.ctl.read().admitted, 0u);
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

// With the run-time signal the limit starts at its floor and doubles each
// interval it was reached while run times stay within their bound, up to
// the ceiling; after the first cut it rises by one an interval.
TEST(OverloadRunTime, TheLimitStartsAtItsFloorAndDoublesUntilTheFirstCut) {
  OverloadOptions o = options();
  o.run_time_signal = true;
  Controlled c(o, /*floor=*/2, /*ceiling=*/100, /*workers=*/64);
  EXPECT_EQ(c.ctl.read().limit, 2u);
  // One interval: the limit reached, a task that ran `run_ms`.
  const auto reached = [&c](double run_ms) {
    reach_limit(c.ctl);
    c.ctl.record(kMs / 2, c.now + 1);
    c.ctl.on_end(static_cast<std::int64_t>(run_ms * kMs));
    c.now += 100 * kMs;
    c.ctl.roll(c.now);
  };
  for (const std::size_t want : {4u, 8u, 16u, 32u, 64u, 100u, 100u}) {
    reached(2);
    EXPECT_EQ(c.ctl.read().limit, want);
  }
  reached(20);  // 10 x the baseline: cut to about 100 x 4 / 20
  const std::size_t cut = c.ctl.read().limit;
  EXPECT_GE(cut, 15u);
  EXPECT_LE(cut, 21u);
  reached(2);  // no longer doubled
  EXPECT_EQ(c.ctl.read().limit, cut + 1);
  // Without the signal the limit starts at the ceiling.
  EXPECT_EQ(Controlled(options(), 2, 100, 64).ctl.read().limit, 100u);
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

}  // namespace
}  // namespace crew
