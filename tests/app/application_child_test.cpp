// Tests of the Application's signal paths: handlers installed and restored
// in this process (SIGUSR1 only, which gtest leaves alone), and every other
// signal path in a child process (tests/app/app_child, or the
// graceful_consumer example): the test forks and execs it, sends real
// signals, reads the calls it reports, and checks the exit code, the order
// of the calls and the time taken (tests/support/child_process.hpp; one
// table row per scenario). A child that overruns its bound is killed and
// the test fails. The signal pipe on its own is tested in signals_test.
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
using test::Child;
using test::count;
using test::events;
using test::exit_code;
using test::expect_order;
using test::find;
using test::kSlowdown;
using test::quiet;
using test::wait_for_stop;
using test::Watchdog;

std::unique_ptr<Child> start_child(const std::string& scenario) {
  return std::make_unique<Child>(
      std::vector<std::string>{test::beside_this_test(CREW_APP_CHILD), scenario});
}

// ---------------------------------------------------------------------------
// States, codes, options.

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
    Child child({test::beside_this_test(CREW_GRACEFUL_CONSUMER), "--out", path},
                Child::Output::merged);
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
    if (accepted > 4) {
      EXPECT_GT(in_flight_max, 4) << child.output();
    }

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
