// Application and Context: the public face of the lifecycle
// (crew/application.hpp). Options are validated here, resources and pools
// registered, and run() hands the calling thread to the controller.
//
// The units behind it (each file's overview says which thread touches what):
//   src/app_core.*         the state all the application's threads share
//   src/app_controller.*   the lifecycle, on the thread in run()
//   src/resource_calls.*   init / ping / close on threads of their own; the keeper
//   src/signals.*          the signal self-pipe and its reader thread
#include "crew/application.hpp"

#include <signal.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "app_controller.hpp"
#include "app_core.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "signals.hpp"

namespace crew {
namespace {

[[noreturn]] void invalid(const std::string& field, const std::string& why) {
  throw Error(Errc::invalid_options, "crew::" + field + ": " + why);
}

void check_ping_failure(const std::string& field, PingFailure p) {
  if (p != PingFailure::halt && p != PingFailure::shutdown_now) {
    invalid(field, std::to_string(static_cast<int>(p)) + " is not halt or shutdown_now");
  }
}

}  // namespace

std::string_view to_string(AppState s) noexcept {
  switch (s) {
    case AppState::init:
      return "init";
    case AppState::running:
      return "running";
    case AppState::halting:
      return "halting";
    case AppState::shutdown:
      return "shutdown";
    case AppState::off:
      return "off";
  }
  return "unknown";
}

std::string_view to_string(ExitCode c) noexcept {
  switch (c) {
    case ExitCode::ok:
      return "ok";
    case ExitCode::runtime_failure:
      return "runtime_failure";
    case ExitCode::startup_failure:
      return "startup_failure";
    case ExitCode::termination_timeout:
      return "termination_timeout";
    case ExitCode::forced:
      return "forced";
    case ExitCode::shutdown_failure:
      return "shutdown_failure";
    case ExitCode::hard_stop:
      return "hard_stop";
  }
  return "unknown";
}

std::string_view to_string(PingFailure p) noexcept {
  switch (p) {
    case PingFailure::halt:
      return "halt";
    case PingFailure::shutdown_now:
      return "shutdown_now";
  }
  return "unknown";
}

std::string_view to_string(FailureKind k) noexcept {
  switch (k) {
    case FailureKind::init_failed:
      return "init_failed";
    case FailureKind::init_timed_out:
      return "init_timed_out";
    case FailureKind::main_threw:
      return "main_threw";
    case FailureKind::reported:
      return "reported";
    case FailureKind::ping_failed:
      return "ping_failed";
    case FailureKind::ping_timed_out:
      return "ping_timed_out";
    case FailureKind::termination_timeout:
      return "termination_timeout";
    case FailureKind::forced:
      return "forced";
    case FailureKind::pool_shutdown:
      return "pool_shutdown";
    case FailureKind::close_failed:
      return "close_failed";
    case FailureKind::close_timed_out:
      return "close_timed_out";
    case FailureKind::hard_stop:
      return "hard_stop";
  }
  return "unknown";
}

ExitCode exit_code_of(FailureKind k) noexcept {
  switch (k) {
    case FailureKind::init_failed:
    case FailureKind::init_timed_out:
      return ExitCode::startup_failure;
    case FailureKind::main_threw:
    case FailureKind::reported:
    case FailureKind::ping_failed:
    case FailureKind::ping_timed_out:
      return ExitCode::runtime_failure;
    case FailureKind::termination_timeout:
      return ExitCode::termination_timeout;
    case FailureKind::forced:
      return ExitCode::forced;
    case FailureKind::pool_shutdown:
    case FailureKind::close_failed:
    case FailureKind::close_timed_out:
      return ExitCode::shutdown_failure;
    case FailureKind::hard_stop:
      return ExitCode::hard_stop;
  }
  return ExitCode::runtime_failure;
}

// Context

std::stop_token Context::halt_token() const noexcept { return core_->halt_source.get_token(); }
std::stop_token Context::stop_token() const noexcept { return core_->cancel_source.get_token(); }
AppState Context::state() const noexcept { return core_->state.load(); }

std::optional<Failure> Context::failure() const {
  detail::MutexLock lock(core_->mu);
  return core_->failure;
}

void Context::halt() const noexcept { core_->request_halt(); }

void Context::fail(std::string_view source, std::string_view message) const noexcept {
  core_->fail(
      source, [message] { return std::string(message); }, nullptr);
}

void Context::fail(std::string_view source, std::exception_ptr error) const noexcept {
  core_->fail(
      source, [&error] { return detail::describe(error); }, error);
}

void Context::shutdown_now(std::string_view source, std::string_view reason) const noexcept {
  core_->shutdown_now(source, reason);
}

void Context::log(LogLevel level, std::string_view message) const noexcept {
  core_->log(level, message);
}

// Application

Application::Application(ApplicationOptions options) {
  using std::chrono::nanoseconds;
  if (options.name.empty()) invalid("ApplicationOptions.name", "must not be empty");
  const std::pair<const char*, nanoseconds> durations[] = {
      {"init_timeout", options.init_timeout},
      {"termination_timeout", options.termination_timeout},
      {"shutdown_timeout", options.shutdown_timeout},
      {"ping_period", options.ping_period},
      {"ping_timeout", options.ping_timeout},
  };
  for (const auto& [field, d] : durations) {
    if (d <= nanoseconds{0}) {
      invalid(std::string("ApplicationOptions.") + field, "must be positive");
    }
  }
  if (options.pool_shutdown_timeout < nanoseconds{0}) {
    invalid("ApplicationOptions.pool_shutdown_timeout", "must not be negative");
  }
  check_ping_failure("ApplicationOptions.on_ping_failure", options.on_ping_failure);
  std::set<int> seen;
  for (int s : options.signals) {
    const std::string field = "ApplicationOptions.signals";
    if (s <= 0 || s >= NSIG) invalid(field, std::to_string(s) + " is not a signal number");
    if (s == SIGKILL || s == SIGSTOP) invalid(field, "SIGKILL and SIGSTOP cannot be caught");
    if (s == SIGSEGV || s == SIGBUS || s == SIGFPE || s == SIGILL || s == SIGTRAP || s == SIGSYS) {
      invalid(field, detail::signal_name(s) + " is a fault signal; it cannot mean halt");
    }
    if (!seen.insert(s).second) invalid(field, detail::signal_name(s) + " is listed twice");
  }
  core_ = std::make_shared<detail::AppCore>(std::move(options));
}

Application::~Application() = default;

void Application::add_resource(std::shared_ptr<Resource> resource, ResourceOptions options) {
  const std::string field = "ResourceOptions";
  if (core_->started.load()) invalid("Application::add_resource", "run() has started");
  if (!resource) invalid("Application::add_resource", "resource is null");
  if (options.name.empty()) invalid(field + ".name", "must not be empty");
  auto& entries = core_->resources;
  auto index_of = [&entries](const std::string& name) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name == name) return i;
    }
    return entries.size();
  };
  if (index_of(options.name) != entries.size()) {
    invalid(field + ".name", "'" + options.name + "' is registered already");
  }
  if (options.on_ping_failure)
    check_ping_failure(field + ".on_ping_failure", *options.on_ping_failure);
  detail::AppResource entry{std::move(resource),
                            options.name,
                            {},
                            options.on_ping_failure.value_or(core_->opts.on_ping_failure)};
  for (const std::string& dep : options.depends_on) {
    const std::size_t i = index_of(dep);
    if (i == entries.size()) {
      invalid(field + ".depends_on",
              "'" + options.name + "' depends on '" + dep + "', which is not registered before it");
    }
    entry.deps.push_back(i);
  }
  entries.push_back(std::move(entry));
}

void Application::add_pool(Pool& pool) {
  if (core_->started.load()) invalid("Application::add_pool", "run() has started");
  if (std::find(core_->pools.begin(), core_->pools.end(), &pool) != core_->pools.end()) {
    invalid("Application::add_pool",
            "pool '" + std::string(pool.name()) + "' is registered already");
  }
  core_->pools.push_back(&pool);
}

int Application::run(std::function<void(const Context&)> main) noexcept {
  bool expected = false;
  if (!core_->started.compare_exchange_strong(expected, true)) {
    core_->log(LogLevel::error, "run() called more than once; this call does nothing");
    return static_cast<int>(ExitCode::startup_failure);
  }
  try {
    return static_cast<int>(detail::run_lifecycle(core_, std::move(main)));
  } catch (const std::exception& e) {
    // Only allocation failures get here; report what can be reported.
    core_->log(LogLevel::error, std::string("run() failed: ") + e.what());
  } catch (...) {
    core_->log(LogLevel::error, "run() failed");
  }
  const ExitCode code = core_->exit_code();
  return static_cast<int>(code == ExitCode::ok ? ExitCode::runtime_failure : code);
}

void Application::halt() noexcept { core_->request_halt(); }

void Application::shutdown_now(std::string_view source, std::string_view reason) noexcept {
  core_->shutdown_now(source, reason);
}

AppState Application::state() const noexcept { return core_->state.load(); }

Context Application::context() const noexcept { return detail::AppCore::context_of(core_); }

std::optional<Failure> Application::failure() const {
  detail::MutexLock lock(core_->mu);
  return core_->failure;
}

const ApplicationOptions& Application::options() const noexcept { return core_->opts; }

}  // namespace crew
