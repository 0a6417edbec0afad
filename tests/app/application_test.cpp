// Tests of the Application lifecycle.
//
// In-process tests cover options, states, the context, failures and pools
// (with signal handling off, or on SIGUSR1 only, since gtest owns the
// process). Every signal path runs in a child process (tests/app/app_child,
// or the graceful_consumer example): the test forks and execs it, sends real
// signals, reads the calls it reports, and checks the exit code, the order
// of the calls and the time taken (tests/support/child_process.hpp; one table
// row per scenario). A child that overruns its bound is killed and the test
// fails. The signal pipe on its own is tested in signals_test.
#include "crew/application.hpp"

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

#include "child_process.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Child;
using test::count;
using test::events;
using test::exit_code;
using test::expect_order;
using test::find;
using test::kSlowdown;
using test::Watchdog;

// Blocks until the token is stopped or the limit passes; true if stopped.
bool wait_for_stop(std::stop_token token, std::chrono::milliseconds limit = 10s) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  return cv.wait_for(lock, token, limit * kSlowdown, [] { return false; }) ||
         token.stop_requested();
}

struct NullLogger final : Logger {
  [[nodiscard]] LogLevel level() const noexcept override { return LogLevel::error; }
  void log(LogLevel, const LogContext&, std::string_view) noexcept override {}
};

// Signal handling off: gtest's process is not ours to take SIGINT from.
ApplicationOptions quiet(ApplicationOptions o = {}) {
  o.signals = {};
  o.logger = std::make_shared<NullLogger>();
  return o;
}

std::unique_ptr<Child> start_child(const std::string& scenario) {
  return std::make_unique<Child>(std::vector<std::string>{CREW_APP_CHILD, scenario});
}

// ---------------------------------------------------------------------------
// States, codes, options.

TEST(AppState, OnlyTheLifecycleTransitionsAreLegal) {
  const AppState all[] = {AppState::init, AppState::running, AppState::halting, AppState::shutdown,
                          AppState::off};
  const std::set<std::pair<AppState, AppState>> legal = {
      {AppState::init, AppState::running},     {AppState::init, AppState::shutdown},
      {AppState::running, AppState::halting},  {AppState::running, AppState::shutdown},
      {AppState::halting, AppState::shutdown}, {AppState::shutdown, AppState::off}};
  for (AppState from : all) {
    for (AppState to : all) {
      EXPECT_EQ(is_legal_transition(from, to), legal.count({from, to}) == 1)
          << to_string(from) << " -> " << to_string(to);
    }
  }
  EXPECT_EQ(to_string(AppState::halting), "halting");
  EXPECT_EQ(to_string(AppState::off), "off");
}

TEST(AppExitCode, EachFailureKindMapsToItsDocumentedCode) {
  EXPECT_EQ(static_cast<int>(ExitCode::ok), 0);
  EXPECT_EQ(static_cast<int>(ExitCode::runtime_failure), 1);
  EXPECT_EQ(static_cast<int>(ExitCode::startup_failure), 3);
  EXPECT_EQ(static_cast<int>(ExitCode::termination_timeout), 4);
  EXPECT_EQ(static_cast<int>(ExitCode::forced), 5);
  EXPECT_EQ(static_cast<int>(ExitCode::shutdown_failure), 6);
  EXPECT_EQ(static_cast<int>(ExitCode::hard_stop), 7);
  EXPECT_EQ(exit_code_of(FailureKind::hard_stop), ExitCode::hard_stop);
  EXPECT_EQ(exit_code_of(FailureKind::init_timed_out), ExitCode::startup_failure);
  EXPECT_EQ(exit_code_of(FailureKind::ping_timed_out), ExitCode::runtime_failure);
  EXPECT_EQ(exit_code_of(FailureKind::main_threw), ExitCode::runtime_failure);
  EXPECT_EQ(exit_code_of(FailureKind::close_timed_out), ExitCode::shutdown_failure);
  EXPECT_EQ(exit_code_of(FailureKind::forced), ExitCode::forced);
  EXPECT_EQ(to_string(FailureKind::pool_shutdown), "pool_shutdown");
  EXPECT_EQ(to_string(ExitCode::termination_timeout), "termination_timeout");
}

std::string invalid_message(const ApplicationOptions& o) {
  try {
    Application app(o);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    return e.what();
  }
  return "";
}

TEST(AppOptions, InvalidValuesAreRejectedWithTheFieldName) {
  auto has = [](const std::string& msg, const char* field) {
    return msg.find(field) != std::string::npos;
  };
  EXPECT_TRUE(has(invalid_message({.name = ""}), "name"));
  EXPECT_TRUE(has(invalid_message({.init_timeout = 0s}), "init_timeout"));
  EXPECT_TRUE(has(invalid_message({.termination_timeout = -1s}), "termination_timeout"));
  EXPECT_TRUE(has(invalid_message({.shutdown_timeout = 0s}), "shutdown_timeout"));
  EXPECT_TRUE(has(invalid_message({.ping_period = 0s}), "ping_period"));
  EXPECT_TRUE(has(invalid_message({.ping_timeout = -1ms}), "ping_timeout"));
  EXPECT_TRUE(has(invalid_message({.signals = {SIGKILL}}), "signals"));
  EXPECT_TRUE(has(invalid_message({.signals = {SIGSEGV}}), "signals"));
  EXPECT_TRUE(has(invalid_message({.signals = {SIGTERM, SIGTERM}}), "signals"));
  EXPECT_TRUE(has(invalid_message({.signals = {0}}), "signals"));
  EXPECT_TRUE(
      has(invalid_message({.on_ping_failure = static_cast<PingFailure>(7)}), "on_ping_failure"));
}

struct Nop final : Resource {
  void init(const ResourceCall&) override {}
  void close(const ResourceCall&) override {}
};

TEST(AppResources, BadNamesAndDependenciesAreRejected) {
  Application app(quiet());
  app.add_resource(std::make_shared<Nop>(), {.name = "db"});
  auto message = [&app](std::shared_ptr<Resource> r, ResourceOptions o) -> std::string {
    try {
      app.add_resource(std::move(r), std::move(o));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(std::make_shared<Nop>(), {.name = ""}).find("name"), std::string::npos);
  EXPECT_NE(message(std::make_shared<Nop>(), {.name = "db"}).find("registered already"),
            std::string::npos);
  EXPECT_NE(message(std::make_shared<Nop>(), {.name = "cache", .depends_on = {"queue"}})
                .find("depends_on"),
            std::string::npos);
  EXPECT_NE(message(nullptr, {.name = "x"}).find("null"), std::string::npos);
  EXPECT_NE(message(std::make_shared<Nop>(),
                    {.name = "x", .on_ping_failure = static_cast<PingFailure>(7)})
                .find("on_ping_failure"),
            std::string::npos);
}

// ---------------------------------------------------------------------------
// In process: states, context, failures, pools.

// Records calls in order; shared so that a call left behind cannot outlive it.
struct Journal {
  std::mutex mu;
  std::vector<std::string> calls;
  void add(std::string s) {
    const std::lock_guard lock(mu);
    calls.push_back(std::move(s));
  }
  std::vector<std::string> get() {
    const std::lock_guard lock(mu);
    return calls;
  }
};

struct Recorded final : Resource {
  Recorded(std::shared_ptr<Journal> j, std::string n, bool fail_ping = false)
      : journal(std::move(j)), name(std::move(n)), fail_ping_(fail_ping) {}
  void init(const ResourceCall&) override { journal->add("init " + name); }
  void ping(const ResourceCall&) override {
    journal->add("ping " + name);
    if (fail_ping_) throw std::runtime_error("connection lost");
  }
  void close(const ResourceCall&) override { journal->add("close " + name); }
  std::shared_ptr<Journal> journal;
  std::string name;
  bool fail_ping_;
};

TEST(AppRun, MainReturningOnItsOwnGoesStraightToShutdownAndExitsZero) {
  Watchdog dog;
  auto journal = std::make_shared<Journal>();
  std::vector<AppState> states;
  Application app(quiet({.on_state_change = [&states](AppState s) { states.push_back(s); }}));
  app.add_resource(std::make_shared<Recorded>(journal, "db"), {.name = "db"});
  EXPECT_EQ(app.state(), AppState::init);
  AppState seen_in_main = AppState::off;
  const int code = app.run([&](const Context& ctx) {
    seen_in_main = ctx.state();
    journal->add("main");
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(seen_in_main, AppState::running);
  EXPECT_EQ(app.state(), AppState::off);
  EXPECT_EQ(states, (std::vector<AppState>{AppState::running, AppState::shutdown, AppState::off}));
  EXPECT_EQ(journal->get(), (std::vector<std::string>{"init db", "main", "close db"}));
  EXPECT_FALSE(app.failure().has_value());
  EXPECT_TRUE(app.context().halt_token().stop_requested());
  EXPECT_TRUE(app.context().stop_token().stop_requested());
}

TEST(AppRun, HaltStopsTheHaltTokenThenMainsReturnLeadsToShutdown) {
  Watchdog dog;
  std::vector<AppState> states;
  Application app(quiet({.on_state_change = [&states](AppState s) { states.push_back(s); }}));
  bool cancelled_while_main_ran = true;
  std::thread halter;
  const int code = app.run([&](const Context& ctx) {
    halter = std::thread([&app] {
      std::this_thread::sleep_for(20ms);
      app.halt();
    });
    EXPECT_TRUE(wait_for_stop(ctx.halt_token()));
    EXPECT_TRUE(ctx.halting());
    EXPECT_EQ(ctx.state(), AppState::halting);
    cancelled_while_main_ran = ctx.stop_token().stop_requested();
  });
  halter.join();
  EXPECT_EQ(code, 0);
  EXPECT_FALSE(cancelled_while_main_ran);
  EXPECT_EQ(states, (std::vector<AppState>{AppState::running, AppState::halting, AppState::shutdown,
                                           AppState::off}));
}

TEST(AppRun, ContextFailHaltsAndTheFirstFailureDecidesTheExitCode) {
  Watchdog dog;
  Application app(quiet());
  std::optional<Failure> seen;
  const int code = app.run([&](const Context& ctx) {
    ctx.fail("listener", "bind: address in use");
    ctx.fail("other", "second failure");  // logged only
    (void)wait_for_stop(ctx.halt_token());
    seen = ctx.failure();
    throw std::runtime_error("third");  // logged only
  });
  EXPECT_EQ(code, static_cast<int>(ExitCode::runtime_failure));
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->kind, FailureKind::reported);
  EXPECT_EQ(seen->source, "listener");
  EXPECT_EQ(seen->message, "bind: address in use");
  ASSERT_TRUE(app.failure().has_value());
  EXPECT_EQ(app.failure()->source, "listener");
}

TEST(AppRun, AnExceptionFromMainIsTheFailureWithTheOriginalException) {
  Watchdog dog;
  Application app(quiet());
  const int code = app.run([](const Context&) { throw std::invalid_argument("bad config"); });
  EXPECT_EQ(code, static_cast<int>(ExitCode::runtime_failure));
  const auto f = app.failure();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, FailureKind::main_threw);
  EXPECT_EQ(f->message, "bad config");
  EXPECT_THROW(std::rethrow_exception(f->exception), std::invalid_argument);
}

TEST(AppRun, AFailedPingHaltsWithARuntimeFailure) {
  Watchdog dog;
  auto journal = std::make_shared<Journal>();
  Application app(quiet({.ping_period = 10ms, .ping_timeout = 1s}));
  app.add_resource(std::make_shared<Recorded>(journal, "db", /*fail_ping=*/true), {.name = "db"});
  const auto t0 = Clock::now();
  const int code = app.run([](const Context& ctx) { (void)wait_for_stop(ctx.halt_token()); });
  EXPECT_LT(Clock::now() - t0, 2s * kSlowdown);
  EXPECT_EQ(code, static_cast<int>(ExitCode::runtime_failure));
  ASSERT_TRUE(app.failure().has_value());
  EXPECT_EQ(app.failure()->kind, FailureKind::ping_failed);
  EXPECT_EQ(app.failure()->message, "connection lost");
  EXPECT_EQ(journal->get(), (std::vector<std::string>{"init db", "ping db", "close db"}));
}

TEST(AppRun, RunTwiceIsAStartupFailureAndDoesNothing) {
  Watchdog dog;
  Application app(quiet());
  EXPECT_EQ(app.run([](const Context&) {}), 0);
  EXPECT_EQ(app.run([](const Context&) { ADD_FAILURE() << "ran twice"; }),
            static_cast<int>(ExitCode::startup_failure));
  Application empty(quiet());
  EXPECT_EQ(empty.run(nullptr), static_cast<int>(ExitCode::startup_failure));
  EXPECT_EQ(empty.state(), AppState::off);
}

TEST(AppRun, ResourcesCloseInReverseDependencyOrderAndIndependentOnesInParallel) {
  Watchdog dog;
  auto journal = std::make_shared<Journal>();
  struct Slow final : Resource {
    Slow(std::shared_ptr<Journal> j, std::string n) : journal(std::move(j)), name(std::move(n)) {}
    void init(const ResourceCall&) override { journal->add("init " + name); }
    void close(const ResourceCall&) override {
      journal->add("close " + name);
      std::this_thread::sleep_for(100ms);
      journal->add("closed " + name);
    }
    std::shared_ptr<Journal> journal;
    std::string name;
  };
  Application app(quiet());
  app.add_resource(std::make_shared<Slow>(journal, "db"), {.name = "db"});
  app.add_resource(std::make_shared<Slow>(journal, "queue"), {.name = "queue"});
  app.add_resource(std::make_shared<Slow>(journal, "cache"),
                   {.name = "cache", .depends_on = {"db"}});
  const int code = app.run([&](const Context&) { journal->add("main"); });
  EXPECT_EQ(code, 0);
  const auto calls = journal->get();
  auto at = [&calls](const std::string& s) {
    return std::find(calls.begin(), calls.end(), s) - calls.begin();
  };
  EXPECT_LT(at("init db"), at("init queue"));
  EXPECT_LT(at("init queue"), at("init cache"));
  EXPECT_LT(at("main"), at("close cache"));
  // cache uses db: db starts closing only after cache has closed.
  EXPECT_LT(at("closed cache"), at("close db"));
  // queue depends on nothing: it closes alongside cache.
  EXPECT_LT(at("close queue"), at("closed cache"));
}

TEST(AppRun, HaltDuringInitAbandonsStartupWithoutRunningMain) {
  Watchdog dog;
  auto journal = std::make_shared<Journal>();
  struct WaitsForStop final : Resource {
    explicit WaitsForStop(std::shared_ptr<Journal> j) : journal(std::move(j)) {}
    void init(const ResourceCall& call) override {
      (void)wait_for_stop(call.stop_token);
      journal->add("init stopped");
      throw std::runtime_error("init interrupted");
    }
    void close(const ResourceCall&) override { journal->add("close slow"); }
    std::shared_ptr<Journal> journal;
  };
  Application app(quiet());
  app.add_resource(std::make_shared<Recorded>(journal, "db"), {.name = "db"});
  app.add_resource(std::make_shared<WaitsForStop>(journal), {.name = "slow"});
  std::thread halter([&app] {
    std::this_thread::sleep_for(50ms);
    app.halt();
  });
  const int code = app.run([&](const Context&) { journal->add("main"); });
  halter.join();
  EXPECT_EQ(code, 0);  // a halt is not a failure
  EXPECT_EQ(journal->get(), (std::vector<std::string>{"init db", "init stopped", "close db"}));
}

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

// A pool whose one worker runs a long task that waits for its own token (20 s
// at most) with one more task queued behind it: a drain would wait for the
// long task and run the queued one; a hard shutdown stops the first and
// rejects the second.
struct BusyPool {
  Pool pool{{.name = "busy",
             .max_workers = 1,
             .shutdown_mode = ShutdownMode::drain,
             .shutdown_timeout = 30s}};
  std::atomic<bool> long_started{false};
  std::atomic<bool> long_stopped{false};
  std::atomic<bool> queued_ran{false};

  void load() {
    ASSERT_EQ(pool.post([this](std::stop_token st) {
      long_started = true;
      long_stopped = wait_for_stop(st, 20s);
    }),
              Admission::accepted);
    ASSERT_EQ(pool.post([this] { queued_ran = true; }), Admission::accepted);
    ASSERT_TRUE(test::eventually([this] { return long_started.load(); }));
  }
  void expect_shut_down_hard() {
    EXPECT_TRUE(long_stopped.load());
    EXPECT_FALSE(queued_ran.load());
    EXPECT_EQ(pool.stats().outcomes.rejected, 1u);
    EXPECT_EQ(pool.state(), PoolState::stopped);
  }

  // The states the application went through (on_state_change, on the
  // controller's thread, read after run() returned).
  std::vector<AppState> states;
  // Quiet options that record the states, with a termination timeout that
  // would outlast the watchdog: a test passes only if the hard path skips
  // the halting state's wait.
  ApplicationOptions options(ApplicationOptions o = {}) {
    o.termination_timeout = 10min;
    o.on_state_change = [this](AppState s) { states.push_back(s); };
    return quiet(std::move(o));
  }
  // The hard path at once: no halting state, the failure, the pool hard.
  void expect_hard_path(const Application& app, int code, FailureKind kind,
                        const std::string& source, const std::string& message) {
    EXPECT_EQ(code, static_cast<int>(exit_code_of(kind)));
    EXPECT_EQ(states,
              (std::vector<AppState>{AppState::running, AppState::shutdown, AppState::off}));
    const auto f = app.failure();
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->kind, kind);
    EXPECT_EQ(f->source, source);
    EXPECT_EQ(f->message, message);
    expect_shut_down_hard();
  }
};

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

// on_ping_failure: a failed ping halts (the default, tested above) or stops
// at once. Main ignores the halt token and termination_timeout outlasts the
// watchdog, so only the hard path ends these in time.

// Its pings succeed until armed() (main arms it once its pool is loaded, so
// the hard stop cannot come before), then throw or hang.
struct PingsBadly final : Resource {
  enum class How : std::uint8_t { throws, hangs };
  explicit PingsBadly(How h) : how(h) {}
  void init(const ResourceCall&) override {}
  void ping(const ResourceCall& call) override {
    if (!armed->load()) return;
    if (how == How::throws) throw std::runtime_error("database gone");
    (void)wait_for_stop(call.stop_token);  // past ping_timeout
  }
  void close(const ResourceCall&) override {}
  How how;
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(false);
};

TEST(AppPingFailure, AResourceWhosePolicyIsShutdownNowTakesTheHardPathAtOnce) {
  Watchdog dog;
  BusyPool busy;
  Application app(busy.options({.ping_period = 10ms}));
  auto db = std::make_shared<PingsBadly>(PingsBadly::How::throws);
  app.add_resource(std::make_shared<Nop>(), {.name = "cache"});  // the default policy: halt
  app.add_resource(db, {.name = "db", .on_ping_failure = PingFailure::shutdown_now});
  app.add_pool(busy.pool);
  const auto t0 = Clock::now();
  const int code = app.run([&](const Context& ctx) {
    busy.load();
    *db->armed = true;
    (void)wait_for_stop(ctx.stop_token());
  });
  EXPECT_LT(Clock::now() - t0, 5s * kSlowdown);
  busy.expect_hard_path(app, code, FailureKind::ping_failed, "db", "database gone");
}

// The application's policy applies to a ping that times out too.
TEST(AppPingFailure, TheApplicationsPolicyCoversPingTimeouts) {
  Watchdog dog;
  BusyPool busy;
  Application app(busy.options(
      {.ping_period = 10ms, .ping_timeout = 50ms, .on_ping_failure = PingFailure::shutdown_now}));
  auto broker = std::make_shared<PingsBadly>(PingsBadly::How::hangs);
  app.add_resource(broker, {.name = "broker"});
  app.add_pool(busy.pool);
  const int code = app.run([&](const Context& ctx) {
    busy.load();
    *broker->armed = true;
    (void)wait_for_stop(ctx.stop_token());
  });
  busy.expect_hard_path(app, code, FailureKind::ping_timed_out, "broker",
                        "ping did not return within ping_timeout (50 ms)");
}

// A resource's own policy wins over the application's.
TEST(AppPingFailure, AResourcesHaltOverridesTheApplicationsShutdownNow) {
  Watchdog dog;
  std::vector<AppState> states;
  Application app(quiet({.ping_period = 10ms,
                         .on_ping_failure = PingFailure::shutdown_now,
                         .on_state_change = [&states](AppState s) { states.push_back(s); }}));
  auto sink = std::make_shared<PingsBadly>(PingsBadly::How::throws);
  *sink->armed = true;
  app.add_resource(sink, {.name = "metrics-sink", .on_ping_failure = PingFailure::halt});
  bool halted_before_cancel = false;
  const int code = app.run([&](const Context& ctx) {
    EXPECT_TRUE(wait_for_stop(ctx.halt_token()));
    halted_before_cancel = !ctx.stop_token().stop_requested();
  });
  EXPECT_EQ(code, static_cast<int>(ExitCode::runtime_failure));
  EXPECT_TRUE(halted_before_cancel);
  EXPECT_EQ(states, (std::vector<AppState>{AppState::running, AppState::halting, AppState::shutdown,
                                           AppState::off}));
}

TEST(AppContext, StopTokenIsACancellationSourceForPools) {
  Watchdog dog;
  Application app(quiet());
  // An unregistered pool that watches the context: it stops hard by itself.
  Pool pool({.name = "watcher", .max_workers = 1, .stop_token = app.context().stop_token()});
  const int code = app.run([](const Context&) {});
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(test::eventually([&pool] { return pool.state() == PoolState::stopped; }));
  EXPECT_EQ(pool.post([] {}), Admission::closed);
}

// Signals in this process: SIGUSR1 only, which gtest leaves alone.
TEST(AppSignals, HandlersAreRestoredAndNoForeignThreadMaskChanges) {
  Watchdog dog;
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGUSR1, nullptr, &before), 0);
  sigset_t caller_before;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &caller_before), 0);

  ApplicationOptions o = quiet();
  o.signals = {SIGUSR1};
  Application app(o);
  Application second(o);
  bool main_mask_blocks_usr1 = true;
  int second_code = -1;
  const int code = app.run([&](const Context& ctx) {
    sigset_t m;
    pthread_sigmask(SIG_SETMASK, nullptr, &m);
    main_mask_blocks_usr1 = sigismember(&m, SIGUSR1) == 1;
    // Only one Application may own signals at a time.
    second_code = second.run([](const Context&) {});
    kill(getpid(), SIGUSR1);
    (void)wait_for_stop(ctx.halt_token());
  });
  EXPECT_EQ(code, 0);
  EXPECT_FALSE(main_mask_blocks_usr1);
  EXPECT_EQ(second_code, static_cast<int>(ExitCode::startup_failure));
  ASSERT_TRUE(second.failure().has_value());
  EXPECT_EQ(second.failure()->source, "signals");

  struct sigaction after {};
  ASSERT_EQ(sigaction(SIGUSR1, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  sigset_t caller_after;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &caller_after), 0);
  for (int s = 1; s < NSIG; ++s) {
    EXPECT_EQ(sigismember(&caller_before, s), sigismember(&caller_after, s)) << s;
  }
}

// ---------------------------------------------------------------------------
// Child processes, real signals: one row per scenario of app_child. Each
// row says what the test does to the child (wait for a line, send a signal,
// pause), then what must hold once it has exited: the exit code (or the
// signal that ended it), events in order, events that must not appear,
// counts, and how long it took, from the last signal or from the start.
// Lines are awaited for 5 s at most, the exit for 5 s (times kSlowdown).

struct Step {
  enum class Kind : std::uint8_t { await_line, send, pause };
  Kind kind = Kind::await_line;
  std::string line{};  // await_line: a line containing this
  int signo = 0;       // send
  std::chrono::milliseconds pause_for{0};
};

Step await_line(std::string text) { return {Step::Kind::await_line, std::move(text)}; }
Step send(int signo) { return {Step::Kind::send, {}, signo}; }
Step pause(std::chrono::milliseconds d) { return {Step::Kind::pause, {}, 0, d}; }

// Time from `since` to the exit: at least `at_least` (when given), less than
// under + under_scaled * kSlowdown.
struct Took {
  enum class Since : std::uint8_t { last_signal, start };
  Since since = Since::last_signal;
  std::optional<std::chrono::milliseconds> at_least{};
  std::chrono::milliseconds under{0};
  std::chrono::milliseconds under_scaled{0};
};

struct ChildCase {
  std::string name;      // the test's name
  std::string scenario;  // app_child's argument
  std::vector<Step> steps{};
  ExitCode exit = ExitCode::ok;
  int killed_by = 0;  // when set: the child ends by this signal, not by exit
  std::vector<std::string> order{};
  std::vector<std::string> absent{};
  std::vector<std::pair<std::string, long>> counts{};
  std::vector<std::pair<std::string, std::string>> later{};  // .first comes after .second
  std::optional<Took> took{};
};

void PrintTo(const ChildCase& c, std::ostream* os) { *os << c.scenario; }

using Since = Took::Since;

// The clean path, on each default signal.
ChildCase clean(int signo, const std::string& signame) {
  return {
      .name = "SignalHaltsMainFinishesPoolDrainsResourcesCloseExitZero_" + signame,
      .scenario = "clean",
      .steps = {await_line("main start"), send(signo)},
      .order = {"init db", "init cache", "state running", "main start", "log received",
                "state halting", "halt token", "main halt seen", "main return", "state shutdown",
                "context cancelled", "task 1 done", "log pool work: drain", "close cache done",
                "close db", "state off", "exit 0"},
      .counts = {{"task 2 done", 1}},
      // Main hands over two 150 ms tasks; the pool drains them; closes take ~40 ms.
      .took = Took{.at_least = 150ms, .under_scaled = 1500ms},
  };
}

std::vector<ChildCase> child_cases() {
  return {
      clean(SIGTERM, "SIGTERM"),
      clean(SIGINT, "SIGINT"),
      clean(SIGHUP, "SIGHUP"),
      clean(SIGQUIT, "SIGQUIT"),
      {
          .name = "ConfiguredSignalsReplaceTheDefaults",
          .scenario = "usr1_only",
          .steps = {await_line("main start"), send(SIGUSR1)},
          .order = {"log received SIGUSR1", "state halting", "state off"},
      },
      {
          .name = "WithSignalHandlingOffTheDefaultActionApplies",
          .scenario = "signals_off",
          .steps = {await_line("main start"), send(SIGTERM)},
          .killed_by = SIGTERM,
          .absent = {"state halting"},
      },
      {
          .name = "TerminationTimeoutTakesTheHardPath",
          .scenario = "termination_timeout",
          .steps = {await_line("main start"), await_line("task 1 started"), send(SIGTERM)},
          .exit = ExitCode::termination_timeout,
          .order = {"state halting", "halt token", "log failure: termination_timeout",
                    "state shutdown", "context cancelled", "task 1 stopped", "log pool work: hard",
                    "close cache done", "close db done", "state off"},
          .absent = {"main halt seen"},
          .later = {{"main cancelled", "context cancelled"}},
          // 300 ms termination timeout, then a hard shutdown.
          .took = Took{.at_least = 300ms, .under = 300ms, .under_scaled = 1000ms},
      },
      {
          .name = "ASecondSignalForcesTheHardPathAtOnce",
          .scenario = "second_signal",  // termination_timeout 10 s
          // Running, not queued: the hard path would drop a queued task instead.
          .steps = {await_line("main start"), await_line("task 1 started"), send(SIGTERM),
                    await_line("halt token"), send(SIGINT)},
          .exit = ExitCode::forced,
          .order = {"log received SIGTERM", "state halting", "log received SIGINT again",
                    "log failure: forced", "state shutdown", "context cancelled", "task 1 stopped",
                    "close db done", "state off"},
          // main wakes from the context's stop token, and the context's own
          // stop callback runs on the cancelling thread: std::stop_source
          // orders neither before the other, so main's line only follows
          // the cancellation's start.
          .later = {{"main cancelled", "log cancelling the context"}},
          .took = Took{.under_scaled = 1000ms},
      },
      {
          // The drain has no bound here (pool and application); the second
          // signal is what ends it.
          .name = "ASecondSignalDuringTheDrainShutsThePoolsDownHard",
          .scenario = "second_signal_in_drain",
          // Main returns right after handing task 3 over; then the drain waits for it.
          .steps = {await_line("main start"), send(SIGTERM), await_line("task 3 started"),
                    pause(200ms), send(SIGTERM)},
          .exit = ExitCode::forced,
          .order = {"state halting", "main return", "state shutdown", "log received SIGTERM again",
                    "task 3 stopped", "state off"},
          .took = Took{.under_scaled = 1000ms},
      },
      {
          .name = "MainIgnoringBothTokensIsLeftBehindAfterTheShutdownTimeout",
          .scenario = "stuck_main",  // termination 200 ms, shutdown 300 ms
          .steps = {await_line("main start"), send(SIGTERM)},
          .exit = ExitCode::termination_timeout,
          .order = {"state halting", "state shutdown", "context cancelled", "close cache done",
                    "close db done", "state off", "exit 4"},
          .absent = {"main return"},
          .took = Took{.at_least = 500ms, .under = 500ms, .under_scaled = 1000ms},
      },
      {
          .name = "ShutdownNowTakesTheHardPathAtOnceWithExitCode7",
          .scenario = "shutdown_now",  // termination_timeout 10 s: not waited for
          .steps = {await_line("task 1 started")},
          .exit = ExitCode::hard_stop,
          .order = {"main start", "task 1 started", "main shutdown_now",
                    "log failure: hard_stop in main: corrupted state", "state shutdown",
                    "context cancelled", "task 1 stopped", "log pool work: hard",
                    "close cache done", "close db done", "state off", "exit 7"},
          .absent = {"state halting"},
          .later = {{"main cancelled", "log cancelling the context"}},
          .took = Took{.since = Since::start, .at_least = 100ms, .under_scaled = 2000ms},
      },
      {
          .name = "ResourceInitFailureStopsStartupAndClosesWhatWasInitialized",
          .scenario = "init_failure",
          .exit = ExitCode::startup_failure,
          .order = {"init db done", "init cache", "log failure: init_failed in cache",
                    "state shutdown", "context cancelled", "close db done", "state off"},
          .absent = {"state running", "main start", "close cache"},
          .took = Took{.since = Since::start, .under_scaled = 2000ms},
      },
      {
          .name = "InitTimeoutStopsStartupWithoutWaitingForTheHungInit",
          .scenario = "init_timeout",  // 300 ms; cache init hangs 3 s
          .exit = ExitCode::startup_failure,
          .order = {"init db done", "init cache", "log failure: init_timed_out in cache",
                    "state shutdown", "close db done", "state off"},
          .absent = {"main start", "init cache done"},
          .took =
              Took{
                  .since = Since::start, .at_least = 300ms, .under = 300ms, .under_scaled = 1500ms},
      },
      {
          .name = "SignalDuringInitAbandonsStartupAndExitsZero",
          .scenario = "halt_during_init",  // cache init waits for its token
          .steps = {await_line("init cache"), send(SIGTERM)},
          .order = {"init cache", "log received SIGTERM", "state shutdown", "close db done",
                    "state off"},
          .absent = {"main start", "close cache"},
          .took = Took{.under_scaled = 1000ms},
      },
      {
          .name = "PingFailureIsFatalAndHalts",
          .scenario = "ping_failure",  // every 50 ms; the third db ping throws
          .exit = ExitCode::runtime_failure,
          .order = {"main start", "ping db", "log failure: ping_failed in db", "state halting",
                    "main halt seen", "main return", "state shutdown", "context cancelled",
                    "close cache done", "close db done", "state off"},
          .counts = {{"ping db", 3}},
          .took = Took{.since = Since::start, .at_least = 150ms, .under_scaled = 2000ms},
      },
      {
          .name = "PingFailureWithShutdownNowTakesTheHardPathAtOnce",
          // Every 50 ms; the third db ping throws; db's on_ping_failure is
          // shutdown_now; main ignores the halt (termination_timeout 3 s).
          .scenario = "ping_failure_shutdown_now",
          .exit = ExitCode::runtime_failure,
          .order = {"main start", "task 1 started",
                    "log ping of db failed and its on_ping_failure is shutdown_now",
                    "log failure: ping_failed in db", "state shutdown", "context cancelled",
                    "task 1 stopped", "log pool work: hard", "close cache done", "close db done",
                    "state off", "exit 1"},
          .absent = {"state halting"},
          .counts = {{"ping db", 3}},
          .took = Took{.since = Since::start, .at_least = 150ms, .under_scaled = 2000ms},
      },
      {
          .name = "PingTimeoutIsFatalAndHalts",
          .scenario = "ping_timeout",  // every 50 ms; the third hangs; timeout 100 ms
          .exit = ExitCode::runtime_failure,
          .order = {"main start", "log failure: ping_timed_out in db", "state halting",
                    "main return", "close db done", "state off"},
          .took = Took{.since = Since::start, .at_least = 250ms, .under_scaled = 2000ms},
      },
      {
          .name = "CloseTimeoutIsAShutdownFailureAndDoesNotHoldTheExit",
          .scenario = "close_timeout",  // db close hangs 3 s; shutdown_timeout 300 ms
          .steps = {await_line("main start"), send(SIGTERM)},
          .exit = ExitCode::shutdown_failure,
          .order = {"main return", "context cancelled", "close cache done", "close db",
                    "log failure: close_timed_out in db", "state off"},
          .absent = {"close db done"},
          .took = Took{.at_least = 300ms, .under = 300ms, .under_scaled = 1500ms},
      },
      {
          .name = "ExceptionInMainIsARuntimeFailure",
          .scenario = "main_throws",
          .exit = ExitCode::runtime_failure,
          .order = {"main start", "main throw", "log failure: main_threw in main: main gave up",
                    "state shutdown", "context cancelled", "close cache done", "close db done",
                    "state off"},
          .took = Took{.since = Since::start, .under_scaled = 2000ms},
      },
      {
          .name = "ExceptionInMainWhileHaltingIsARuntimeFailure",
          .scenario = "throw_on_halt",
          .steps = {await_line("main start"), send(SIGTERM)},
          .exit = ExitCode::runtime_failure,
          .order = {"state halting", "main throw", "log failure: main_threw", "state shutdown",
                    "close db done", "state off"},
          .took = Took{.under_scaled = 1000ms},
      },
  };
}

class AppChild : public ::testing::TestWithParam<ChildCase> {};

TEST_P(AppChild, Scenario) {
  const ChildCase& c = GetParam();
  Watchdog dog;
  auto child = start_child(c.scenario);
  for (const Step& step : c.steps) {
    switch (step.kind) {
      case Step::Kind::await_line:
        ASSERT_TRUE(child->wait_for_line(step.line, 5000ms));
        break;
      case Step::Kind::send:
        child->signal(step.signo);
        break;
      case Step::Kind::pause:
        std::this_thread::sleep_for(step.pause_for);
        break;
    }
  }
  const int status = child->wait_exit(5000ms);
  const auto ev = events(*child);
  if (c.killed_by != 0) {
    ASSERT_TRUE(WIFSIGNALED(status)) << child->output();
    EXPECT_EQ(WTERMSIG(status), c.killed_by);
  } else {
    EXPECT_EQ(exit_code(status), static_cast<int>(c.exit)) << child->output();
  }
  expect_order(ev, c.order, child->output());
  for (const auto& e : c.absent) {
    EXPECT_EQ(find(ev, e), -1) << "'" << e << "' in:\n" << child->output();
  }
  for (const auto& [e, n] : c.counts) {
    EXPECT_EQ(count(ev, e), n) << "'" << e << "' in:\n" << child->output();
  }
  for (const auto& [after, before] : c.later) {
    EXPECT_GT(find(ev, after), find(ev, before))
        << "'" << after << "' before '" << before << "' in:\n"
        << child->output();
  }
  if (c.took) {
    const Took& t = *c.took;
    const auto took = t.since == Since::start ? child->lifetime() : child->since_signal();
    if (t.at_least) {
      EXPECT_GE(took, *t.at_least) << child->output();
    }
    EXPECT_LT(took, t.under + t.under_scaled * kSlowdown) << child->output();
  }
}

INSTANTIATE_TEST_SUITE_P(Lifecycle, AppChild, ::testing::ValuesIn(child_cases()),
                         [](const ::testing::TestParamInfo<ChildCase>& p) { return p.param.name; });

// ---------------------------------------------------------------------------
// The graceful_consumer example: SIGTERM at a random moment loses nothing
// (each event's coroutine task waits 1 s for the example's loopback service).

TEST(GracefulConsumer, EveryAcceptedEventHasExactlyOneOutcomeLine) {
#ifndef CREW_GRACEFUL_CONSUMER
  GTEST_SKIP() << "examples are not built (CREW_BUILD_EXAMPLES=OFF)";
#else
  Watchdog dog(std::chrono::seconds(60));
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> delay_ms(50, 700);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    char path[] = "/tmp/crew-consumer-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    // Its log too: the stop sequence's fsync time is read from it below.
    Child child({CREW_GRACEFUL_CONSUMER, "--out", path}, Child::Output::merged);
    ASSERT_TRUE(child.wait_for_line("consuming", 5000ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    child.signal(SIGTERM);
    const int status = child.wait_exit(10000ms);
    EXPECT_EQ(exit_code(status), 0) << child.output();
    // Its last line on stdout; the log may interleave.
    const auto& lines = child.lines();
    const auto summary = std::find_if(lines.rbegin(), lines.rend(), [](const std::string& l) {
      return l.starts_with("accepted ");
    });
    ASSERT_NE(summary, lines.rend()) << child.output();
    unsigned long accepted = 0;
    unsigned long written = 0;
    int in_flight_max = 0;
    ASSERT_EQ(std::sscanf(summary->c_str(), "accepted %lu written %lu in_flight_max %d", &accepted,
                          &written, &in_flight_max),
              3)
        << child.output();
    EXPECT_EQ(accepted, written);
    EXPECT_GT(accepted, 0u);
    // Each event's task waits 1 s for the loopback service without a
    // thread: the 4 workers keep more calls than that in flight (events
    // come every 5 ms, so those of the first second overlap).
    if (accepted > 4) EXPECT_GT(in_flight_max, 4) << child.output();

    std::ifstream in(path);
    std::map<unsigned long, int> outcomes;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      unsigned long id = 0;
      std::string outcome;
      ASSERT_TRUE(fields >> id >> outcome) << "bad line '" << line << "'";
      EXPECT_TRUE(outcome == "ok" || outcome == "failed") << line;
      ++outcomes[id];
    }
    std::remove(path);
    // Events are numbered from 1 and the producer stops at the first one
    // refused, so the accepted ones are exactly 1..accepted.
    EXPECT_EQ(outcomes.size(), accepted);
    for (unsigned long id = 1; id <= accepted; ++id) {
      EXPECT_EQ(outcomes[id], 1) << "event " << id;
    }
    // Prompt: the signal to the exit within 2 s, not counting the fsync
    // that closing the outcome file does (the disk's time, seconds when a
    // build shares it: "resource outcome-file closed in 2029 ms", a line of
    // the log, which is why the pipe carries stderr too).
    const std::string out = child.output();
    const std::string closed = "resource outcome-file closed in ";
    const auto at = out.find(closed);
    ASSERT_NE(at, std::string::npos) << out;
    const std::chrono::milliseconds fsync(std::atol(out.c_str() + at + closed.size()));
    EXPECT_LT(child.since_signal() - fsync, 2000ms * kSlowdown) << out;
  }
#endif
}

}  // namespace
}  // namespace crew
