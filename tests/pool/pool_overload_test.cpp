// The overload controller through a pool (crew/overload.hpp): refusals
// past the limit, CoDel's shedding (counted once, never run), tickets
// returned (also by a shutdown and a write-off), newest first under a
// standing queue, a priority's displacement, the run-time signal, the
// options' checks. Its parts alone: overload_test.cpp.
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
#include "crew/group.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "crew/task.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;
using test::WorkerHold;

PoolOptions overloaded_pool(std::size_t workers, OverloadOptions o) {
  return test::overloaded_workers("overload", workers, o);
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
  // No adaptive limit: on a loaded machine the holding task's own wait
  // could cut it to its floor (2) before the posts below.
  Pool pool(overloaded_pool(1, {.enabled = true, .adaptive_limit = false}));
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

// A task that ignores its stop past abandon_grace is written off and its
// worker replaced; its admission ticket goes back then, not when (if ever)
// its callable returns. Held until the return, two stuck tasks would hold
// a limit of 2 for good: every submission refused while the replacement
// workers idle.
TEST(PoolOverload, AWrittenOffTaskReturnsItsTicketAtTheWriteOff) {
  Watchdog dog;
  PoolOptions o = overloaded_pool(1, {.enabled = true, .max_limit = 2});
  o.abandon_grace = 20ms;
  Pool pool(o);
  struct Stuck {
    std::atomic<bool> held{true};
    std::atomic<int> returned{0};
  };
  auto stuck = std::make_shared<Stuck>();  // outlives the pool's written-off threads
  const auto ignore_stop = [stuck](const TaskContext&) {
    while (stuck->held.load()) std::this_thread::sleep_for(1ms);
    stuck->returned.fetch_add(1);
  };
  std::vector<Task<void>> written_off;
  for (int i = 0; i < 2; ++i) written_off.push_back(pool.submit(ignore_stop, {.timeout = 10ms}));
  for (Task<void>& t : written_off) {
    ASSERT_TRUE(t.wait_for(10s));
    EXPECT_EQ(t.reason(), Errc::abandoned);
  }
  EXPECT_EQ(pool.stats().overload.admitted, 0u);
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pool.post([&ran] { ran.fetch_add(1); }), Admission::accepted) << i;
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  EXPECT_EQ(ran.load(), 4);
  // The written-off threads return now, and give back nothing more: at a
  // limit of 2, one held task and one queued one still fill it.
  stuck->held.store(false);
  ASSERT_TRUE(eventually([&] { return stuck->returned.load() == 2; }));
  std::this_thread::sleep_for(50ms);  // past their runs' ends in the pool
  WorkerHold hold(pool);
  EXPECT_EQ(pool.post([&ran] { ran.fetch_add(1); }), Admission::accepted);
  EXPECT_EQ(pool.post([&ran] { ran.fetch_add(1); }), Admission::overloaded);
  EXPECT_EQ(pool.stats().overload.admitted, 2u);
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 5);
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
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

// The newest lower task was cancelled while queued: a higher priority's
// submission at the limit takes that cell out, which gives its place back,
// and is admitted without shedding anything. It used to count a priority
// shed there (shed_priority above outcomes.shed).
TEST(PoolOverload, ADisplacementThatFindsACancelledTaskShedsNothing) {
  Watchdog dog;
  PoolOptions o = overloaded_pool(1, {.enabled = true, .interval = 60s, .max_limit = 4});
  o.priority_levels = 2;
  Pool pool(o);
  std::atomic<int> ran{0};
  auto low = [&ran] { ran.fetch_add(1); };
  Task<int> high;
  Task<void> cancelled;
  {
    WorkerHold hold(pool);
    ASSERT_EQ(pool.post(low), Admission::accepted);
    ASSERT_EQ(pool.post(low), Admission::accepted);
    cancelled = pool.submit(low);  // at the limit: queued newest first
    ASSERT_EQ(cancelled.status(), TaskStatus::queued);
    EXPECT_EQ(cancelled.cancel(), CancelResult::cancelled);
    high = pool.submit([] { return 7; }, {.priority = 1});
    EXPECT_NE(high.status(), TaskStatus::rejected);
  }
  EXPECT_EQ(high.get(), 7);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.cancelled, 1u);
  EXPECT_EQ(s.outcomes.shed, 0u);
  EXPECT_EQ(s.overload.shed_priority, s.outcomes.shed);
  EXPECT_EQ(s.overload.refused_limit, 0u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

// A group's tasks submitted from outside the pool go through the
// controller as any other submission from outside: at the limit they are
// refused. Short unnamed ones went to the queue unadmitted (post_counted),
// and neither counted nor refused.
TEST(PoolOverload, AGroupsTasksFromOutsideThePoolAreAdmitted) {
  Watchdog dog;
  Pool pool(overloaded_pool(1, {.enabled = true, .interval = 60s, .max_limit = 4}));
  std::atomic<int> ran{0};
  Group g(pool);
  {
    WorkerHold hold(pool);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(g.submit([&ran] { ran.fetch_add(1); }), Admission::accepted) << i;
    }
    EXPECT_EQ(pool.stats().overload.admitted, 4u);
    EXPECT_EQ(g.submit([&ran] { ran.fetch_add(1); }), Admission::overloaded);
  }
  g.wait();
  EXPECT_EQ(ran.load(), 3);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  EXPECT_EQ(pool.stats().overload.refused_limit, 1u);
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
