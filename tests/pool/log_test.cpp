// Tests of what the pool logs: exceptions nobody else sees, worker
// replacement and abandonment, shutdown summaries.
#include "crew/log.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <vector>

#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;

class CapturingLogger final : public Logger {
 public:
  explicit CapturingLogger(LogLevel min = LogLevel::debug) : min_(min) {}
  LogLevel level() const noexcept override { return min_; }
  void log(LogLevel level, const LogContext& ctx, std::string_view message) noexcept override {
    const std::lock_guard lock(mu_);
    lines_.push_back(std::string(to_string(level)) + "|" + std::string(ctx.pool) + "|" +
                     std::string(ctx.task) + "|" + std::string(message));
    if (!ctx.correlation_id.empty()) lines_.back() += "|" + std::string(ctx.correlation_id);
  }
  bool has(std::string_view needle) {
    const std::lock_guard lock(mu_);
    return std::any_of(lines_.begin(), lines_.end(),
                       [&](const std::string& l) { return l.find(needle) != std::string::npos; });
  }
  std::size_t size() {
    const std::lock_guard lock(mu_);
    return lines_.size();
  }

 private:
  LogLevel min_;
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST(Logging, ATaskExceptionWithoutAHandlerIsLoggedWithItsName) {
  Watchdog dog;
  auto logger = std::make_shared<CapturingLogger>();
  {
    Pool pool({.name = "logpool", .logger = logger});
    ASSERT_EQ(pool.post([] { throw std::runtime_error("kaboom"); }, {.name = "importer"}),
              Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  EXPECT_TRUE(logger->has("error|logpool|importer|task threw: kaboom"));
}

TEST(Logging, ReplacementAbandonmentAndShutdownAreLogged) {
  Watchdog dog;
  auto logger = std::make_shared<CapturingLogger>();
  auto gate = std::make_shared<Gate>();
  {
    Pool pool({.name = "ops", .max_workers = 1, .abandon_grace = 10ms, .logger = logger});
    auto hung = pool.submit([gate](std::stop_token) { gate->wait(); },
                            {.name = "stubborn", .timeout = 5ms});
    ASSERT_TRUE(eventually([&] { return pool.stats().abandoned == 1; }));
    EXPECT_EQ(pool.submit([] { return 1; }).get(), 1);
    (void)pool.shutdown(ShutdownMode::soft, 0s);
  }
  gate->open();
  EXPECT_TRUE(logger->has("warning|ops|stubborn|task abandoned"));
  EXPECT_TRUE(logger->has("info|ops||shutdown soft finished"));
}

TEST(Logging, MessagesBelowTheLoggersLevelAreNotSent) {
  Watchdog dog;
  auto logger = std::make_shared<CapturingLogger>(LogLevel::error);
  { Pool pool({.logger = logger}); }  // the shutdown summary is info
  EXPECT_EQ(logger->size(), 0u);
}

TEST(Logging, AStderrLoggerWritesOneLineToStderr) {
  testing::internal::CaptureStderr();
  StderrLogger logger;
  logger.log(LogLevel::warning, {.pool = "p", .task = "t", .task_id = 7, .worker_id = 2}, "hello");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "crew warning pool=p task=t#7 worker=2: hello\n");
  testing::internal::CaptureStderr();
  logger.log(LogLevel::warning,
             {.pool = "p", .task = "t", .task_id = 7, .worker_id = 2, .correlation_id = "req-1"},
             "hello");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "crew warning pool=p task=t#7 correlation_id=req-1 worker=2: hello\n");
}

TEST(Logging, ALineAboutATaskCarriesItsCorrelationId) {
  Watchdog dog;
  auto logger = std::make_shared<CapturingLogger>();
  auto gate = std::make_shared<Gate>();
  {
    Pool pool({.name = "ids", .max_workers = 1, .abandon_grace = 10ms, .logger = logger});
    ASSERT_EQ(pool.post([] { throw std::runtime_error("kaboom"); },
                        {.name = "importer", .correlation_id = "req-9"}),
              Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
    auto hung = pool.submit([gate](std::stop_token) { gate->wait(); },
                            {.name = "stubborn", .timeout = 5ms, .correlation_id = "req-10"});
    ASSERT_TRUE(eventually([&] { return pool.stats().abandoned == 1; }));
  }
  gate->open();
  EXPECT_TRUE(logger->has("error|ids|importer|task threw: kaboom|req-9"));
  EXPECT_TRUE(logger->has("|req-10"));
}

// Quiet by default: a program that creates, uses and shuts down a default
// pool (a task failing with a handle to report it, a drain at the end)
// writes nothing to stderr; a warning still reaches it.
TEST(Logging, ADefaultPoolWritesNothingToStderrWhileAllGoesWell) {
  Watchdog dog;
  EXPECT_EQ(default_logger()->level(), LogLevel::warning);
  testing::internal::CaptureStderr();
  {
    Pool pool;
    auto t = pool.submit([] { return 1; });
    EXPECT_EQ(t.get(), 1);
    auto bad = pool.submit([]() -> int { throw std::runtime_error("seen by get()"); });
    EXPECT_THROW((void)bad.get(), std::runtime_error);
    (void)pool.shutdown();
    Pool second({.name = "second"});
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  default_logger()->log(LogLevel::warning, {.pool = "p"}, "still shown");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "crew warning pool=p: still shown\n");
}

}  // namespace
}  // namespace crew
