// Tests of the Application's pools and its hard path: registered pools
// cancelled through the context and shut down in their mode when the
// application stops, and shutdown_now (from main, while halting, during
// the pools' drain, during init).
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "app_test_support.hpp"
#include "child_process.hpp"
#include "crew/application.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::BusyPool;
using test::Child;
using test::count;
using test::events;
using test::exit_code;
using test::expect_order;
using test::find;
using test::Journal;
using test::kSlowdown;
using test::quiet;
using test::Recorded;
using test::wait_for_stop;
using test::Watchdog;

// ---------------------------------------------------------------------------
// States, codes, options.

TEST(AppPools, TheContextIsCancelledThenRegisteredPoolsAreShutDownInTheirMode) {
  Watchdog dog;
  Pool drain_pool({.name = "drainer",
                   .max_workers = 1,
                   .shutdown_mode = ShutdownMode::drain,
                   .shutdown_timeout = 5s});
  Pool soft_pool({.name = "softy",
                  .max_workers = 1,
                  .shutdown_mode = ShutdownMode::soft,
                  .shutdown_timeout = 5s});
  Application app(quiet());
  app.add_pool(drain_pool);
  app.add_pool(soft_pool);
  EXPECT_THROW(app.add_pool(drain_pool), Error);
  std::atomic<int> drained{0};
  std::atomic<int> soft_ran{0};
  std::atomic<bool> soft_started{false};
  std::atomic<int> ran_after_cancel{0};
  std::atomic<bool> blocker_cancelled{false};
  const Context ctx = app.context();
  test::Gate gate;
  std::thread opener;
  const int code = app.run([&](const Context&) {
    // Holds the only worker until the context is cancelled: the five behind
    // it can only run once it was.
    ASSERT_EQ(drain_pool.post([&] { blocker_cancelled = wait_for_stop(ctx.stop_token(), 10s); }),
              Admission::accepted);
    for (int i = 0; i < 5; ++i) {
      ASSERT_EQ(drain_pool.post([&] {
        std::this_thread::sleep_for(10ms);
        if (ctx.stop_token().stop_requested()) ran_after_cancel.fetch_add(1);
        drained.fetch_add(1);
      }),
                Admission::accepted);
    }
    ASSERT_EQ(soft_pool.post([&] {
      soft_started = true;
      gate.wait();
      soft_ran.fetch_add(1);
    }),
              Admission::accepted);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(soft_pool.post([&] { soft_ran.fetch_add(1); }), Admission::accepted);
    }
    // The gated task must be running (not queued) when main returns.
    ASSERT_TRUE(test::eventually([&] { return soft_started.load(); }));
    // Open the gate once the shutdown has started, so the three are still
    // queued when the soft shutdown drops them.
    opener = std::thread([&gate, &soft_pool] {
      (void)test::eventually([&] { return soft_pool.state() != PoolState::running; });
      gate.open();
    });
  });
  opener.join();
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(blocker_cancelled.load());
  EXPECT_EQ(drained.load(), 5);           // drain: everything queued ran
  EXPECT_EQ(ran_after_cancel.load(), 5);  // ... after the context was cancelled
  EXPECT_EQ(soft_ran.load(), 1);          // soft: the running one finished, queued ones dropped
  EXPECT_EQ(drain_pool.state(), PoolState::stopped);
  EXPECT_EQ(soft_pool.state(), PoolState::stopped);
}

// Context::stop_token() is the cancellation source long tasks are told to
// watch: a drain must not wait for such a task to end by itself.
TEST(AppPools, ATaskWaitingForTheContextsStopTokenDoesNotHoldUpTheDrain) {
  Watchdog dog;
  Pool pool({.name = "consumer",
             .max_workers = 1,
             .shutdown_timeout = std::chrono::nanoseconds{0}});  // drain without a timeout
  Application app(quiet());
  app.add_pool(pool);
  std::atomic<bool> saw_cancel{false};
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context& ctx) {
    ASSERT_EQ(pool.post([&saw_cancel, token = ctx.stop_token()] {
      saw_cancel = wait_for_stop(token, 20s);
    }),
              Admission::accepted);
  });
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown) << "the drain waited for the task's own 20 s";
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(saw_cancel.load());
  EXPECT_EQ(pool.state(), PoolState::stopped);
}

// A registered pool with no shutdown timeout of its own (0; the pool's
// default is 10 s) gets the application's pool_shutdown_timeout, then goes
// hard.
TEST(AppPools, AnUnboundedDrainIsCutAtThePoolShutdownTimeout) {
  Watchdog dog;
  EXPECT_EQ(ApplicationOptions{}.pool_shutdown_timeout, 10s);  // bounded by default
  Pool pool({.name = "stubborn",
             .max_workers = 1,
             .shutdown_timeout = std::chrono::nanoseconds{0},
             .abandon_grace = 100ms});
  Application app(quiet({.pool_shutdown_timeout = 200ms}));
  app.add_pool(pool);
  std::atomic<bool> stopped{false};
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context&) {
    // Ignores the context: only its own token, stopped by the hard phase, ends it.
    ASSERT_EQ(pool.post([&stopped](std::stop_token st) { stopped = wait_for_stop(st, 20s); }),
              Admission::accepted);
  });
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 5s * kSlowdown);
  EXPECT_TRUE(stopped.load());
  EXPECT_EQ(code, static_cast<int>(ExitCode::shutdown_failure));
  ASSERT_TRUE(app.failure().has_value());
  EXPECT_EQ(app.failure()->kind, FailureKind::pool_shutdown);
  EXPECT_EQ(pool.state(), PoolState::stopped_timeout);
}

TEST(AppPools, AFailedStartupStillShutsRegisteredPoolsDown) {
  Watchdog dog;
  struct Failing final : Resource {
    void init(const ResourceCall&) override { throw std::runtime_error("no database"); }
    void close(const ResourceCall&) override { ADD_FAILURE() << "closed without init"; }
  };
  Pool pool({.name = "work", .max_workers = 1});
  Application app(quiet());
  app.add_resource(std::make_shared<Failing>(), {.name = "db"});
  app.add_pool(pool);
  const int code = app.run([](const Context&) { ADD_FAILURE() << "main ran"; });
  EXPECT_EQ(code, static_cast<int>(ExitCode::startup_failure));
  EXPECT_EQ(pool.state(), PoolState::stopped);
  ASSERT_TRUE(app.failure().has_value());
  EXPECT_EQ(app.failure()->kind, FailureKind::init_failed);
  EXPECT_EQ(app.failure()->source, "db");
  EXPECT_EQ(app.failure()->message, "no database");
}

TEST(AppPools, TheHardPathShutsPoolsDownHard) {
  Watchdog dog;
  Pool pool({.name = "work",
             .max_workers = 1,
             .shutdown_mode = ShutdownMode::drain,
             .shutdown_timeout = 30s});
  Application app(quiet({.termination_timeout = 100ms}));
  app.add_pool(pool);
  std::atomic<bool> task_stopped{false};
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context& ctx) {
    ASSERT_EQ(pool.post([&](std::stop_token st) { task_stopped = wait_for_stop(st, 20s); }),
              Admission::accepted);
    ctx.halt();
    // Ignores the halt; returns only once cancelled.
    (void)wait_for_stop(ctx.stop_token());
  });
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown);
  EXPECT_EQ(code, static_cast<int>(ExitCode::termination_timeout));
  EXPECT_TRUE(task_stopped.load());
  EXPECT_EQ(pool.state(), PoolState::stopped);
}

// ---------------------------------------------------------------------------
// shutdown_now(): the hard path at once, from code.

TEST(AppShutdownNow, FromMainGoesToShutdownAtOnceAndShutsPoolsDownHard) {
  Watchdog dog;
  BusyPool busy;
  Application app(busy.options());
  app.add_pool(busy.pool);
  bool halted_before_call = true;
  bool cancelled_at_return = false;
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context& ctx) {
    busy.load();
    halted_before_call = ctx.halting();
    ctx.shutdown_now("admin", "POST /admin/stop");
    // Ignores the halt token; returns once cancelled.
    cancelled_at_return = wait_for_stop(ctx.stop_token());
  });
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown);
  EXPECT_FALSE(halted_before_call);
  EXPECT_TRUE(cancelled_at_return);
  busy.expect_hard_path(app, code, FailureKind::hard_stop, "admin", "POST /admin/stop");
}

// From another thread while main is halting: the termination timeout's wait
// is cut short.
TEST(AppShutdownNow, WhileHaltingCutsTheTerminationTimeoutShort) {
  Watchdog dog;
  BusyPool busy;
  Application app(busy.options());
  app.add_pool(busy.pool);
  std::thread stopper;
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context& ctx) {
    busy.load();
    stopper = std::thread([&app] {
      ASSERT_TRUE(test::eventually([&app] { return app.state() == AppState::halting; }));
      app.shutdown_now("watchdog", "halt takes too long");
    });
    ctx.halt();
    (void)wait_for_stop(ctx.stop_token());
  });
  stopper.join();
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown);
  EXPECT_EQ(code, static_cast<int>(ExitCode::hard_stop));
  EXPECT_EQ(busy.states, (std::vector<AppState>{AppState::running, AppState::halting,
                                                AppState::shutdown, AppState::off}));
  busy.expect_shut_down_hard();
}

// During the pools' graceful shutdown (main returned on its own): a drain
// with no bound at all goes hard at once.
TEST(AppShutdownNow, DuringThePoolsDrainMakesThemGoHard) {
  Watchdog dog;
  Pool pool({.name = "unbounded",
             .max_workers = 1,
             .shutdown_mode = ShutdownMode::drain,
             .shutdown_timeout = 0s});
  Application app(quiet({.pool_shutdown_timeout = 0s}));
  app.add_pool(pool);
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};
  std::thread stopper;
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context&) {
    // Ignores the context: only its own token, stopped by the hard shutdown, ends it.
    ASSERT_EQ(pool.post([&](std::stop_token st) {
      started = true;
      stopped = wait_for_stop(st, 20s);
    }),
              Admission::accepted);
    ASSERT_TRUE(test::eventually([&] { return started.load(); }));
    stopper = std::thread([&app, &pool] {
      ASSERT_TRUE(test::eventually([&pool] { return pool.state() == PoolState::stopping; }));
      app.shutdown_now("operator", "drain takes too long");
    });
  });
  stopper.join();
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown) << "the drain waited for the task's own 20 s";
  EXPECT_TRUE(stopped.load());
  EXPECT_EQ(code, static_cast<int>(ExitCode::hard_stop));
  ASSERT_TRUE(app.failure().has_value());
  EXPECT_EQ(app.failure()->kind, FailureKind::hard_stop);  // not "forced": no signal came
}

// During start-up: the init in progress gets its token stopped and is not
// waited for; main never runs; what was initialized is closed.
TEST(AppShutdownNow, DuringInitAbandonsStartupWithTheHardStopsExitCode) {
  Watchdog dog;
  auto journal = std::make_shared<Journal>();
  auto release = std::make_shared<test::Gate>();
  struct Stuck final : Resource {
    explicit Stuck(std::shared_ptr<test::Gate> g) : gate(std::move(g)) {}
    // Ignores its token: only the test's gate (opened at the end) lets it go.
    void init(const ResourceCall&) override { (void)gate->wait(); }
    void close(const ResourceCall&) override { ADD_FAILURE() << "closed after a failed init"; }
    std::shared_ptr<test::Gate> gate;
  };
  Application app(quiet({.init_timeout = 10min}));
  app.add_resource(std::make_shared<Recorded>(journal, "db"), {.name = "db"});
  app.add_resource(std::make_shared<Stuck>(release), {.name = "stuck"});
  std::thread stopper([&app, &journal] {
    ASSERT_TRUE(test::eventually([&journal] { return !journal->get().empty(); }));
    std::this_thread::sleep_for(20ms);  // into stuck's init
    app.shutdown_now("supervisor", "start-up must not hang");
  });
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context&) { journal->add("main"); });
  stopper.join();
  release->open();
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown);
  EXPECT_EQ(code, static_cast<int>(ExitCode::hard_stop));
  EXPECT_EQ(journal->get(), (std::vector<std::string>{"init db", "close db"}));
}

// The first failure still decides the exit code; the hard path is taken
// all the same.
TEST(AppShutdownNow, AnEarlierFailureKeepsItsExitCode) {
  Watchdog dog;
  BusyPool busy;
  Application app(busy.options());
  app.add_pool(busy.pool);
  const int code = app.run([&](const Context& ctx) {
    busy.load();
    ctx.fail("ledger", "checksum mismatch");
    ctx.shutdown_now("ledger", "corrupted state");
    (void)wait_for_stop(ctx.stop_token());
  });
  EXPECT_EQ(code, static_cast<int>(ExitCode::runtime_failure));
  ASSERT_TRUE(app.failure().has_value());
  EXPECT_EQ(app.failure()->kind, FailureKind::reported);
  EXPECT_EQ(app.failure()->message, "checksum mismatch");
  busy.expect_shut_down_hard();
}

}  // namespace
}  // namespace crew
