// Coroutine tasks under the overload controller (crew/overload.hpp;
// crew/detail/coro_task.hpp, "The overload controller"): a spawn from
// outside the pool takes an admission ticket or is refused with the
// reason; the ticket stands for the start and the first step and goes back
// when that step ends, when the start is dropped, or when the spawn is
// refused after all; spawns from the pool's own coroutines take none; the
// start's queue wait feeds the controller's signal. A spawn blocked on a
// full queue waits no longer than its queue timeout, and spawn_when_room
// suspends the spawning coroutine where spawn() would block its worker.
// Plain tasks under the controller: tests/pool/pool_overload_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;
using test::WorkerHold;

// The controller on and admitting coroutine tasks.
PoolOptions overloaded_pool(std::size_t workers, OverloadOptions o) {
  o.admit_coroutines = true;
  return test::overloaded_workers("co-overload", workers, o);
}

Co<void> sleep_long() { co_await sleep_for(30s); }
Co<int> quick(int v) { co_return v; }

// get() of a task refused by the controller throws Errc::rejected with the
// admission and the reason.
void expect_refused(Task<int>& t, OverloadReason why) {
  ASSERT_EQ(t.status(), TaskStatus::rejected);
  try {
    (void)t.get();
    ADD_FAILURE() << "get() of a refused task must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::rejected);
    EXPECT_EQ(e.admission(), Admission::overloaded);
    EXPECT_EQ(e.overload_reason(), why);
  }
}

TEST(CoroOverload, SpawnsPastTheLimitAreRefusedAndASuspendedTaskHoldsNoTicket) {
  Watchdog dog;
  Pool pool(overloaded_pool(1, {.enabled = true, .max_limit = 2}));
  std::vector<Task<int>> refused;
  Task<void> sleeper;
  {
    WorkerHold hold(pool);  // one ticket
    sleeper = spawn(pool, sleep_long());
    EXPECT_EQ(pool.stats().overload.admitted, 2u);  // its start, queued
    refused.push_back(spawn(pool, quick(1)));
    refused.push_back(try_spawn(pool, quick(2)));
    EXPECT_EQ(spawn_detached(pool, quick(3)), Admission::overloaded);
  }
  for (Task<int>& t : refused) expect_refused(t, OverloadReason::limit);
  // The sleeper's first step ends at its sleep: its ticket goes back then,
  // though the task goes on.
  ASSERT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  EXPECT_EQ(sleeper.status(), TaskStatus::running);
  // With nothing admitted, the next spawns are accepted (one at a time:
  // the limit is 2).
  for (int i = 0; i < 5; ++i) EXPECT_EQ(spawn(pool, quick(10 + i)).get(), 10 + i);
  EXPECT_EQ(sleeper.cancel(), CancelResult::stop_requested);
  EXPECT_THROW(sleeper.get(), Error);
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.overload.refused_limit, 3u);
  EXPECT_EQ(s.outcomes.rejected, 3u);
  EXPECT_EQ(s.outcomes.succeeded, 6u);  // the hold and the five
  EXPECT_EQ(s.outcomes.cancelled, 1u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
}

// Off by default (OverloadOptions::admit_coroutines): spawns are neither
// counted nor refused, however far past the limit.
TEST(CoroOverload, WithoutAdmitCoroutinesSpawnsAreNeitherCountedNorRefused) {
  Watchdog dog;
  Pool pool(test::overloaded_workers("co-default", 1, {.enabled = true, .max_limit = 2}));
  std::vector<Task<int>> tasks;
  {
    WorkerHold hold(pool);  // one ticket
    for (int i = 0; i < 5; ++i) tasks.push_back(spawn(pool, quick(i)));
    EXPECT_EQ(pool.stats().overload.admitted, 1u);  // the hold's alone
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tasks[static_cast<std::size_t>(i)].get(), i);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().overload.refused_limit, 0u);
}

// Spawns from the pool's own coroutine tasks are part of admitted work:
// neither counted nor refused, as a pool task's own submissions are.
Co<int> parent(Pool& pool, std::atomic<std::size_t>* admitted_inside) {
  std::vector<Task<int>> children;
  for (int i = 0; i < 10; ++i) children.push_back(spawn(pool, quick(i)));
  admitted_inside->store(pool.stats().overload.admitted);
  int sum = 0;
  for (Task<int>& c : children) sum += co_await c;
  co_return sum;
}

TEST(CoroOverload, SpawnsFromItsOwnCoroutinesTakeNoTicket) {
  Watchdog dog;
  Pool pool(overloaded_pool(1, {.enabled = true, .max_limit = 2}));
  std::atomic<std::size_t> admitted_inside{99};
  Task<int> p = spawn(pool, parent(pool, &admitted_inside));
  EXPECT_EQ(p.get(), 45);
  EXPECT_EQ(admitted_inside.load(), 1u);  // the parent's own, not its ten queued children's
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.overload.refused_limit, 0u);
  EXPECT_EQ(s.outcomes.succeeded, 11u);
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
}

// A start the pool refuses after the controller admitted it (a full
// queue), and starts a soft shutdown drops, give their tickets back.
TEST(CoroOverload, TicketsComeBackFromRefusedAndDroppedStarts) {
  Watchdog dog;
  // A limit above the queue's room (its default ceiling is that room).
  PoolOptions o = overloaded_pool(1, {.enabled = true, .adaptive_limit = false, .max_limit = 64});
  o.queue_capacity = 4;
  o.overflow = Overflow::reject;
  Pool pool(o);
  std::vector<Task<int>> tasks;
  {
    WorkerHold hold(pool);
    for (int i = 0; i < 12; ++i) tasks.push_back(spawn(pool, quick(i)));
    std::size_t full = 0;
    for (Task<int>& t : tasks) {
      if (t.status() != TaskStatus::rejected) continue;
      ++full;
      try {
        (void)t.get();
      } catch (const Error& e) {
        EXPECT_EQ(e.admission(), Admission::full);
      }
    }
    EXPECT_GT(full, 0u);
    // The hold's ticket and the queued starts' only.
    EXPECT_EQ(pool.stats().overload.admitted, 1 + tasks.size() - full);
    std::thread releaser([&hold] {
      std::this_thread::sleep_for(20ms);
      hold.release();
    });
    (void)pool.shutdown(ShutdownMode::soft, 10s);
    releaser.join();
  }
  for (Task<int>& t : tasks) EXPECT_TRUE(t.wait_for(10s));
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.admitted == 0; }));
  EXPECT_EQ(pool.stats().overload.refused_limit, 0u);
}

// The start's queue wait is the controller's signal, as a plain task's is:
// a start held behind a busy worker shows in the interval's high wait.
TEST(CoroOverload, TheStartsQueueWaitFeedsTheSignal) {
  Watchdog dog;
  Pool pool(overloaded_pool(
      1, {.enabled = true, .target = 5ms, .interval = 10ms, .adaptive_limit = false}));
  Task<int> t;
  {
    WorkerHold hold(pool);
    t = spawn(pool, quick(7));
    std::this_thread::sleep_for(60ms);
  }
  EXPECT_EQ(t.get(), 7);
  // Its start, over an interval after the last roll, summed the window up.
  EXPECT_TRUE(eventually([&] { return pool.stats().overload.wait_high >= 40ms; }))
      << pool.stats().overload.wait_high.count() << " ns";
}

// A spawn blocked on a full queue waits no longer than its queue timeout:
// the start then comes up on the spawning thread past its deadline and
// ends the task unrun (cancelled, Errc::expired), as a blocked submission
// of a task with a queue timeout ends expired.
TEST(CoroOverload, ABlockedSpawnWaitsNoLongerThanItsQueueTimeout) {
  Watchdog dog;
  PoolOptions o = test::fixed_workers("co-blocked", 1);
  o.queue_capacity = 1;
  o.overflow = Overflow::block;
  Pool pool(o);
  WorkerHold hold(pool);
  Task<int> filler = spawn(pool, quick(1));  // the queue's one place
  const auto t0 = std::chrono::steady_clock::now();
  Task<int> late = spawn(pool, quick(2), {.queue_timeout = 50ms});
  const auto blocked = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(blocked, 45ms);
  EXPECT_LT(blocked, 5s);  // not until the hold ends
  ASSERT_TRUE(late.ready());
  EXPECT_EQ(late.status(), TaskStatus::cancelled);
  EXPECT_EQ(late.reason(), Errc::expired);
  hold.release();
  EXPECT_EQ(filler.get(), 1);
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

// A pool whose one worker is held and whose queue of one place is taken.
struct FullQueue {
  Pool pool;
  WorkerHold hold;
  explicit FullQueue(std::string name) : pool(full_options(std::move(name))), hold(pool) {
    EXPECT_EQ(pool.post([] {}), Admission::accepted);  // the queue's one place
  }
  static PoolOptions full_options(std::string name) {
    PoolOptions o = test::fixed_workers(std::move(name), 1);
    o.queue_capacity = 1;
    o.overflow = Overflow::block;
    return o;
  }
};

Co<int> spawn_there_and_await(Pool* there, TaskOptions opts, std::atomic<bool>* handed) {
  Task<int> t = co_await spawn_when_room(*there, quick(5), std::move(opts));
  handed->store(true);
  co_return co_await t;
}

// A spawner on pool `here` (one worker) whose spawn_when_room targets the
// full pool.
class SpawnWhenRoom : public ::testing::Test {
 protected:
  Task<int> start_spawner(TaskOptions opts = {}) {
    return spawn(here, spawn_there_and_await(&full.pool, std::move(opts), &handed));
  }

  Watchdog dog;
  FullQueue full{"full"};
  Pool here{test::fixed_workers("here", 1)};
  std::atomic<bool> handed{false};  // the spawner got its handle
};

// Where spawn() would block its worker, spawn_when_room suspends the
// spawning coroutine: the worker runs other tasks meanwhile.
TEST_F(SpawnWhenRoom, SuspendsTheSpawnerInsteadOfBlockingItsWorker) {
  Task<int> spawner = start_spawner();
  std::this_thread::sleep_for(20ms);  // the spawner found no room and waits
  EXPECT_FALSE(handed.load());
  // Its pool's one worker is free: a task submitted now runs at once.
  Task<int> other = here.submit([] { return 7; });
  ASSERT_TRUE(other.wait_for(5s)) << "the spawner's worker is blocked";
  EXPECT_EQ(other.get(), 7);
  EXPECT_FALSE(handed.load());
  full.hold.release();  // room comes: the spawn goes on
  EXPECT_EQ(spawner.get(), 5);
  EXPECT_TRUE(handed.load());
  ASSERT_TRUE(full.pool.wait_idle(10s));
  const PoolStats s = full.pool.stats();
  EXPECT_EQ(s.outcomes.succeeded, 3u);  // the hold, the filler, the spawned task
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

// The new task's queue timeout bounds the wait: the handle comes back
// with the task ended unrun.
TEST_F(SpawnWhenRoom, WaitsNoLongerThanTheNewTasksQueueTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  Task<int> spawner = start_spawner({.queue_timeout = 50ms});
  try {
    (void)spawner.get();
    ADD_FAILURE() << "the awaited task never ran: its co_await must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::expired) << e.what();
  }
  EXPECT_TRUE(handed.load());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 45ms);
  full.hold.release();
  ASSERT_TRUE(full.pool.wait_idle(10s));
  const PoolStats s = full.pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

// A stop of the spawner ends its wait; the new task is decided once
// (refused, or stopped with its parent) and counted once.
TEST_F(SpawnWhenRoom, AStopOfTheSpawnerEndsItsWait) {
  Task<int> spawner = start_spawner();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(spawner.cancel(), CancelResult::stop_requested);
  ASSERT_TRUE(spawner.wait_for(5s));
  EXPECT_EQ(spawner.status(), TaskStatus::cancelled);
  EXPECT_FALSE(handed.load());
  full.hold.release();
  ASSERT_TRUE(full.pool.wait_idle(10s));
  ASSERT_TRUE(here.wait_idle(10s));
  const PoolStats s = full.pool.stats();
  EXPECT_EQ(s.submitted, 3u);  // the hold, the filler, the spawned task
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_EQ(s.outcomes.succeeded, 2u);
}

// The spawner's own pool: it suspends (its worker runs the queue down)
// instead of running the new task's start inside its own step.
TEST(SpawnWhenRoomOwnPool, IntoItsOwnFullPoolItSuspends) {
  Watchdog dog;
  PoolOptions o = FullQueue::full_options("own");
  o.min_workers = o.max_workers = 2;
  Pool pool(o);
  WorkerHold hold(pool);
  ASSERT_EQ(pool.post([] {}), Admission::accepted);  // fills the queue
  std::atomic<bool> handed{false};
  Task<int> spawner = spawn(pool, spawn_there_and_await(&pool, {}, &handed));
  // The filler and the spawner's start share the one queue: it runs once
  // the free worker took the filler.
  EXPECT_EQ(spawner.get(), 5);
  EXPECT_TRUE(handed.load());
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

}  // namespace
}  // namespace crew
