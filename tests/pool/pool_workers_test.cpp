// Tests of the pool's workers: started on demand up to the maximum, idle
// ones above the minimum exiting, resize, pause and resume, thread names,
// start and stop hooks (a throwing one, a slow one), wait_idle() while
// tasks keep ending, and why each worker stops.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "churn.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Churn;
using test::eventually;
using test::Gate;
using test::Watchdog;
using test::WorkerHold;

TEST(PoolIdle, WaitIdleNeverReturnsTrueWhileAnEarlierTaskStillRuns) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  std::atomic<bool> running{false};
  std::atomic<bool> release{false};
  ASSERT_EQ(pool.post([&] {
    running = true;
    while (!release.load()) std::this_thread::sleep_for(100us);
  }),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  {
    Churn churn(pool);  // later tasks end while the first one runs
    const auto until = std::chrono::steady_clock::now() + 1s;
    std::uint64_t calls = 0;
    while (std::chrono::steady_clock::now() < until) {
      ++calls;
      if (pool.wait_idle(0ns)) {
        release = true;
        FAIL() << "wait_idle returned true while the first task still ran (call " << calls << ")";
      }
    }
  }
  release = true;
  EXPECT_TRUE(pool.wait_idle(10s));
}

TEST(PoolWorkers, WorkersStartOnDemandUpToMax) {
  Watchdog dog;
  Pool pool({.max_workers = 3});
  EXPECT_EQ(pool.stats().workers, 0u);
  WorkerHold hold(pool, 3);  // three tasks run at once: three workers
  EXPECT_EQ(pool.stats().workers, 3u);
  EXPECT_EQ(pool.stats().busy, 3u);
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_LE(pool.stats().workers, 3u);
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
}

TEST(PoolWorkers, IdleWorkersAboveTheMinimumExit) {
  Watchdog dog;
  Pool pool({.min_workers = 1, .max_workers = 3, .idle_timeout = 50ms});
  WorkerHold hold(pool, 3);
  hold.release();
  EXPECT_TRUE(eventually([&] { return pool.stats().workers == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(pool.stats().workers, 1u);  // the minimum stays
}

TEST(PoolWorkers, ResizeGrowsAndShrinks) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  Gate gate;
  std::atomic<int> running{0};
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(pool.post([&] {
      running.fetch_add(1);
      gate.wait();
      running.fetch_sub(1);
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(eventually([&] { return running.load() == 1; }));
  pool.resize(4);
  EXPECT_TRUE(eventually([&] { return running.load() == 4; }));
  EXPECT_EQ(pool.stats().max_workers, 4u);
  pool.resize(2);
  gate.open();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_TRUE(eventually([&] { return pool.stats().workers <= 2; }));
  EXPECT_THROW(Pool({.min_workers = 2, .max_workers = 2}).resize(1), Error);
}

TEST(PoolWorkers, PauseStopsTakingTasksAndResumeContinues) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  std::atomic<int> ran{0};
  pool.pause();
  EXPECT_EQ(pool.state(), PoolState::paused);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(pool.stats().queued, 10u);
  pool.resume();
  EXPECT_EQ(pool.state(), PoolState::running);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 10);
}

TEST(PoolWorkers, ThreadsAreNamedAfterThePool) {
  Watchdog dog;
  Pool pool({.name = "namedpool", .min_workers = 2, .max_workers = 2});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  std::set<std::string> names;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      if (std::getline(comm, name)) names.insert(name);
    }
    closedir(dir);
  }
  EXPECT_EQ(names.count("namedpool-1"), 1u);
  EXPECT_EQ(names.count("namedpool-2"), 1u);
}

TEST(PoolWorkers, HooksRunOnEveryWorkerThread) {
  Watchdog dog;
  std::atomic<int> started{0}, stopped{0};
  {
    Pool pool({.min_workers = 2,
               .max_workers = 2,
               .on_worker_start = [&](std::uint64_t) { started.fetch_add(1); },
               .on_worker_stop = [&](std::uint64_t) { stopped.fetch_add(1); }});
    ASSERT_TRUE(eventually([&] { return started.load() == 2; }));
  }
  EXPECT_EQ(stopped.load(), 2);
}

TEST(PoolWorkers, AWorkerWhoseStartHookThrowsIsReplaced) {
  Watchdog dog;
  std::atomic<int> calls{0};
  Pool pool({.min_workers = 1,
             .max_workers = 1,
             .on_exception = [](const TaskRef&, std::exception_ptr) {},
             .on_worker_start =
                 [&](std::uint64_t) {
                   if (calls.fetch_add(1) == 0) throw std::runtime_error("first start fails");
                 }});
  // The supervisor replaces the dead minimum worker (after a short backoff).
  ASSERT_TRUE(eventually([&] {
    const PoolStats s = pool.stats();
    return s.workers_replaced == 1 && s.workers == 1 && calls.load() == 2;
  }));
  auto t = pool.submit([] { return 3; });
  EXPECT_EQ(t.get(), 3);
}

// A worker started for queued work used to hold the spinning token through
// its start hook, and while any worker holds one no submission wakes or
// starts another: one slow hook stalled every later task.
TEST(PoolHooks, ASlowStartHookDoesNotStallOtherSubmissions) {
  Watchdog dog;
  Gate hook_release;
  std::atomic<int> starts{0};
  PoolOptions o;
  o.name = "slow-hook";
  o.min_workers = 1;
  o.max_workers = 3;
  o.on_worker_start = [&](std::uint64_t) {
    if (starts.fetch_add(1) == 1) hook_release.wait();  // the second worker's hook
  };
  Pool pool(std::move(o));
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 1; }));
  Gate busy_release;
  ASSERT_EQ(pool.post([&] { busy_release.wait(); }), Admission::accepted);  // worker 1
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  ASSERT_EQ(pool.post([] {}), Admission::accepted);  // starts worker 2, whose hook blocks
  ASSERT_TRUE(eventually([&] { return starts.load() >= 2; }));
  std::atomic<bool> ran{false};
  ASSERT_EQ(pool.post([&] { ran = true; }), Admission::accepted);
  EXPECT_TRUE(eventually([&] { return ran.load(); }, 2000ms))
      << "a task waited for another worker's start hook";
  hook_release.open();
  busy_release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
}

// ---- why a worker stops ----

// Records the reasons of on_worker_stopped.
class StopReasons final : public Observer {
 public:
  std::uint32_t events() const noexcept override { return worker_events; }
  void on_worker_stopped(std::string_view, std::uint64_t worker,
                         WorkerStopReason reason) noexcept override {
    const std::lock_guard lock(mu_);
    seen_.emplace_back(worker, reason);
  }
  // How many workers stopped for `reason`.
  std::size_t count(WorkerStopReason reason) {
    const std::lock_guard lock(mu_);
    return static_cast<std::size_t>(std::count_if(
        seen_.begin(), seen_.end(), [&](const auto& s) { return s.second == reason; }));
  }
  std::size_t total() {
    const std::lock_guard lock(mu_);
    return seen_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::uint64_t, WorkerStopReason>> seen_;
};

PoolOptions observed(const std::shared_ptr<StopReasons>& reasons, PoolOptions o) {
  o.observers.push_back(reasons);
  return o;
}

TEST(WorkerStopReason, AnIdleWorkerAboveTheMinimumExpires) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  Pool pool(observed(reasons, {.max_workers = 1, .idle_timeout = 20ms}));
  ASSERT_EQ(pool.submit([] { return 1; }).get(), 1);
  EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::idle_expired) == 1; }));
  EXPECT_EQ(reasons->total(), 1u);
}

TEST(WorkerStopReason, ResizeRetiresTheWorkersAboveTheNewMaximum) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  Pool pool(observed(reasons, {.max_workers = 2}));
  WorkerHold hold(pool, 2);
  hold.release();
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  pool.resize(1);
  EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::resized) == 1; }));
  EXPECT_EQ(reasons->total(), 1u);
}

// The worker's stop hook holds it in `stopping`, where the snapshot shows
// the reason; then the observer hears it.
TEST(WorkerStopReason, StopWorkerShowsInTheSnapshotAndTheEvent) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  Gate hook;
  std::atomic<bool> in_hook{false};
  Pool pool(
      observed(reasons, {.min_workers = 1, .max_workers = 1, .on_worker_stop = [&](std::uint64_t) {
                           in_hook = true;
                           (void)hook.wait();
                         }}));
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 1; }));
  const std::uint64_t id = pool.workers().at(0).id;
  EXPECT_EQ(pool.workers().at(0).stop_reason, WorkerStopReason::none);
  ASSERT_TRUE(pool.stop_worker(id, WorkerStop::graceful));
  ASSERT_TRUE(eventually([&] { return in_hook.load(); }));
  bool shown = false;
  for (const WorkerInfo& w : pool.workers()) {
    if (w.id == id) {
      EXPECT_EQ(w.state, WorkerState::stopping);
      EXPECT_EQ(w.stop_reason, WorkerStopReason::stop_worker);
      shown = true;
    }
  }
  EXPECT_TRUE(shown);
  hook.open();
  EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::stop_worker) == 1; }));
}

TEST(WorkerStopReason, AShutdownStopsEveryWorkerForThatReason) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  Pool pool(observed(reasons, {.min_workers = 2, .max_workers = 2}));
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  (void)pool.shutdown(ShutdownMode::drain, 10s);
  // A worker tells its observers after it left the books, on its own
  // thread: the event may come just after shutdown() returned.
  EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::shutdown) == 2; }));
  EXPECT_EQ(reasons->total(), 2u);
}

TEST(WorkerStopReason, ARootTokenStopIsToldFromAShutdown) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  std::stop_source root;
  Pool pool(
      observed(reasons, {.min_workers = 2, .max_workers = 2, .stop_token = root.get_token()}));
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  root.request_stop();
  EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::root_token) == 2; }));
  EXPECT_EQ(reasons->count(WorkerStopReason::shutdown), 0u);
}

TEST(WorkerStopReason, AStartHookThatThrowsStopsItsWorker) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  std::atomic<int> calls{0};
  Pool pool(
      observed(reasons, {.min_workers = 1, .max_workers = 1, .on_worker_start = [&](std::uint64_t) {
                           if (calls.fetch_add(1) == 0) throw std::runtime_error("no");
                         }}));
  EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::start_hook_failed) == 1; }));
  EXPECT_TRUE(eventually([&] { return pool.stats().workers_replaced == 1; }));
}

TEST(WorkerStopReason, AWorkerWrittenOffIsToldAsSuch) {
  Watchdog dog;
  auto reasons = std::make_shared<StopReasons>();
  auto gate = std::make_shared<Gate>();
  {
    Pool pool(observed(reasons, {.max_workers = 1, .abandon_grace = 10ms}));
    auto hung = pool.submit([gate](std::stop_token) { gate->wait(); }, {.timeout = 5ms});
    EXPECT_TRUE(eventually([&] { return reasons->count(WorkerStopReason::written_off) == 1; }));
  }
  gate->open();
}

TEST(WorkerStopReason, EachReasonHasAName) {
  EXPECT_EQ(to_string(WorkerStopReason::idle_expired), "idle_expired");
  EXPECT_EQ(to_string(WorkerStopReason::start_hook_failed), "start_hook_failed");
  EXPECT_EQ(to_string(WorkerStopReason::written_off), "written_off");
}

}  // namespace
}  // namespace crew
