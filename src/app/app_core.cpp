// AppCore: the failure record, halt requests and signals as they change the
// shared state (src/app/app_core.hpp), and the helpers of the application's
// units.
#include "app_core.hpp"

#include <string>

#include "signals.hpp"

namespace crew::detail {

long long ms_since(Clock::time_point t) noexcept {
  return static_cast<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

long long ms_of(std::chrono::nanoseconds d) noexcept {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

bool wait_or_timeout(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                     Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) {
    cv.wait(lock);
    return true;
  }
  return cv.wait_until(lock, deadline) == std::cv_status::no_timeout || Clock::now() < deadline;
}

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

AppCore::AppCore(ApplicationOptions o)
    : opts(std::move(o)),
      logger(opts.logger ? opts.logger : default_logger()),
      prefix("application " + opts.name + ": ") {}

void AppCore::log(LogLevel level, std::string_view message) const noexcept {
  if (level < logger->level()) return;
  try {
    logger->log(level, LogContext{}, prefix + std::string(message));
  } catch (...) {  // out of memory while formatting: drop the line
  }
}

void AppCore::notify() noexcept {
  { MutexLock lock(mu); }
  changed.notify_all();
}

void AppCore::record(Failure f, bool at_once) noexcept {
  bool first = false;
  try {
    MutexLock lock(mu);
    if (!failure) {
      failure = f;
      first = true;
    }
  } catch (...) {  // out of memory copying the message: the halt still happens
  }
  try {
    log(first ? LogLevel::error : LogLevel::warning,
        std::string(first ? "failure" : "later failure (logged only)") + ": " +
            std::string(to_string(f.kind)) + " in " + f.source + ": " + f.message);
  } catch (...) {
  }
  {
    MutexLock lock(mu);
    halt_requested = true;
    if (at_once) stop_now = true;
  }
  changed.notify_all();
}

void AppCore::shutdown_now(std::string_view source, std::string_view reason) noexcept {
  try {
    record({FailureKind::hard_stop, std::string(source), std::string(reason), nullptr},
           /*at_once=*/true);
  } catch (...) {  // out of memory copying the strings: stop at once all the same
    {
      MutexLock lock(mu);
      halt_requested = true;
      stop_now = true;
    }
    changed.notify_all();
  }
}

void AppCore::request_halt() noexcept {
  bool first = false;
  {
    MutexLock lock(mu);
    first = !halt_requested;
    halt_requested = true;
  }
  changed.notify_all();
  if (first) log(LogLevel::info, "halt requested");
}

void AppCore::on_signal(int signo) {
  int count = 0;
  {
    MutexLock lock(mu);
    count = ++signals_received;
  }
  const AppState st = state.load();
  if (count == 1) {
    log(LogLevel::info, "received " + signal_name(signo) + ": halting");
  } else if (st == AppState::shutdown || st == AppState::off) {
    // Pools still shutting down go hard; a wait for a main that ignores
    // the cancellation is cut short. Closes are bounded already.
    log(LogLevel::warning, "received " + signal_name(signo) +
                               " again during shutdown: pools go hard, main is no longer "
                               "waited for");
  } else {
    log(LogLevel::warning, "received " + signal_name(signo) + " again: forcing the hard path");
  }
  {
    MutexLock lock(mu);
    if (count == 1) {
      halt_requested = true;
    } else {
      forced = true;
    }
  }
  changed.notify_all();
}

ExitCode AppCore::exit_code() const {
  MutexLock lock(mu);
  return failure ? exit_code_of(failure->kind) : ExitCode::ok;
}

}  // namespace crew::detail
