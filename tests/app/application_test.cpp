// Tests of the Application lifecycle in this process: options, states,
// the context, failures, resources and pings (with signal handling off).
// Its pools and the hard path: application_pools_test.cpp; the signal
// paths, in child processes: application_child_test.cpp.
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

#include "app_test_support.hpp"
#include "child_process.hpp"
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

}  // namespace
}  // namespace crew
