// Coroutine tasks in a pool's shutdown: drain resumes them, soft and hard
// stop them, frames past the grace are destroyed on a worker and listed,
// and none is left behind (the ASan build checks for leaks).
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
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::Watchdog;

using test::FrameGuard;

class CoroShutdown : public ::testing::Test {
 protected:
  void SetUp() override { FrameGuard::reset(); }
};

Co<void> sleeper(std::chrono::milliseconds d, std::atomic<int>* started, StopMode mode) {
  FrameGuard g;
  started->fetch_add(1);
  co_await sleep_for(d, mode);
}

bool listed(const std::vector<TaskRef>& refs, const std::string& name) {
  return std::any_of(refs.begin(), refs.end(), [&](const TaskRef& r) { return r.name == name; });
}

TEST_F(CoroShutdown, DrainResumesSuspendedCoroutinesUntilTheyEnd) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> started{0};
  std::vector<Task<void>> tasks;
  for (int i = 0; i < 20; ++i) {
    tasks.push_back(spawn(pool, sleeper(100ms, &started, StopMode::interrupt)));
  }
  ASSERT_TRUE(test::eventually([&] { return started.load() == 20; }));
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 10s);
  EXPECT_FALSE(r.escalated);
  for (auto& t : tasks) EXPECT_EQ(t.status(), TaskStatus::succeeded);
  EXPECT_EQ(FrameGuard::alive(), 0);
  EXPECT_GE(r.during.succeeded, 20u);
}

TEST_F(CoroShutdown, SoftStopsSuspendedCoroutinesAtOnceAndListsThem) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> started{0};
  std::vector<Task<void>> tasks;
  for (int i = 0; i < 10; ++i) {
    tasks.push_back(spawn(pool, sleeper(10s, &started, StopMode::interrupt),
                          {.name = "s" + std::to_string(i)}));
  }
  ASSERT_TRUE(test::eventually([&] { return started.load() == 10; }));
  const auto t0 = std::chrono::steady_clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 5s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s * test::kSlowdown);
  for (auto& t : tasks) {
    EXPECT_EQ(t.status(), TaskStatus::cancelled);
    EXPECT_EQ(t.reason(), Errc::cancelled);
  }
  EXPECT_TRUE(listed(r.cancelled, "s3"));
  EXPECT_EQ(r.cancelled.size(), 10u);
  EXPECT_EQ(FrameGuard::alive(), 0);
}

// Stopped, it holds its worker at `gate` before it ends cancelled: a task
// whose stop came before a shutdown but whose end comes during it.
Co<void> slow_to_stop(test::Gate* gate, std::atomic<int>* started, std::atomic<int>* stopping) {
  FrameGuard g;
  started->fetch_add(1);
  try {
    co_await sleep_for(60s, StopMode::interrupt);
  } catch (...) {
    stopping->fetch_add(1);
    (void)gate->wait();
    throw;
  }
}

TEST_F(CoroShutdown, ListsOnlyTasksItStoppedNotOnesCancelledBeforeIt) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  test::Gate gate;
  std::atomic<int> started{0};
  std::atomic<int> stopping{0};
  Task<void> early = spawn(pool, slow_to_stop(&gate, &started, &stopping), {.name = "early"});
  Task<void> late = spawn(pool, sleeper(60s, &started, StopMode::interrupt), {.name = "late"});
  ASSERT_TRUE(test::eventually([&] { return started.load() == 2; }));
  (void)early.cancel();  // its caller sees it stopped before the shutdown
  ASSERT_TRUE(test::eventually([&] { return stopping.load() == 1; }));
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);  // the shutdown has taken its list of tasks by now
    gate.open();
  });
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 5s * test::kSlowdown);
  opener.join();
  EXPECT_EQ(early.status(), TaskStatus::cancelled);
  EXPECT_EQ(early.reason(), Errc::cancelled);
  EXPECT_EQ(late.status(), TaskStatus::cancelled);
  EXPECT_FALSE(listed(r.cancelled, "early"));
  EXPECT_TRUE(listed(r.cancelled, "late"));
  EXPECT_EQ(r.cancelled.size(), 1u);
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST_F(CoroShutdown, ADrainPastItsTimeoutStopsThemAndReportsEscalated) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> started{0};
  Task<void> t = spawn(pool, sleeper(10s, &started, StopMode::interrupt));
  ASSERT_TRUE(test::eventually([&] { return started.load() == 1; }));
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 100ms);
  EXPECT_TRUE(r.escalated);
  EXPECT_EQ(r.final_state, PoolState::stopped_timeout);
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(FrameGuard::alive(), 0);
}

// A grace short for a test, but long enough for an idle worker to wake and
// take the frames' destruction steps the shutdown posts past the first
// grace: it waits one more grace for them, then drops what is left on its
// own thread. With 50 ms, a loaded machine missed that 1 run in 300 (2 in
// 100 under TSan).
PoolOptions short_grace() {
  PoolOptions o = fixed_workers("co", 2);
  o.abandon_grace = 250ms * test::kSlowdown;
  return o;
}

TEST_F(CoroShutdown, AFrameThatIgnoresItsStopIsDestroyedOnAWorkerPastTheGrace) {
  Watchdog dog;
  Pool pool(short_grace());
  std::atomic<int> started{0};
  Task<void> t = spawn(pool, sleeper(60s, &started, StopMode::ignore), {.name = "stubborn"});
  ASSERT_TRUE(test::eventually([&] { return started.load() == 1; }));
  const auto t0 = std::chrono::steady_clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s * test::kSlowdown);
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(t.reason(), Errc::abandoned);
  EXPECT_TRUE(listed(r.abandoned, "stubborn"));
  EXPECT_EQ(FrameGuard::alive(), 0);
  const std::vector<std::thread::id> on = FrameGuard::destroyed_on();
  ASSERT_EQ(on.size(), 1u);
  EXPECT_NE(on[0], std::this_thread::get_id());  // on a worker of the pool
}

TEST_F(CoroShutdown, SoftEndsCoroutineTasksThatHaveNotStartedUnrun) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  test::Gate gate;
  ASSERT_EQ(pool.post([&] { gate.wait(); }), Admission::accepted);
  std::atomic<int> started{0};
  Task<void> t = spawn(pool, sleeper(1ms, &started, StopMode::interrupt), {.name = "queued"});
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.open();
  });
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 5s);
  opener.join();
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(t.reason(), Errc::shutdown_dropped);
  EXPECT_TRUE(listed(r.rejected, "queued"));
  EXPECT_EQ(started.load(), 0);
  EXPECT_EQ(FrameGuard::alive(), 0);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

// Spawns `name` (a sleeper of `d`, with a child of its own that sleeps as
// long) and ends without awaiting it: the spawned tasks outlive their
// parents, two generations deep.
Co<void> sleeper_with_child(Pool* pool, std::chrono::milliseconds d, std::atomic<int>* started,
                            StopMode mode) {
  FrameGuard g;
  Task<void> child = spawn(*pool, sleeper(d, started, mode), {.name = "grandchild"});
  started->fetch_add(1);
  co_await sleep_for(d, mode);
}
Co<void> spawns_and_ends(Pool* pool, std::chrono::milliseconds d, std::atomic<int>* started,
                         StopMode mode) {
  FrameGuard g;
  Task<void> child = spawn(*pool, sleeper_with_child(pool, d, started, mode), {.name = "child"});
  co_return;
}
// Runs spawns_and_ends to its end; true once its child and grandchild run.
bool parent_ended(Pool& pool, std::chrono::milliseconds d, std::atomic<int>& started,
                  StopMode mode) {
  spawn(pool, spawns_and_ends(&pool, d, &started, mode)).get();
  return test::eventually([&] { return started.load() == 2; });
}

TEST_F(CoroShutdown, DrainWaitsForTasksWhoseParentsEnded) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> started{0};
  ASSERT_TRUE(parent_ended(pool, 300ms * test::kSlowdown, started, StopMode::interrupt));
  EXPECT_EQ(coroutine_tasks(pool).live, 2u);
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 10s);
  EXPECT_FALSE(r.escalated);
  EXPECT_EQ(FrameGuard::alive(), 0);
  EXPECT_EQ(r.during.succeeded, 2u);  // the child and the grandchild, slept out
}

TEST_F(CoroShutdown, SoftStopsAndListsTasksWhoseParentsEnded) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> started{0};
  ASSERT_TRUE(parent_ended(pool, 60s, started, StopMode::interrupt));
  const auto t0 = std::chrono::steady_clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 5s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s * test::kSlowdown);
  EXPECT_TRUE(listed(r.cancelled, "child"));
  EXPECT_TRUE(listed(r.cancelled, "grandchild"));
  EXPECT_EQ(r.cancelled.size(), 2u);
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST_F(CoroShutdown, HardDestroysIgnoringChildrenOfAnEndedParentPastTheGrace) {
  Watchdog dog;
  Pool pool(short_grace());
  std::atomic<int> started{0};
  ASSERT_TRUE(parent_ended(pool, 60s, started, StopMode::ignore));
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_TRUE(listed(r.abandoned, "child"));
  EXPECT_TRUE(listed(r.abandoned, "grandchild"));
  EXPECT_EQ(FrameGuard::alive(), 0);
}

// Spawns a sleeping child and ends at once: its end hands the child to
// the pool's registry.
Co<void> leaves_a_child(Pool* pool, std::atomic<int>* spawned, std::atomic<int>* started) {
  FrameGuard g;
  Task<void> child = spawn(*pool, sleeper(60s, started, StopMode::interrupt), {.name = "c"});
  spawned->fetch_add(1);
  co_return;
}

TEST_F(CoroShutdown, SoftFindsEveryChildWhileParentsHandThemOff) {
  Watchdog dog;
  constexpr int kParents = 200;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> spawned{0};
  std::atomic<int> started{0};
  for (int i = 0; i < kParents; ++i) {
    (void)spawn_detached(pool, leaves_a_child(&pool, &spawned, &started));
  }
  // Every child exists; some parents are still ending, handing theirs off
  // while the shutdown walks the registry.
  ASSERT_TRUE(test::eventually([&] { return spawned.load() == kParents; }));
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 5s);
  const auto children = [](const std::vector<TaskRef>& refs) {
    return std::count_if(refs.begin(), refs.end(), [](const TaskRef& t) { return t.name == "c"; });
  };
  // Stopped while suspended, or ended unstarted: each listed once.
  EXPECT_EQ(children(r.cancelled) + children(r.rejected), kParents);
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST_F(CoroShutdown, ASpawnOnAStoppedPoolIsRejectedClosed) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  (void)pool.shutdown(ShutdownMode::drain, 1s);
  std::atomic<int> started{0};
  Task<void> t = spawn(pool, sleeper(1ms, &started, StopMode::interrupt));
  EXPECT_EQ(t.status(), TaskStatus::rejected);
  try {
    t.get();
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.admission(), Admission::closed);
  }
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST_F(CoroShutdown, DestroyingThePoolLeavesNoFrameBehind) {
  Watchdog dog;
  std::atomic<int> started{0};
  {
    PoolOptions o = fixed_workers("co", 2);
    o.shutdown_mode = ShutdownMode::hard;
    o.abandon_grace = 20ms;
    Pool pool(o);
    for (int i = 0; i < 50; ++i) {
      (void)spawn_detached(
          pool, sleeper(60s, &started, i % 2 == 0 ? StopMode::ignore : StopMode::interrupt));
    }
    ASSERT_TRUE(test::eventually([&] { return started.load() == 50; }));
  }
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST_F(CoroShutdown, ARestartedPoolSpawnsAgain) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  std::atomic<int> started{0};
  Task<void> a = spawn(pool, sleeper(10s, &started, StopMode::interrupt));
  ASSERT_TRUE(test::eventually([&] { return started.load() == 1; }));
  (void)pool.shutdown(ShutdownMode::hard, 0s);
  ASSERT_TRUE(pool.restart());
  Task<void> b = spawn(pool, sleeper(1ms, &started, StopMode::interrupt));
  b.get();
  EXPECT_EQ(b.status(), TaskStatus::succeeded);
  EXPECT_EQ(a.status(), TaskStatus::cancelled);
}

}  // namespace
}  // namespace crew
