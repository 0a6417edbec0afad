// Tests of the spdlog adapter: level mapping, the fields of each line, and a
// pool logging through it.
#include "crew/spdlog_logger.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Watchdog;

// An spdlog logger writing "<level>|<message>" lines into `out`.
std::shared_ptr<spdlog::logger> capturing(std::ostringstream& out,
                                          spdlog::level::level_enum level = spdlog::level::trace) {
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = std::make_shared<spdlog::logger>("crew-test", std::move(sink));
  logger->set_pattern("%l|%v");
  logger->set_level(level);
  return logger;
}

TEST(SpdlogLogger, WritesTheContextFieldsAtTheMatchingLevel) {
  std::ostringstream out;
  SpdlogLogger logger(capturing(out));
  logger.log(LogLevel::warning, {.pool = "p", .task = "t", .task_id = 7, .worker_id = 2}, "hello");
  logger.log(LogLevel::info, {.pool = "p"}, "plain");
  logger.log(LogLevel::debug, {.pool = "p", .worker_id = 3}, "dbg");
  logger.log(LogLevel::error, {.pool = "p", .task_id = 9}, "unnamed task");
  EXPECT_EQ(out.str(),
            "warning|pool=p task=t#7 worker=2: hello\n"
            "info|pool=p: plain\n"
            "debug|pool=p worker=3: dbg\n"
            "error|pool=p task=#9: unnamed task\n");
}

TEST(SpdlogLogger, LevelFollowsTheSpdlogLogger) {
  std::ostringstream out;
  auto sp = capturing(out, spdlog::level::warn);
  SpdlogLogger logger(sp);
  EXPECT_EQ(logger.level(), LogLevel::warning);
  logger.log(LogLevel::info, {.pool = "p"}, "dropped");
  EXPECT_EQ(out.str(), "");
  sp->set_level(spdlog::level::trace);
  EXPECT_EQ(logger.level(), LogLevel::debug);
  sp->set_level(spdlog::level::critical);
  EXPECT_EQ(logger.level(), LogLevel::error);
  sp->set_level(spdlog::level::off);
  EXPECT_EQ(logger.level(), LogLevel::error);
  logger.log(LogLevel::error, {.pool = "p"}, "dropped too");
  EXPECT_EQ(out.str(), "");
}

TEST(SpdlogLogger, APoolLogsTaskExceptionsAndShutdownsThroughIt) {
  Watchdog dog;
  std::ostringstream out;
  {
    Pool pool({.name = "logpool", .logger = std::make_shared<SpdlogLogger>(capturing(out))});
    ASSERT_EQ(pool.post([] { throw std::runtime_error("kaboom"); }, {.name = "importer"}),
              Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  const std::string text = out.str();
  EXPECT_NE(text.find("error|pool=logpool task=importer#"), std::string::npos) << text;
  EXPECT_NE(text.find("task threw: kaboom"), std::string::npos) << text;
  EXPECT_NE(text.find("info|pool=logpool: shutdown drain finished"), std::string::npos) << text;
}

}  // namespace
}  // namespace crew
