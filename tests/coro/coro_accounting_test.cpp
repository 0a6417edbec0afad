// Coroutine tasks counted, timed and observed like tasks (crew/coro.hpp,
// docs/coroutines.md "Stats?"): one submission and one outcome per task
// however often it resumes, wait_idle() waiting for suspended ones, the
// handle's queue wait and run time in a timed pool, and observers hearing
// of a task once. Spawning, awaiting and stopping: coro_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coro_test_util.hpp"
#include "crew/coro.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::Watchdog;

using test::FrameGuard;

TEST(CoroTask, EveryTaskIsCountedOnceAndWaitIdleWaitsForSuspendedOnes) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(spawn_detached(pool, test::counting_sleeper(50ms, &done)), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(done.load(), 50);  // wait_idle did not return while they slept
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_EQ(s.outcomes.failed + s.outcomes.cancelled + s.outcomes.timed_out + s.outcomes.rejected,
            0u);
}

Co<void> resumes_often(int yields, int sleeps) {
  for (int i = 0; i < yields; ++i) co_await yield();
  for (int i = 0; i < sleeps; ++i) co_await sleep_for(1ms);
}

// A coroutine task is one submission and one outcome in stats(), however
// many times it suspends and resumes.
TEST(CoroTask, ResumptionsAreNeitherSubmissionsNorOutcomes) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::vector<Task<void>> tasks;
  for (int i = 0; i < 10; ++i) tasks.push_back(spawn(pool, resumes_often(20, 3)));
  for (Task<void>& t : tasks) t.get();
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.submitted, 10u);
  EXPECT_EQ(s.outcomes.succeeded, 10u);
  EXPECT_EQ(s.outcomes.total(), 10u);
}

// A step dropped by a shutdown is no outcome of its own either: the task
// ends cancelled, counted once.
TEST(CoroTask, AShutdownCountsASuspendedTaskOnce) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> done{0};
  Task<void> t = spawn(pool, test::counting_sleeper(std::chrono::milliseconds(60'000), &done));
  ASSERT_TRUE(test::eventually([&] { return coroutine_tasks(pool).suspended.size() == 1; }));
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 5s);
  EXPECT_TRUE(t.ready());
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.submitted, 1u);
  EXPECT_EQ(s.outcomes.total(), 1u);
  EXPECT_EQ(s.outcomes.cancelled, 1u);
  EXPECT_EQ(r.lifetime.total(), 1u);
}

Co<void> sleeps_for(std::chrono::milliseconds d) { co_await sleep_for(d); }

// Under time_tasks the handle shows the queue wait (admission to the first
// start) and the run time (first start to the end, suspensions included).
TEST(CoroTask, ATimedPoolShowsTheQueueWaitAndTheRunTimeOnTheHandle) {
  Watchdog dog;
  PoolOptions o = fixed_workers("co", 1);
  o.time_tasks = true;
  Pool pool(o);
  test::Gate gate;
  ASSERT_EQ(pool.post([&] { gate.wait(); }), Admission::accepted);
  Task<void> t = spawn(pool, sleeps_for(30ms));
  std::this_thread::sleep_for(20ms);
  gate.open();
  t.get();
  EXPECT_GE(t.queue_wait(), 20ms);
  EXPECT_LT(t.queue_wait(), 5s);
  EXPECT_GE(t.run_time(), 30ms);
  EXPECT_LT(t.run_time(), 5s);
  // Ended before it started: all of it was queue wait.
  test::Gate gate2;
  ASSERT_EQ(pool.post([&] { gate2.wait(); }), Admission::accepted);
  Task<void> c = spawn(pool, sleeps_for(1ms));
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(c.cancel(), CancelResult::stop_requested);
  gate2.open();
  c.wait();
  EXPECT_EQ(c.status(), TaskStatus::cancelled);
  EXPECT_GE(c.queue_wait(), 10ms);
  EXPECT_EQ(c.run_time(), 0ns);
}

// Observers hear of a coroutine task once, as of any task with a handle:
// enqueued, started, finished (with its times); one cancelled before its
// start is reported as ended unrun.
TEST(CoroTask, ObserversHearOfACoroutineTaskOnceHoweverOftenItResumes) {
  Watchdog dog;
  struct Seen {
    std::uint64_t id;
    char event;  // e(nqueued), s(tarted), f(inished), r(ejected)
    TaskStatus outcome;
    std::chrono::nanoseconds wait, run;
  };
  struct Recorder final : Observer {
    std::mutex mu;
    std::vector<Seen> seen;
    void note(const Seen& x) {
      const std::lock_guard lock(mu);
      seen.push_back(x);
    }
    void on_task_enqueued(const TaskEvent& e) noexcept override {
      note({e.id, 'e', TaskStatus::queued, {}, {}});
    }
    void on_task_started(const TaskEvent& e, std::chrono::nanoseconds wait) noexcept override {
      note({e.id, 's', TaskStatus::running, wait, {}});
    }
    void on_task_finished(const TaskEvent& e, TaskStatus outcome, std::chrono::nanoseconds wait,
                          std::chrono::nanoseconds run) noexcept override {
      note({e.id, 'f', outcome, wait, run});
    }
    void on_task_rejected(const TaskEvent& e, TaskStatus outcome, Errc,
                          Admission) noexcept override {
      note({e.id, 'r', outcome, {}, {}});
    }
  };
  auto rec = std::make_shared<Recorder>();
  PoolOptions o = fixed_workers("co", 1);
  o.observers.push_back(rec);
  Pool pool(o);
  Task<void> t = spawn(pool, resumes_often(5, 2), {.name = "busy"});
  t.get();
  test::Gate gate;
  ASSERT_EQ(pool.post([&] { gate.wait(); }), Admission::accepted);
  Task<void> c = spawn(pool, resumes_often(1, 1));
  (void)c.cancel();
  gate.open();
  c.wait();
  ASSERT_TRUE(pool.wait_idle(10s));
  const std::lock_guard lock(rec->mu);
  std::string of_t, of_c;
  for (const Seen& x : rec->seen) {
    if (x.id == t.id()) of_t += x.event;
    if (x.id == c.id()) of_c += x.event;
    if (x.id == t.id() && x.event == 'f') {
      EXPECT_EQ(x.outcome, TaskStatus::succeeded);
      EXPECT_GE(x.run, 2ms);  // two sleeps of 1 ms
    }
    if (x.id == c.id() && x.event == 'r') {
      EXPECT_EQ(x.outcome, TaskStatus::cancelled);
    }
  }
  std::sort(of_t.begin(), of_t.end());
  EXPECT_EQ(of_t, "efs");
  EXPECT_EQ(of_c, "er");
}

}  // namespace
}  // namespace crew
