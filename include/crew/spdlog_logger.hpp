// crew/spdlog_logger.hpp: a crew::Logger that writes to an spdlog::logger.
// Header-only; link the target crew::spdlog (built when spdlog is found),
// which brings spdlog::spdlog.
//
//   auto logger = std::make_shared<crew::SpdlogLogger>(spdlog::stderr_color_mt("crew"));
//   crew::Pool pool({.name = "compute", .logger = logger});
//
// Each message becomes one spdlog record at the matching level (debug,
// info, warn, err) reading "pool=<pool> [task=<name>#<id>] [worker=<id>]:
// <message>", the same fields as crew::StderrLogger's lines.
//
// Thread safety: log() is as thread-safe as the spdlog logger it writes to,
// and pools call it from many threads: give it a thread-safe (_mt) logger.
// The adapter keeps the spdlog logger alive.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "crew/log.hpp"

namespace crew {

class SpdlogLogger final : public Logger {
 public:
  // `logger` must not be null.
  explicit SpdlogLogger(std::shared_ptr<spdlog::logger> logger) noexcept
      : logger_(std::move(logger)) {}

  // The spdlog logger's level now. Pools read this once, when they are
  // built, and skip formatting below it; spdlog filters again on each call,
  // so a level raised later still takes effect.
  [[nodiscard]] LogLevel level() const noexcept override { return from_spdlog(logger_->level()); }

  void log(LogLevel level, const LogContext& context, std::string_view message) noexcept override {
    try {
      const spdlog::level::level_enum to = to_spdlog(level);
      if (!logger_->should_log(to)) return;
      std::string line = "pool=";
      line += context.pool;
      append_log_tail(line, context, message);
      logger_->log(to, spdlog::string_view_t(line.data(), line.size()));
    } catch (...) {  // out of memory while formatting: drop the line
    }
  }

  [[nodiscard]] const std::shared_ptr<spdlog::logger>& logger() const noexcept { return logger_; }

  [[nodiscard]] static constexpr spdlog::level::level_enum to_spdlog(LogLevel level) noexcept {
    switch (level) {
      case LogLevel::debug:
        return spdlog::level::debug;
      case LogLevel::info:
        return spdlog::level::info;
      case LogLevel::warning:
        return spdlog::level::warn;
      case LogLevel::error:
        return spdlog::level::err;
    }
    return spdlog::level::err;
  }

  // spdlog's trace maps to debug; critical and off to error (spdlog then
  // drops what it must).
  [[nodiscard]] static constexpr LogLevel from_spdlog(spdlog::level::level_enum level) noexcept {
    switch (level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        return LogLevel::debug;
      case spdlog::level::info:
        return LogLevel::info;
      case spdlog::level::warn:
        return LogLevel::warning;
      default:
        return LogLevel::error;
    }
  }

 private:
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace crew
