// Tests of shutdown modes, escalation, reports, abandonment of hung tasks,
// shutdown racing submissions, and shutdown called from the pool's own
// tasks (restart, the root stop token, stopping one worker and fork():
// pool_stop_test.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "crew/func_pool.hpp"
#include "crew/pool.hpp"
#include "crew/sharded_pool.hpp"
#include "peak.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::cooperative;
using test::eventually;
using test::Gate;
using test::Watchdog;

bool listed(const std::vector<TaskRef>& refs, std::string_view name) {
  return std::any_of(refs.begin(), refs.end(), [&](const TaskRef& r) { return r.name == name; });
}

void until_stopped(const std::stop_token& stop) { test::until_stopped(stop, 100us); }

TEST(ShutdownDrain, RunsEverythingQueuedAndRefusesNewTasks) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  pool.pause();
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 0s);
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(r.mode, ShutdownMode::drain);
  EXPECT_FALSE(r.escalated);
  EXPECT_EQ(r.final_state, PoolState::stopped);
  EXPECT_EQ(r.during.succeeded, 100u);
  EXPECT_TRUE(r.rejected.empty());
  EXPECT_EQ(pool.state(), PoolState::stopped);
  EXPECT_EQ(pool.post([] {}), Admission::closed);
  auto late = pool.submit([] { return 1; });
  EXPECT_EQ(late.status(), TaskStatus::rejected);
  try {
    (void)late.get();
  } catch (const Error& e) {
    EXPECT_EQ(e.admission(), Admission::closed);
  }
}

// Workers start at submission; a drain that begins right after a burst of
// posts starts the rest itself, so the queue runs on all of max_workers
// rather than on the few workers the burst had started.
TEST(ShutdownDrain, StartsWorkersForWhatIsQueuedUpToMaxWorkers) {
  Watchdog dog;
  constexpr int kTasks = 20;
  Pool pool({.max_workers = kTasks, .queue_capacity = kUnbounded});
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([&] {
      test::raise_peak(most, running.fetch_add(1) + 1);
      std::this_thread::sleep_for(200ms);
      running.fetch_sub(1);
    }),
              Admission::accepted);
  }
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 0s);
  EXPECT_EQ(r.during.succeeded, static_cast<std::uint64_t>(kTasks));
  // Serially the 20 tasks take 4 s; all at once, 200 ms.
  EXPECT_GE(most.load(), kTasks / 2) << "tasks ran at most " << most.load() << " at a time";
}

TEST(ShutdownSoft, RejectsQueuedTasksAndFinishesRunningOnes) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  std::latch started(1);
  Gate gate;
  auto running = pool.submit([&] {
    started.count_down();
    gate.wait();
    return 1;
  });
  started.wait();
  std::vector<Task<int>> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(pool.submit([] { return 2; }, {.name = "q" + std::to_string(i)}));
  }
  ASSERT_EQ(pool.post([] {}), Admission::accepted);  // a plain one: counted, not listed
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    gate.open();
  });
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 0s);
  opener.join();
  EXPECT_EQ(running.get(), 1);
  for (auto& t : queued) {
    EXPECT_EQ(t.status(), TaskStatus::rejected);
    EXPECT_EQ(t.reason(), Errc::shutdown_dropped);
  }
  EXPECT_EQ(r.rejected.size(), 3u);
  EXPECT_TRUE(listed(r.rejected, "q0") && listed(r.rejected, "q2"));
  EXPECT_EQ(r.rejected_unnamed, 1u);
  EXPECT_EQ(r.during.rejected, 4u);
  EXPECT_EQ(r.during.succeeded, 1u);
  EXPECT_EQ(r.lifetime.total(), pool.stats().submitted);
}

TEST(ShutdownHard, StopsRunningLongTasksAndRejectsQueuedOnes) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  std::latch started(2);
  auto a = pool.submit(cooperative(started), {.name = "long-a"});
  ASSERT_EQ(pool.post(cooperative(started)), Admission::accepted);
  started.wait();
  auto queued = pool.submit([] {}, {.name = "queued"});
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_EQ(a.status(), TaskStatus::cancelled);
  EXPECT_EQ(queued.status(), TaskStatus::rejected);
  EXPECT_TRUE(listed(r.cancelled, "long-a"));
  EXPECT_TRUE(listed(r.rejected, "queued"));
  EXPECT_EQ(r.during.cancelled, 2u);  // the unnamed posted one is counted
  EXPECT_TRUE(r.abandoned.empty());
  EXPECT_EQ(r.final_state, PoolState::stopped);
}

TEST(ShutdownHard, ShortTasksFinishBecauseTheyCannotBeInterrupted) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .abandon_grace = 5s});
  std::latch started(1);
  auto t = pool.submit([&] {
    started.count_down();
    std::this_thread::sleep_for(30ms);
    return 9;
  });
  started.wait();
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_EQ(t.get(), 9);
  EXPECT_EQ(r.during.succeeded, 1u);
}

TEST(ShutdownEscalation, ADrainThatTimesOutGoesHard) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  std::latch started(1);
  auto stuck = pool.submit(cooperative(started), {.name = "stuck"});
  started.wait();
  auto queued = pool.submit([] {}, {.name = "behind"});
  const auto t0 = std::chrono::steady_clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 30ms);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  EXPECT_TRUE(r.escalated);
  EXPECT_EQ(r.final_state, PoolState::stopped_timeout);
  EXPECT_EQ(pool.state(), PoolState::stopped_timeout);
  EXPECT_EQ(stuck.status(), TaskStatus::cancelled);
  EXPECT_EQ(queued.status(), TaskStatus::rejected);
  EXPECT_TRUE(listed(r.cancelled, "stuck"));
  EXPECT_TRUE(listed(r.rejected, "behind"));
}

TEST(ShutdownEscalation, ASoftShutdownThatTimesOutGoesHard) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  std::latch started(1);
  auto stuck = pool.submit(cooperative(started));
  started.wait();
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 20ms);
  EXPECT_TRUE(r.escalated);
  EXPECT_EQ(stuck.status(), TaskStatus::cancelled);
}

// A long task that ignores its token is written off after the grace period:
// the shutdown returns, lists it, and the thread finishes later on its own.
TEST(ShutdownEscalation, AHarderConcurrentShutdownEscalatesTheRunningOne) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  std::latch started(1);
  auto stuck = pool.submit(cooperative(started));
  started.wait();
  ShutdownReport drain_report;
  std::thread drainer([&] { drain_report = pool.shutdown(ShutdownMode::drain, 0s); });  // no limit
  ASSERT_TRUE(eventually([&] { return pool.state() == PoolState::stopping; }));
  std::this_thread::sleep_for(10ms);
  const ShutdownReport hard_report = pool.shutdown(ShutdownMode::hard, 0s);
  drainer.join();
  EXPECT_TRUE(drain_report.escalated);
  EXPECT_EQ(drain_report.final_state, PoolState::stopped_timeout);
  EXPECT_EQ(stuck.status(), TaskStatus::cancelled);
  EXPECT_TRUE(hard_report.escalated);  // the same report
}

TEST(ShutdownAbandon, AHungTaskIsAbandonedAfterTheGrace) {
  Watchdog dog;
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::latch started(1);
  Pool pool({.max_workers = 1, .abandon_grace = 30ms});
  auto hung = pool.submit(
      [gate, finished, &started](std::stop_token) {
        started.count_down();
        gate->wait();  // ignores its token
        finished->store(true);
      },
      {.name = "hung"});
  started.wait();
  const auto t0 = std::chrono::steady_clock::now();
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s * test::kSlowdown);
  EXPECT_TRUE(listed(r.abandoned, "hung"));
  EXPECT_EQ(hung.status(), TaskStatus::cancelled);
  EXPECT_EQ(hung.reason(), Errc::abandoned);
  EXPECT_EQ(pool.stats().abandoned, 1u);
  gate->open();
  EXPECT_TRUE(eventually([&] { return finished->load(); }));
}

// A drain with no timeout (also ~Pool's, with shutdown_timeout 0) returns
// once the supervisor writes off the last worker, whose long task ignored
// the stop its deadline requested.
TEST(ShutdownAbandon, ADrainWithoutTimeoutReturnsWhenTheLastWorkerIsWrittenOff) {
  Watchdog dog(20s);
  auto gate = std::make_shared<Gate>();
  Pool pool({.max_workers = 1, .shutdown_timeout = 0ns, .abandon_grace = 50ms});
  std::latch started(1);
  ASSERT_EQ(pool.post(
                [gate, &started](std::stop_token) {
                  started.count_down();
                  (void)gate->wait();  // ignores its token
                },
                {.name = "hung", .timeout = 50ms}),
            Admission::accepted);
  started.wait();
  auto done = std::async(std::launch::async, [&] { return pool.shutdown(); });  // drain, no timeout
  const bool returned = done.wait_for(2s * test::kSlowdown) == std::future_status::ready;
  gate->open();
  ASSERT_TRUE(returned) << "the drain did not return after the write-off";
  const ShutdownReport r = done.get();
  EXPECT_EQ(r.final_state, PoolState::stopped);
  EXPECT_EQ(pool.stats().abandoned, 1u);
}

// Destroys the pool while an abandoned task still runs, then lets the task
// finish: under AddressSanitizer this proves the thread touches no freed
// memory (it co-owns the pool's core).
TEST(ShutdownAbandon, ThePoolCanBeDestroyedWhileAnAbandonedTaskRuns) {
  Watchdog dog;
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  {
    std::latch started(1);
    Pool pool({.max_workers = 1, .shutdown_mode = ShutdownMode::hard, .abandon_grace = 10ms});
    ASSERT_EQ(pool.post(
                  [gate, finished, &started](std::stop_token) {
                    started.count_down();
                    gate->wait();
                    std::this_thread::sleep_for(5ms);
                    finished->store(true);
                  },
                  {.name = "outlives-the-pool"}),
              Admission::accepted);
    started.wait();
  }  // ~Pool: hard shutdown, the task is abandoned
  EXPECT_FALSE(finished->load());
  gate->open();
  EXPECT_TRUE(eventually([&] { return finished->load(); }));
  std::this_thread::sleep_for(20ms);  // let the thread end and free the core
}

// No user code of a pool runs after ~Pool returned: a written-off plain
// task that throws later does not reach on_exception, and its thread does
// not call on_worker_stop (both are user code the caller may have torn
// down with the pool).
TEST(ShutdownAbandon, AWrittenOffThreadRunsNoHookOrHandlerAfterThePoolIsGone) {
  Watchdog dog;
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto late_calls = std::make_shared<std::atomic<int>>(0);
  auto pool_gone = std::make_shared<std::atomic<bool>>(false);
  {
    std::latch started(1);
    PoolOptions o;
    o.max_workers = 1;
    o.shutdown_mode = ShutdownMode::hard;
    o.abandon_grace = 10ms;
    o.on_exception = [late_calls, pool_gone](const TaskRef&, std::exception_ptr) {
      if (pool_gone->load()) late_calls->fetch_add(1);
    };
    o.on_worker_stop = [late_calls, pool_gone](std::uint64_t) {
      if (pool_gone->load()) late_calls->fetch_add(1);
    };
    Pool pool(std::move(o));
    ASSERT_EQ(pool.post([gate, finished, &started] {
      started.count_down();
      gate->wait();
      finished->store(true);
      throw std::runtime_error("after the pool");
    }),
              Admission::accepted);
    started.wait();
  }  // ~Pool: hard shutdown, the plain task is written off
  pool_gone->store(true);
  gate->open();
  ASSERT_TRUE(eventually([&] { return finished->load(); }));
  std::this_thread::sleep_for(50ms);  // let the thread throw, unwind and end
  EXPECT_EQ(late_calls->load(), 0) << "user code ran after ~Pool returned";
}

// A worker written off inside its start hook (it hung there past two grace
// periods of a hard shutdown) must not go on to serve tasks: after
// restart() it would run beside the new workers, off the books, and the
// pool would exceed max_workers.
TEST(ShutdownAbandon, AWorkerWrittenOffInItsStartHookNeverServesTasks) {
  Watchdog dog;
  auto hook_gate = std::make_shared<Gate>();
  auto hooks = std::make_shared<std::atomic<int>>(0);
  PoolOptions o;
  o.min_workers = 1;
  o.max_workers = 1;
  o.abandon_grace = 10ms;
  o.on_worker_start = [hook_gate, hooks](std::uint64_t) {
    if (hooks->fetch_add(1) == 0) hook_gate->wait();  // the first worker hangs here
  };
  Pool pool(std::move(o));
  ASSERT_TRUE(eventually([&] { return hooks->load() == 1; }));
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_EQ(r.final_state, PoolState::stopped);
  ASSERT_TRUE(pool.restart());
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::atomic<int> ran{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  auto task = [&] {
    {
      const std::lock_guard lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    test::raise_peak(most, running.fetch_add(1) + 1);
    std::this_thread::sleep_for(200us);
    running.fetch_sub(1);
    ran.fetch_add(1);
  };
  for (int i = 0; i < 20; ++i) ASSERT_EQ(pool.post(task), Admission::accepted);
  hook_gate->open();  // the written-off thread leaves its hook now
  std::this_thread::sleep_for(20ms);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(pool.post(task), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 220);
  EXPECT_EQ(most.load(), 1) << "more tasks ran at once than max_workers";
  EXPECT_EQ(threads.size(), 1u) << "tasks ran on the written-off thread too";
}

TEST(DeadlineAbandon, AHungTaskPastDeadlineAndGraceCostsNoCapacity) {
  Watchdog dog;
  auto gate = std::make_shared<Gate>();
  Pool pool({.min_workers = 1, .max_workers = 1, .abandon_grace = 20ms});
  auto hung = pool.submit([gate](std::stop_token) { gate->wait(); },
                          {.name = "ignores-deadline", .timeout = 10ms});
  // The one worker is written off and replaced: a new task still runs.
  auto next = pool.submit([] { return 42; });
  EXPECT_EQ(next.get(), 42);
  EXPECT_EQ(hung.status(), TaskStatus::timed_out);
  EXPECT_EQ(hung.reason(), Errc::abandoned);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.abandoned, 1u);
  EXPECT_GE(s.workers_replaced, 1u);
  EXPECT_EQ(s.workers, 1u);
  gate->open();
}

// A task's stop callback is user code and may block. Run on the
// supervisor, one that blocks stalled every other deadline and write-off of
// the pool; the stopper thread fires them now, so a second task past its
// deadline is still stopped and written off on time.
TEST(DeadlineAbandon, ABlockingStopCallbackDelaysNoOtherTasksDeadline) {
  Watchdog dog;
  auto callback_gate = std::make_shared<Gate>();
  auto hung_gate = std::make_shared<Gate>();
  PoolOptions o = {.max_workers = 2, .abandon_grace = 20ms};
  Pool pool(std::move(o));
  std::latch started(2);
  auto slow = pool.submit(
      [callback_gate, &started](std::stop_token token) {
        const std::stop_callback blocks(token, [callback_gate] { callback_gate->wait(); });
        started.count_down();
        while (!token.stop_requested()) std::this_thread::sleep_for(1ms);
      },
      {.name = "slow-callback", .timeout = 10ms});
  auto hung = pool.submit(
      [hung_gate, &started](std::stop_token) {
        started.count_down();
        hung_gate->wait();  // ignores its token
      },
      {.name = "hung", .timeout = 30ms});
  started.wait();
  // Written off 20 ms after its 30 ms deadline, whatever the other task's
  // stop callback does.
  EXPECT_TRUE(eventually([&] { return hung.ready(); }, 5000ms))
      << "a blocking stop callback stalled another task's deadline";
  EXPECT_EQ(hung.status(), TaskStatus::timed_out);
  EXPECT_EQ(hung.reason(), Errc::abandoned);
  callback_gate->open();
  hung_gate->open();
  ASSERT_TRUE(slow.wait_for(5s));
}

TEST(DeadlineAbandon, AnInlineLongTaskIsAbandonedToo) {
  Watchdog dog;
  auto gate = std::make_shared<Gate>();
  Pool pool({.min_workers = 1, .max_workers = 1, .abandon_grace = 20ms});
  ASSERT_EQ(pool.post([gate](std::stop_token) { gate->wait(); }, {.timeout = 10ms}),
            Admission::accepted);
  auto next = pool.submit([] { return 1; });
  EXPECT_EQ(next.get(), 1);
  EXPECT_TRUE(eventually([&] { return pool.stats().outcomes.timed_out == 1; }));
  EXPECT_EQ(pool.stats().abandoned, 1u);
  gate->open();
}

TEST(ShutdownReportTest, IsIdempotentAndSharedByConcurrentCallers) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  pool.pause();
  for (int i = 0; i < 10; ++i) (void)pool.post([] {}, {.name = "n" + std::to_string(i)});
  std::vector<ShutdownReport> reports(4);
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back(
        [&, i] { reports[static_cast<std::size_t>(i)] = pool.shutdown(ShutdownMode::soft, 0s); });
  }
  for (auto& t : callers) t.join();
  for (const auto& r : reports) {
    EXPECT_EQ(r.rejected.size(), 10u);
    EXPECT_EQ(r.during.rejected, 10u);
  }
  const ShutdownReport again = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_EQ(again.mode, ShutdownMode::soft);  // the first shutdown's report
  EXPECT_EQ(again.rejected.size(), 10u);
}

// report.cancelled lists the tasks the hard phase stopped, not one stopped
// before the shutdown whose run was still ending when the shutdown began:
// here "early" is stopped through its worker, and its on_exception handler
// (which runs after the task's outcome is decided) holds the run's end
// until the shutdown has begun. "late" is stopped by the hard phase.
TEST(ShutdownReportTest, ListsOnlyTasksTheHardPhaseStopped) {
  Watchdog dog;
  std::atomic<bool> handler_entered{false};
  std::atomic<Pool*> self{nullptr};
  PoolOptions opts{.min_workers = 2, .max_workers = 2};
  opts.on_exception = [&](const TaskRef& ref, std::exception_ptr) {
    if (ref.name != "early") return;
    handler_entered = true;
    (void)test::eventually([&] { return self.load()->state() != PoolState::running; });
  };
  Pool pool(opts);
  self = &pool;
  std::latch started(2);
  const auto throw_after_stop = [&started](std::stop_token st) {
    started.count_down();
    while (!st.stop_requested()) std::this_thread::sleep_for(1ms);
    throw std::runtime_error("stopped");
  };
  ASSERT_EQ(pool.post(throw_after_stop, {.name = "early"}), Admission::accepted);
  auto late = pool.submit(cooperative(started), {.name = "late"});
  started.wait();
  std::uint64_t early_worker = 0;
  for (const WorkerInfo& w : pool.workers()) {
    if (w.task.name == "early") early_worker = w.id;
  }
  ASSERT_NE(early_worker, 0u);
  ASSERT_TRUE(pool.stop_worker(early_worker, WorkerStop::hard));
  ASSERT_TRUE(test::eventually([&] { return handler_entered.load(); }));
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 5s);
  EXPECT_EQ(late.status(), TaskStatus::cancelled);
  EXPECT_TRUE(listed(r.cancelled, "late"));
  EXPECT_FALSE(listed(r.cancelled, "early")) << "stopped before the shutdown began";
}

class ShutdownRace : public testing::TestWithParam<ShutdownMode> {};

// Submissions racing a shutdown are either accepted and handled per the mode
// or refused: never lost, never a crash.
TEST_P(ShutdownRace, SubmissionsRacingAShutdownAreNeverLost) {
  Watchdog dog(60s);
  const ShutdownMode mode = GetParam();
  for (int round = 0; round < 20; ++round) {
    Pool pool({.max_workers = 2, .queue_capacity = 64});
    std::atomic<int> accepted{0}, ran{0}, refused{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> producers;
    for (int p = 0; p < 3; ++p) {
      producers.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 2000; ++i) {
          if (pool.post([&] { ran.fetch_add(1); }) == Admission::accepted) {
            accepted.fetch_add(1);
          } else {
            refused.fetch_add(1);
          }
        }
      });
    }
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
    (void)pool.shutdown(mode, 0s);
    for (auto& t : producers) t.join();
    ASSERT_TRUE(pool.wait_idle(10s));
    // Asked again after the racing producers are done: the report then
    // includes submissions that reached the queue after the shutdown returned.
    const ShutdownReport r = pool.shutdown(mode, 0s);
    const PoolStats s = pool.stats();
    SCOPED_TRACE("round " + std::to_string(round));
    EXPECT_EQ(accepted.load() + refused.load(), 3 * 2000);
    EXPECT_EQ(s.submitted, 3u * 2000u);
    EXPECT_EQ(s.outcomes.total(), s.submitted);
    EXPECT_EQ(s.outcomes.succeeded, static_cast<std::uint64_t>(ran.load()));
    if (mode == ShutdownMode::drain) {
      EXPECT_EQ(ran.load(), accepted.load());  // drain runs everything accepted
    } else {
      EXPECT_EQ(static_cast<std::uint64_t>(ran.load()) + r.rejected_unnamed,
                static_cast<std::uint64_t>(accepted.load()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, ShutdownRace,
                         testing::Values(ShutdownMode::drain, ShutdownMode::soft,
                                         ShutdownMode::hard),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// shutdown() waits for the pool's workers to leave: from one of the pool's
// tasks it would wait for itself (drain, soft), or write its own worker off
// after the timeout or grace (hard, escalation). It throws instead.
TEST(ShutdownSelfCalls, ShutdownFromATaskOfThePoolThrowsAtOnceInEveryMode) {
  Watchdog dog;
  Pool pool({.max_workers = 2, .abandon_grace = 100ms});
  struct Case {
    ShutdownMode mode;
    std::chrono::nanoseconds timeout;
  };
  for (const Case c :
       {Case{ShutdownMode::soft, 50ms}, Case{ShutdownMode::hard, 0s}, Case{ShutdownMode::drain, 1h},
        Case{ShutdownMode::drain, 0s}, Case{ShutdownMode::soft, 0s}}) {
    SCOPED_TRACE(std::string(to_string(c.mode)) + " " + std::to_string(c.timeout.count()) + " ns");
    auto t = pool.submit([&pool, c]() -> int {
      try {
        (void)pool.shutdown(c.mode, c.timeout);
      } catch (const Error& e) {
        return static_cast<int>(e.code());
      }
      return -1;
    });
    ASSERT_TRUE(t.wait_for(5s * test::kSlowdown)) << "shutdown() waited for its own task";
    EXPECT_EQ(t.get(), static_cast<int>(Errc::would_deadlock));
    EXPECT_EQ(pool.state(), PoolState::running);
  }
  auto defaults = pool.submit([&pool] { (void)pool.shutdown(); });
  defaults.wait();
  EXPECT_EQ(defaults.status(), TaskStatus::failed);
  // From outside the pool it works as before, and nothing was written off.
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 0s);
  EXPECT_EQ(r.final_state, PoolState::stopped);
  EXPECT_TRUE(r.abandoned.empty());
  EXPECT_EQ(r.abandoned_unnamed, 0u);
  EXPECT_EQ(pool.stats().workers_replaced, 0u);
}

// A stop callback that a hard shutdown fires on its own thread, and that
// calls shutdown() on the same pool, does not wait for that shutdown (it
// would wait for itself): it returns at once with the pool still stopping.
TEST(ShutdownSelfCalls, AStopCallbackThatShutsTheSamePoolDownReturnsAtOnce) {
  Watchdog dog(20s);
  Pool pool({.name = "t", .max_workers = 1, .abandon_grace = 2s});
  std::latch started(1);
  std::atomic<int> inner_state{-1};
  auto t = pool.submit(
      [&](std::stop_token stop) {
        const std::stop_callback again(stop, [&] {
          inner_state = static_cast<int>(pool.shutdown(ShutdownMode::hard, 0s).final_state);
        });
        started.count_down();
        until_stopped(stop);
      },
      {.name = "calls back"});
  started.wait();
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_EQ(inner_state.load(), static_cast<int>(PoolState::stopping));
  EXPECT_EQ(r.final_state, PoolState::stopped);
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
}

}  // namespace
}  // namespace crew
