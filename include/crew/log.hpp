// crew/log.hpp: the library's logging interface.
//
// crew logs a few things a service operator must see: exceptions of tasks
// nobody holds a handle to (when there is no on_exception handler), worker
// replacement and abandonment, and shutdown summaries. It logs through a
// Logger: install one with PoolOptions::logger (crew/spdlog_logger.hpp has an
// adapter for spdlog), or let the default write one line per message to
// stderr.
//
// Loggers are called from any thread, concurrently, sometimes with pool locks
// held: they must be thread-safe and noexcept, and must not call the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace crew {

enum class LogLevel : std::uint8_t { debug, info, warning, error };

[[nodiscard]] std::string_view to_string(LogLevel level) noexcept;

// What a log line is about. `task` is empty when the line is about the pool
// or a worker, or the task has no name.
struct LogContext {
  std::string_view pool{};
  std::string_view task{};
  std::uint64_t task_id = 0;
  std::uint64_t worker_id = 0;
  std::string_view correlation_id{};  // the task's TaskOptions::correlation_id
};

// Appends what follows the pool in a crew log line:
// "[ task=<name>#<id>][ correlation_id=<id>][ worker=<id>]: <message>". Shared by the stderr logger
// and adapters (crew/spdlog_logger.hpp) so that lines read alike everywhere.
void append_log_tail(std::string& line, const LogContext& context, std::string_view message);

class Logger {
 public:
  Logger() = default;
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;
  virtual ~Logger() = default;

  // Messages below this level are not formatted or sent.
  [[nodiscard]] virtual LogLevel level() const noexcept { return LogLevel::info; }
  virtual void log(LogLevel level, const LogContext& context,
                   std::string_view message) noexcept = 0;
};

// Writes "crew <level> pool=<pool> [task=<name>#<id>] [correlation_id=<id>]
// [worker=<id>]: <message>"
// lines to stderr, one write per line.
class StderrLogger final : public Logger {
 public:
  explicit StderrLogger(LogLevel min_level = LogLevel::info) noexcept : level_(min_level) {}
  [[nodiscard]] LogLevel level() const noexcept override { return level_; }
  void log(LogLevel level, const LogContext& context, std::string_view message) noexcept override;

 private:
  LogLevel level_;
};

// The logger pools (and applications) use when their options' logger is
// empty: a StderrLogger of warnings and errors only, so that a program that
// uses crew writes nothing to stderr while all goes well. Info lines (a
// shutdown's summary, an application's state changes) go to a logger the
// user installs, such as StderrLogger(LogLevel::info).
[[nodiscard]] std::shared_ptr<Logger> default_logger();

}  // namespace crew
