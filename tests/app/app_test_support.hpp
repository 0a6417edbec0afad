// tests/app/app_test_support.hpp: what the Application tests share: a
// bounded wait for a stop token, options with signal handling off (gtest's
// process is not ours to take SIGINT from) and a silent logger, resources
// that record their calls in a journal, and a pool kept busy to tell a
// drain from a hard shutdown.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "crew/application.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew::test {

using namespace std::chrono_literals;

// Blocks until the token is stopped or the limit passes; true if stopped.
inline bool wait_for_stop(std::stop_token token, std::chrono::milliseconds limit = 10s) {
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
inline ApplicationOptions quiet(ApplicationOptions o = {}) {
  o.signals = {};
  o.logger = std::make_shared<NullLogger>();
  return o;
}

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

}  // namespace crew::test
