#include "crew/log.hpp"

#include <unistd.h>

#include <string>

namespace crew {

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warning:
      return "warning";
    case LogLevel::error:
      return "error";
  }
  return "unknown";
}

void append_log_tail(std::string& line, const LogContext& context, std::string_view message) {
  if (!context.task.empty() || context.task_id != 0) {
    line += " task=";
    line += context.task;
    line += '#';
    line += std::to_string(context.task_id);
  }
  if (!context.correlation_id.empty()) {
    line += " correlation_id=";
    line += context.correlation_id;
  }
  if (context.worker_id != 0) {
    line += " worker=";
    line += std::to_string(context.worker_id);
  }
  line += ": ";
  line += message;
}

void StderrLogger::log(LogLevel level, const LogContext& context,
                       std::string_view message) noexcept {
  try {
    std::string line = "crew ";
    line += to_string(level);
    if (!context.pool.empty()) {
      line += " pool=";
      line += context.pool;
    }
    append_log_tail(line, context, message);
    line += '\n';
    // One write: lines from several threads do not interleave.
    (void)::write(STDERR_FILENO, line.data(), line.size());
  } catch (...) {  // out of memory while formatting: drop the line
  }
}

std::shared_ptr<Logger> default_logger() {
  static const std::shared_ptr<Logger> logger = std::make_shared<StderrLogger>(LogLevel::warning);
  return logger;
}

}  // namespace crew
