// service/logging.hpp: crewd's log. One spdlog logger writes every line to
// stderr (where container runtimes collect it); CrewLog passes the lines of
// crew's pools and Application to it, prefixed with what they are about.
#pragma once

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <crew/log.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace crewd {

[[nodiscard]] constexpr spdlog::level::level_enum to_spdlog(crew::LogLevel level) noexcept {
  switch (level) {
    case crew::LogLevel::debug:
      return spdlog::level::debug;
    case crew::LogLevel::info:
      return spdlog::level::info;
    case crew::LogLevel::warning:
      return spdlog::level::warn;
    case crew::LogLevel::error:
      return spdlog::level::err;
  }
  return spdlog::level::err;
}

// "2026-11-23T05:36:52.398 info <message>", flushed per line.
[[nodiscard]] inline std::shared_ptr<spdlog::logger> make_logger(crew::LogLevel level) {
  auto log =
      std::make_shared<spdlog::logger>("crewd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  log->set_level(to_spdlog(level));
  log->flush_on(spdlog::level::trace);  // a line must not wait in a buffer for a crash
  return log;
}

// crew's lines as "pool compute [task factorial#12] [worker 3]: <message>",
// or the message alone for the Application's (which names itself).
// Thread-safe: the logger's sink is.
class CrewLog final : public crew::Logger {
 public:
  CrewLog(std::shared_ptr<spdlog::logger> log, crew::LogLevel level) noexcept
      : log_(std::move(log)), level_(level) {}

  [[nodiscard]] crew::LogLevel level() const noexcept override { return level_; }

  void log(crew::LogLevel level, const crew::LogContext& ctx,
           std::string_view message) noexcept override {
    try {
      std::string line;
      if (!ctx.pool.empty()) {
        line = "pool " + std::string(ctx.pool);
        if (!ctx.task.empty() || ctx.task_id != 0) {
          line += " task " + std::string(ctx.task) + "#" + std::to_string(ctx.task_id);
        }
        if (ctx.worker_id != 0) line += " worker " + std::to_string(ctx.worker_id);
        line += ": ";
      }
      line += message;
      log_->log(to_spdlog(level), spdlog::string_view_t(line.data(), line.size()));
    } catch (...) {  // out of memory while formatting: drop the line
    }
  }

 private:
  std::shared_ptr<spdlog::logger> log_;
  crew::LogLevel level_;
};

}  // namespace crewd
