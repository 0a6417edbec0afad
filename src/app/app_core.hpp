// src/app/app_core.hpp (private): the state an Application's threads share, and
// the small helpers its units use (deadlines, waits, messages).
//
// AppCore is owned jointly (shared_ptr) by the Application, every Context,
// and every thread the application starts, so a thread left behind (a main
// that ignores its tokens, a resource call past its deadline) never touches
// freed memory. Who touches what:
//   opts, logger, prefix   const; any thread
//   resources, pools       the registering thread before run(); read-only
//                          once `started` is set
//   state                  written by the controller (src/app/app_controller.cpp);
//                          read by any thread
//   halt_source            stopped by the controller; cancel_source likewise
//   the fields under mu    failure, halt_requested, stop_now: any thread
//                          (record(), request_halt(), on_signal()); forced and
//                          signals_received: the signal reader
//                          (on_signal()); main_done: main's thread (the
//                          controller when main cannot start); keeper_stop:
//                          the controller. Every change notifies `changed`,
//                          on which the controller and the keeper wait (at
//                          most two waiters, so every event notifies all).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crew/application.hpp"
#include "crew/detail/deadline.hpp"
#include "crew/detail/mutex.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/log.hpp"

namespace crew {

class Pool;

namespace detail {

using Clock = std::chrono::steady_clock;

// t + d, saturating at time_point::max() (no deadline).
[[nodiscard]] inline Clock::time_point after(Clock::time_point t,
                                             std::chrono::nanoseconds d) noexcept {
  return saturating_deadline(t, d);
}
[[nodiscard]] long long ms_since(Clock::time_point t) noexcept;
[[nodiscard]] long long ms_of(std::chrono::nanoseconds d) noexcept;

// Waits on `cv` until notified or the deadline (time_point::max(): none).
// Returns false once the deadline has passed.
bool wait_or_timeout(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                     Clock::time_point deadline);

// what() of the exception, or "unknown exception".
[[nodiscard]] std::string describe(const std::exception_ptr& e);

// A registered resource.
struct AppResource {
  std::shared_ptr<Resource> resource;
  std::string name;
  std::vector<std::size_t> deps;                    // indices of entries registered earlier
  PingFailure on_ping_failure = PingFailure::halt;  // the resource's, or the application's
};

struct AppCore {
  explicit AppCore(ApplicationOptions o);

  const ApplicationOptions opts;
  const std::shared_ptr<Logger> logger;
  const std::string prefix;  // of log lines

  // Registered before run(); read-only once `started` is set.
  std::vector<AppResource> resources;
  std::vector<Pool*> pools;
  std::atomic<bool> started{false};

  std::atomic<AppState> state{AppState::init};
  std::stop_source halt_source;
  std::stop_source cancel_source;

  mutable Mutex mu;
  std::condition_variable changed;
  std::optional<Failure> failure CREW_GUARDED_BY(mu);
  bool halt_requested CREW_GUARDED_BY(mu) = false;
  bool forced CREW_GUARDED_BY(mu) = false;  // a second signal
  // shutdown_now() (or a failure whose policy is to stop at once): the hard
  // path without the halting state's wait.
  bool stop_now CREW_GUARDED_BY(mu) = false;
  int signals_received CREW_GUARDED_BY(mu) = 0;
  bool main_done CREW_GUARDED_BY(mu) = false;
  bool keeper_stop CREW_GUARDED_BY(mu) = false;

  // Writes "application <name>: <message>" through the logger.
  void log(LogLevel level, std::string_view message) const noexcept;

  // Wakes every waiter on `changed`, after a change made without the lock
  // (an atomic such as AppCall::done).
  void notify() noexcept;

  // Keeps the first failure; logs every one. Any failure halts; with
  // `at_once` it also asks for the hard path at once (stop_now). The line
  // is logged before the halt is requested, so logs read in causal order.
  void record(Failure f, bool at_once = false) noexcept;

  // Whether the hard path was asked for: a second signal or stop_now.
  [[nodiscard]] bool hard_requested() const CREW_REQUIRES(mu) { return forced || stop_now; }

  void request_halt() noexcept;

  // Context::fail(): a failure of kind `reported` (init_failed during
  // start-up) from `source`, with the message message() returns.
  template <class Message>
  void fail(std::string_view source, Message message, std::exception_ptr error) noexcept {
    try {
      const FailureKind kind =
          state.load() == AppState::init ? FailureKind::init_failed : FailureKind::reported;
      record({kind, std::string(source), message(), std::move(error)});
    } catch (...) {
      request_halt();
    }
  }

  // Context::shutdown_now() and Application::shutdown_now().
  void shutdown_now(std::string_view source, std::string_view reason) noexcept;

  // A signal caught (on the signal reader thread). The first one halts; any
  // later one forces the hard path.
  void on_signal(int signo);

  static Context context_of(std::shared_ptr<AppCore> core) noexcept {
    return Context(std::move(core));
  }

  [[nodiscard]] ExitCode exit_code() const;
};

}  // namespace detail
}  // namespace crew
