// Tests of crew::Group: waiting, cancellation, errgroup's rule, counting,
// and submissions racing waits and cancel (nested waits, deadlines and
// lifetime: group_wait_test.cpp).
#include "crew/group.hpp"

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

#include "crew/pool.hpp"
#include "replaced_new.hpp"  // operator new: counts allocations
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::until_stopped;
using test::Watchdog;

PoolOptions workers(std::size_t n) { return test::fixed_workers("group-test", n); }

TEST(Group, WaitReturnsOnceEveryTaskHasEnded) {
  Watchdog dog;
  Pool pool(workers(2));
  Group g(pool);
  std::atomic<int> ran{0};
  for (int i = 0; i < 10'000; ++i) {
    ASSERT_EQ(g.submit([&ran] { ran.fetch_add(1, std::memory_order_relaxed); }),
              Admission::accepted);
  }
  g.wait();
  EXPECT_EQ(ran.load(), 10'000);
  const GroupStats s = g.stats();
  EXPECT_EQ(s.submitted, 10'000u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.outcomes.succeeded, 10'000u);
  EXPECT_EQ(s.outcomes.total(), 10'000u);
  EXPECT_FALSE(g.cancelled());
  EXPECT_EQ(g.first_exception(), nullptr);
}

// A task with a handle (named) that submits a task without one into the
// same group: wait() covers both kinds in one pass, whichever adds which.
TEST(Group, WaitCoversTasksThatAHandleTaskSubmittedToTheGroup) {
  Watchdog dog;
  Pool pool({.name = "t", .max_workers = 2});
  for (int round = 0; round < 5; ++round) {
    std::atomic<bool> inner_done{false};
    Group g(pool);
    g.submit(
        [&] {
          std::this_thread::sleep_for(10ms);
          g.submit([&] {
            std::this_thread::sleep_for(50ms);
            inner_done = true;
          });
        },
        {.name = "outer"});
    g.wait();
    EXPECT_TRUE(inner_done) << "round " << round;
  }
}

// Nothing of a task outlives wait(): its callable's captures are destroyed
// before the group counts the task, with a handle or without.
TEST(Group, ATasksCapturesAreDestroyedBeforeWaitReturns) {
  Watchdog dog;
  Pool pool({.name = "t", .max_workers = 2});
  for (const bool named : {false, true}) {
    std::atomic<bool> destroyed{false};
    Group g(pool);
    g.submit([p = test::DestructionProbe(&destroyed)] {}, {.name = named ? "named" : ""});
    g.wait();
    EXPECT_TRUE(destroyed) << (named ? "named" : "unnamed");
  }
}

// A caller that saw the group end sees its tasks in the pool's stats.
TEST(Group, StatsCountEveryTaskOnceWaitReturned) {
  Watchdog dog;
  Pool pool({.name = "t", .max_workers = 2});
  for (int i = 0; i < 500; ++i) {
    const std::uint64_t before = pool.stats().outcomes.succeeded;
    Group g(pool);
    g.submit([] {});
    g.wait();
    ASSERT_EQ(pool.stats().outcomes.succeeded, before + 1) << "try " << i;
  }
}

// Out of memory while a group submits: a callable too large for a cell is
// boxed before a queue slot is claimed (boxing inside the claim would throw
// where nothing may, and end the process), so submit() throws bad_alloc and
// the group stays consistent.
TEST(GroupOutOfMemory, ALargeTaskWhoseBoxCannotBeAllocatedMakesSubmitThrow) {
  Watchdog dog;
  Pool pool({.name = "t", .max_workers = 1});
  std::atomic<int> ran{0};
  int threw = 0;
  for (long n = 1; n <= 4; ++n) {
    Group g(pool);
    std::array<char, 2048> big{};
    big[0] = 1;
    test::t_fail_allocation_in = n;
    try {
      g.submit([big, &ran] { ran.fetch_add(big[0]); });
    } catch (const std::bad_alloc&) {
      ++threw;
    }
    test::t_fail_allocation_in = 0;
    g.wait();
    EXPECT_EQ(g.stats().submitted, g.stats().outcomes.total()) << "allocation " << n;
  }
  EXPECT_GT(threw, 0) << "no allocation of the submission failed";
  EXPECT_EQ(ran.load() + threw, 4);
}

// Out of memory for the group's list of handles, after the task was
// submitted to the pool: the task does not escape the group. submit()
// throws only once the task is cancelled (or has ended), so nothing of it
// runs after wait() returned.
TEST(GroupOutOfMemory, ATaskWhoseHandleCannotBeListedDoesNotOutliveTheGroup) {
  Watchdog dog;
  Pool pool({.name = "t", .max_workers = 1});
  int threw = 0;
  for (long n = 1; n <= 8; ++n) {
    std::atomic<bool> waited{false};
    std::atomic<bool> ran_after_wait{false};
    {
      test::WorkerHold hold(pool);
      Group g(pool);
      for (int i = 0; i < 4; ++i) g.submit([] {}, {.name = "first"});
      test::t_fail_allocation_in = n;
      try {
        g.submit(
            [&] {
              // Long enough for the caller to pass wait() if the group
              // did not wait for this task.
              std::this_thread::sleep_for(20ms);
              if (waited) ran_after_wait = true;
            },
            {.name = "fifth"});
      } catch (const std::bad_alloc&) {
        ++threw;
      }
      test::t_fail_allocation_in = 0;
      hold.release();
      g.wait();
      waited = true;
    }
    ASSERT_TRUE(pool.wait_idle(5s * test::kSlowdown));
    EXPECT_FALSE(ran_after_wait) << "allocation " << n << ": a task ran after wait() returned";
  }
  EXPECT_GT(threw, 0) << "no allocation of the submission failed";
}

TEST(Group, WaitOnAnEmptyGroupReturnsAtOnce) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool);
  g.wait();
  EXPECT_TRUE(g.wait_for(0ms));
  EXPECT_EQ(g.stats().submitted, 0u);
}

TEST(Group, CountsEveryOutcomeAndAgreesWithThePool) {
  Watchdog dog;
  Pool pool(workers(2));
  Group g(pool);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(g.submit([] {}), Admission::accepted);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(g.submit([] { throw std::runtime_error("boom"); }), Admission::accepted);
  }
  ASSERT_EQ(g.submit([](std::stop_token s) { until_stopped(s); }, {.timeout = 10ms}),
            Admission::accepted);
  g.wait();
  const GroupStats s = g.stats();
  EXPECT_EQ(s.outcomes.succeeded, 5u);
  EXPECT_EQ(s.outcomes.failed, 3u);
  EXPECT_EQ(s.outcomes.timed_out, 1u);
  EXPECT_EQ(s.pending, 0u);
  ASSERT_TRUE(pool.wait_idle(5s));
  const PoolStats p = pool.stats();
  EXPECT_EQ(p.outcomes.succeeded, s.outcomes.succeeded);
  EXPECT_EQ(p.outcomes.failed, s.outcomes.failed);
  EXPECT_EQ(p.outcomes.timed_out, s.outcomes.timed_out);
}

TEST(Group, FirstExceptionIsThatOfTheFirstTaskToFail) {
  Watchdog dog;
  Pool pool(workers(1));  // one worker: tasks run in submission order
  Group g(pool);
  ASSERT_EQ(g.submit([] { throw std::runtime_error("first"); }), Admission::accepted);
  ASSERT_EQ(g.submit([] { throw std::logic_error("second"); }), Admission::accepted);
  g.wait();
  ASSERT_NE(g.first_exception(), nullptr);
  try {
    g.rethrow_if_failed();
    FAIL() << "rethrow_if_failed did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_EQ(g.stats().outcomes.failed, 2u);
  EXPECT_FALSE(g.cancelled());  // cancel_on_failure is off
}

TEST(Group, CancelOnFailureCancelsQueuedTasksAndStopsRunningLongOnes) {
  Watchdog dog;
  Pool pool(workers(2));
  Group g(pool, {.name = "errgroup", .cancel_on_failure = true});
  Gate fail_now;
  std::atomic<bool> long_started{false};
  std::atomic<int> queued_ran{0};
  // Worker 1: a long task that runs until it is told to stop.
  ASSERT_EQ(g.submit([&](std::stop_token s) {
    long_started = true;
    until_stopped(s);
  }),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return long_started.load(); }));
  // Worker 2: fails when the gate opens; the tasks behind it stay queued.
  ASSERT_EQ(g.submit([&] {
    fail_now.wait();
    throw std::runtime_error("failed");
  }),
            Admission::accepted);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(g.submit([&] { queued_ran.fetch_add(1); }), Admission::accepted);
  }
  fail_now.open();
  g.wait();
  EXPECT_TRUE(g.cancelled());
  const GroupStats s = g.stats();
  EXPECT_EQ(s.outcomes.failed, 1u);
  EXPECT_EQ(s.outcomes.cancelled, 11u);  // the long task and the 10 queued ones
  EXPECT_EQ(queued_ran.load(), 0);
  EXPECT_EQ(g.submit([] {}), Admission::closed);
  EXPECT_EQ(g.stats().outcomes.cancelled, 12u);
}

TEST(Group, CancelRunsNoQueuedTaskAndRefusesLaterOnes) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool);
  Gate release;
  std::atomic<bool> blocker_started{false};
  std::atomic<int> ran{0};
  ASSERT_EQ(g.submit([&] {
    blocker_started = true;
    release.wait();
  }),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return blocker_started.load(); }));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(g.submit([&] { ran.fetch_add(1); }), Admission::accepted);
  g.cancel();
  EXPECT_EQ(g.submit([&] { ran.fetch_add(1); }), Admission::closed);
  release.open();
  g.wait();
  EXPECT_EQ(ran.load(), 0);
  const GroupStats s = g.stats();
  EXPECT_EQ(s.outcomes.succeeded, 1u);    // a running short task cannot be interrupted
  EXPECT_EQ(s.outcomes.cancelled, 101u);  // 100 queued + 1 refused
  EXPECT_EQ(s.submitted, 102u);
}

TEST(Group, ALongTaskThatThrowsAfterCancelIsCancelledNotFailed) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool, {.cancel_on_failure = true});
  std::atomic<bool> started{false};
  ASSERT_EQ(g.submit([&](std::stop_token s) {
    started = true;
    until_stopped(s);
    throw std::runtime_error("stopped");
  }),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  g.cancel();
  g.wait();
  EXPECT_EQ(g.stats().outcomes.cancelled, 1u);
  EXPECT_EQ(g.stats().outcomes.failed, 0u);
  EXPECT_EQ(g.first_exception(), nullptr);
}

TEST(Group, WaitForGivesUpAtTheTimeoutAndWaitsAgainLater) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool);
  Gate release;
  ASSERT_EQ(g.submit([&] { release.wait(); }), Admission::accepted);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.wait_for(30ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  EXPECT_EQ(g.stats().pending, 1u);
  release.open();
  EXPECT_TRUE(g.wait_for(10s));
  EXPECT_EQ(g.stats().pending, 0u);
}

// A task whose captures take 33 to 40 bytes fits a queue slot only if the
// group's cell leaves out the pool's address (it then reads it from the
// group's state): such tasks are queued without an allocation each. (The
// pool's own threads may allocate now and then meanwhile, hence a bound
// well below one per task rather than zero.)
TEST(Group, ATaskWithFortyBytesOfCapturesIsNotBoxed) {
  Watchdog dog;
  Pool pool(workers(2));
  {  // Warm up: both workers started and once asleep at the same time.
    Group g(pool);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(g.submit([] {}), Admission::accepted);
    g.wait();
  }
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  std::atomic<std::uint64_t> sum{0};
  const std::array<std::uint64_t, 4> payload{1, 2, 3, 4};
  auto task = [payload, &sum] { sum.fetch_add(payload[3], std::memory_order_relaxed); };
  static_assert(sizeof(task) == 40);
  Group g(pool);
  const std::uint64_t before = test::g_allocations.load();
  constexpr std::uint64_t kTasks = 300;
  for (std::uint64_t i = 0; i < kTasks; ++i) ASSERT_EQ(g.submit(task), Admission::accepted);
  g.wait();
  EXPECT_LT(test::g_allocations.load() - before, kTasks / 10);
  EXPECT_EQ(sum.load(), 4 * kTasks);
  EXPECT_EQ(g.stats().outcomes.succeeded, kTasks);
}

// A group's counts while millions of its tasks end on two workers (enough
// for the count of successes to be folded several times): a concurrent
// reader never sees a task counted twice or lost, and the final figures are
// exact. Every 100,000th task throws, so failures and successes interleave.
TEST(Group, StatsStayExactWhileMillionsOfTasksEnd) {
  Watchdog dog(60s);
  Pool pool(workers(2));
  Group g(pool);
  constexpr std::uint64_t kTasks = 2'500'000;
  constexpr std::uint64_t kFailEvery = 100'000;
  std::atomic<std::uint64_t> submitted{0};
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> bad_snapshots{0};
  std::thread reader([&] {
    std::uint64_t last_ended = 0;
    while (!done.load(std::memory_order_acquire)) {
      const std::uint64_t before = submitted.load(std::memory_order_acquire);
      const GroupStats s = g.stats();
      const std::uint64_t after = submitted.load(std::memory_order_acquire);
      const std::uint64_t ended = s.outcomes.total();
      // One submit may be under way: begun (counted), not yet recorded.
      if (s.submitted != s.pending + ended || s.submitted < before || s.submitted > after + 1 ||
          ended < last_ended) {
        bad_snapshots.fetch_add(1, std::memory_order_relaxed);
      }
      last_ended = ended;
    }
  });
  for (std::uint64_t i = 1; i <= kTasks; ++i) {
    const bool fail = i % kFailEvery == 0;
    ASSERT_EQ(g.submit([fail] {
      if (fail) throw std::runtime_error("every 100,000th");
    }),
              Admission::accepted);
    submitted.store(i, std::memory_order_release);
  }
  g.wait();
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(bad_snapshots.load(), 0u);
  const GroupStats s = g.stats();
  EXPECT_EQ(s.submitted, kTasks);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.outcomes.failed, kTasks / kFailEvery);
  EXPECT_EQ(s.outcomes.succeeded, kTasks - kTasks / kFailEvery);
  EXPECT_EQ(s.outcomes.total(), kTasks);
}
TEST(GroupOptions, ANegativeTimeoutIsRejectedWithTheFieldsName) {
  Pool pool(workers(1));
  try {
    Group g(pool, {.timeout = -1ms});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("GroupOptions.timeout"), std::string::npos);
  }
}

TEST(Group, TasksWithoutANameGetTheGroupsName) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool, {.name = "fanout"});
  std::string seen_default, seen_own;
  ASSERT_EQ(g.submit([&](const TaskContext& ctx) { seen_default = std::string(ctx.name); }),
            Admission::accepted);
  ASSERT_EQ(
      g.submit([&](const TaskContext& ctx) { seen_own = std::string(ctx.name); }, {.name = "own"}),
      Admission::accepted);
  g.wait();
  EXPECT_EQ(seen_default, "fanout");
  EXPECT_EQ(seen_own, "own");
}

TEST(Group, DestroyingItCancelsWhatHasNotEndedAndWaits) {
  Watchdog dog;
  Pool pool(workers(1));
  std::atomic<bool> long_started{false};
  std::atomic<bool> long_returned{false};
  std::atomic<bool> queued_ran{false};
  {
    Group g(pool);
    ASSERT_EQ(g.submit([&](std::stop_token s) {
      long_started = true;
      until_stopped(s);
      long_returned = true;
    }),
              Admission::accepted);
    ASSERT_EQ(g.submit([&] { queued_ran = true; }), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return long_started.load(); }));
  }
  EXPECT_TRUE(long_returned.load());  // the destructor waited for it
  EXPECT_FALSE(queued_ran.load());
  ASSERT_TRUE(pool.wait_idle(5s));
  EXPECT_EQ(pool.stats().outcomes.cancelled, 2u);
}

TEST(Group, APoolShutdownEndsItsQueuedTasksAsRejected) {
  Watchdog dog;
  Pool pool(workers(1));
  Group g(pool);
  Gate release;
  std::atomic<bool> started{false};
  ASSERT_EQ(g.submit([&] {
    started = true;
    release.wait();
  }),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  for (int i = 0; i < 20; ++i) ASSERT_EQ(g.submit([] {}), Admission::accepted);
  std::thread stopper([&] { (void)pool.shutdown(ShutdownMode::soft, 0ns); });
  ASSERT_TRUE(eventually([&] { return pool.state() == PoolState::stopping; }));
  release.open();
  stopper.join();
  g.wait();
  const GroupStats s = g.stats();
  EXPECT_EQ(s.outcomes.succeeded, 1u);
  EXPECT_EQ(s.outcomes.rejected, 20u);
  EXPECT_EQ(g.submit([] {}), Admission::closed);  // the pool's answer
  EXPECT_EQ(g.stats().outcomes.rejected, 21u);
}

TEST(Group, TrySubmitIsRefusedByAFullQueueAndCountedAsRejected) {
  Watchdog dog;
  PoolOptions o = workers(1);
  o.min_workers = 0;  // no worker yet: pause() holds every task in the queue
  o.queue_capacity = 1;
  o.queue_shards = 1;
  Pool pool(std::move(o));
  pool.pause();
  Group g(pool);
  EXPECT_EQ(g.try_submit([] {}), Admission::accepted);
  EXPECT_EQ(g.try_submit([] {}), Admission::full);
  pool.resume();
  g.wait();
  EXPECT_EQ(g.stats().outcomes.succeeded, 1u);
  EXPECT_EQ(g.stats().outcomes.rejected, 1u);
}

TEST(Group, ThreadsSubmitWaitCancelAndReadStatsConcurrently) {
  Watchdog dog(std::chrono::seconds(60));
  Pool pool(workers(2));
  Group g(pool);
  constexpr int kSubmitters = 3;
  constexpr int kEach = test::kThreadSanitizer ? 3'000 : 20'000;
  std::atomic<int> ran{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kSubmitters; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        // Every 100th task submits another one into the same group.
        ASSERT_EQ(g.submit([&g, &ran, i] {
          ran.fetch_add(1, std::memory_order_relaxed);
          if (i % 100 == 0) (void)g.submit([&ran] { ran.fetch_add(1); });
        }),
                  Admission::accepted);
      }
    });
  }
  std::thread reader([&] {
    while (!done.load()) {
      const GroupStats s = g.stats();
      EXPECT_LE(s.outcomes.total() + s.pending, s.submitted);
      (void)g.wait_for(1ms);
    }
  });
  for (std::thread& t : threads) t.join();
  g.wait();
  done = true;
  reader.join();
  const int expected = kSubmitters * (kEach + kEach / 100);
  EXPECT_EQ(ran.load(), expected);
  const GroupStats s = g.stats();
  EXPECT_EQ(s.outcomes.succeeded, static_cast<std::uint64_t>(expected));
  EXPECT_EQ(s.pending, 0u);
}

TEST(Group, CancelRacingSubmissionsLeavesNothingRunningAfterIt) {
  Watchdog dog(std::chrono::seconds(60));
  Pool pool(workers(2));
  for (int round = 0; round < 20; ++round) {
    Group g(pool);
    std::atomic<bool> cancelled{false};
    std::atomic<int> ran_after{0};
    std::thread submitter([&] {
      for (int i = 0; i < 2'000; ++i) {
        (void)g.submit([&] {
          if (cancelled.load()) ran_after.fetch_add(1);
        });
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    g.cancel();
    cancelled = true;
    submitter.join();
    g.wait();
    const GroupStats s = g.stats();
    EXPECT_EQ(s.submitted, 2'000u);
    EXPECT_EQ(s.outcomes.total(), 2'000u);
    EXPECT_EQ(s.outcomes.succeeded + s.outcomes.cancelled, 2'000u);
    // A task may have been running (not queued) when cancel() ran: at most
    // one per worker started after the flag was set.
    EXPECT_LE(ran_after.load(), 2);
  }
}

}  // namespace
}  // namespace crew
