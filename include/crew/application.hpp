// crew/application.hpp: the lifecycle of a service process.
//
// An Application runs the service's main function and owns everything
// around it:
//
//   init      resources are initialized in registration order under
//             init_timeout (Resource::init);
//   running   main runs on its own thread; a keeper pings every resource each
//             ping_period under ping_timeout;
//   halting   a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT by default), halt()
//             or a failure stopped the halt token: main stops taking new work
//             and has termination_timeout to return (shutdown_now() skips
//             this state: running -> shutdown on the hard path at once);
//   shutdown  the context's stop token is stopped; registered pools are shut
//             down in parallel (in their configured mode, bounded by
//             pool_shutdown_timeout when they have no timeout of their own;
//             hard when main did not return in time, a second signal came or
//             shutdown_now() was called, and a second signal or
//             shutdown_now() during this step makes them go hard);
//             resources are closed in parallel, dependents before their
//             dependencies, under shutdown_timeout;
//   off       run() returns the exit code.
//
// The first failure (main threw, an init / ping / close failed or timed out,
// main missed the termination timeout, a second signal forced the hard path,
// shutdown_now() was called)
// is kept, decides the exit code and is visible through Context::failure();
// later ones are only logged. docs/lifecycle.md has the state diagram and a
// timeline of a SIGTERM.
//
// Signals are caught by a handler that only writes the signal number to a
// pipe (no work in the handler); a thread of the application reads the pipe.
// A self-pipe rather than signalfd because signalfd needs the signals blocked
// in every thread of the process. No thread's signal mask is changed except
// that reader's: the threads the application starts (main's, the keeper's,
// those of resource calls) inherit the mask of the thread that called run().
// The previous dispositions are restored when run() returns. Only one
// Application at a time may handle signals.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crew/log.hpp"

namespace crew {

class Pool;

namespace detail {
struct AppCore;
}  // namespace detail

// init -> running -> halting -> shutdown -> off. Start-up that fails or is
// halted goes init -> shutdown; a main that returns on its own goes
// running -> shutdown.
enum class AppState : std::uint8_t { init, running, halting, shutdown, off };

[[nodiscard]] std::string_view to_string(AppState s) noexcept;

// The transitions the application can make; anything else is a bug (it
// asserts in debug builds).
[[nodiscard]] constexpr bool is_legal_transition(AppState from, AppState to) noexcept {
  switch (from) {
    case AppState::init:
      return to == AppState::running || to == AppState::shutdown;
    case AppState::running:
      return to == AppState::halting || to == AppState::shutdown;
    case AppState::halting:
      return to == AppState::shutdown;
    case AppState::shutdown:
      return to == AppState::off;
    case AppState::off:
      return false;
  }
  return false;
}

// What run() returns. The values are part of the interface (scripts and
// orchestrators read them); 2 is left to command-line usage errors.
enum class ExitCode : int {
  ok = 0,                   // no failure
  runtime_failure = 1,      // main threw, a ping failed or timed out, Context::fail()
  startup_failure = 3,      // a resource's init failed or timed out; run() misused
  termination_timeout = 4,  // main did not return within termination_timeout of the halt
  forced = 5,               // a second signal while halting or shutting pools down
  shutdown_failure = 6,     // a close failed or timed out; a pool had to escalate
  hard_stop = 7,            // shutdown_now() (Application's or Context's)
};

[[nodiscard]] std::string_view to_string(ExitCode c) noexcept;

// Where a failure came from. Each kind maps to one exit code.
enum class FailureKind : std::uint8_t {
  init_failed,          // Resource::init threw (or start-up could not proceed)
  init_timed_out,       // init did not return before the init deadline
  main_threw,           // the main function threw
  reported,             // Context::fail()
  ping_failed,          // Resource::ping threw
  ping_timed_out,       // ping did not return within ping_timeout
  termination_timeout,  // main still ran termination_timeout after the halt
  forced,               // a second signal arrived while halting or while pools shut down
  pool_shutdown,        // a registered pool escalated or abandoned tasks on the graceful path
  close_failed,         // Resource::close threw
  close_timed_out,      // close did not finish (or start) before the shutdown deadline
  hard_stop,            // shutdown_now(): the source and reason its caller gave
};

[[nodiscard]] std::string_view to_string(FailureKind k) noexcept;
[[nodiscard]] ExitCode exit_code_of(FailureKind k) noexcept;

struct Failure {
  FailureKind kind = FailureKind::reported;
  std::string source;              // resource or pool name, "main", "signals", ...
  std::string message;             // what() of the exception, or a description
  std::exception_ptr exception{};  // the original exception, when there was one
};

// The view of the application that main, tasks and resources get. Cheap to
// copy; copies share the application's state and stay valid (and safe to
// call) after the Application is gone.
//
// Thread safety: all member functions are thread-safe.
class Context {
 public:
  // Stopped when the application enters halting or shutdown (a signal,
  // halt(), a failure, main returned, start-up abandoned): stop taking new
  // work, finish what was accepted.
  [[nodiscard]] std::stop_token halt_token() const noexcept;
  // Stopped as shutdown begins, before the registered pools are shut down:
  // the cancellation source for anything still running. Watch it in long
  // tasks that must not outlive the application (a drain then does not wait
  // for them forever), and give it as PoolOptions::stop_token to pools that
  // are not registered with add_pool() (they then shut down hard by
  // themselves). A registered pool given it goes hard at that moment too,
  // instead of in its own mode.
  [[nodiscard]] std::stop_token stop_token() const noexcept;
  [[nodiscard]] bool halting() const noexcept { return halt_token().stop_requested(); }
  [[nodiscard]] AppState state() const noexcept;
  // The first failure, once there is one.
  [[nodiscard]] std::optional<Failure> failure() const;

  // Asks the application to halt (see Application::halt()).
  void halt() const noexcept;
  // Records a failure of kind `reported` (init_failed during start-up) and
  // halts. The first failure decides the exit code; later ones are logged.
  void fail(std::string_view source, std::string_view message) const noexcept;
  void fail(std::string_view source, std::exception_ptr error) const noexcept;
  // Stops the application at once (see Application::shutdown_now()).
  void shutdown_now(std::string_view source, std::string_view reason) const noexcept;
  // Writes a line through ApplicationOptions::logger.
  void log(LogLevel level, std::string_view message) const noexcept;

 private:
  friend struct detail::AppCore;
  explicit Context(std::shared_ptr<detail::AppCore> core) noexcept : core_(std::move(core)) {}

  std::shared_ptr<detail::AppCore> core_;
};

// What a resource call receives: its deadline and a token. The token is
// stopped when the application stops waiting for the call (the deadline
// passed, or a second signal forced the hard path), when a halt interrupts
// start-up (init), and when the keeper stops at shutdown (ping). A call that
// overruns its deadline is not waited for: it is reported as timed out and
// left to finish on its own thread, which keeps the resource alive.
struct ResourceCall {
  std::stop_token stop_token;
  std::chrono::steady_clock::time_point deadline;

  [[nodiscard]] bool stop_requested() const noexcept { return stop_token.stop_requested(); }
};

// Something the service needs while it runs: a database connection, a
// message broker, an output file. Failures are reported by throwing.
//
// Each method is called on a thread of the application created for that
// call; init and close are called once at most; ping is called only between
// a successful init and close, and never concurrently with itself, init or
// close (unless an earlier call overran its deadline and was left behind).
class Resource {
 public:
  Resource() = default;
  Resource(const Resource&) = delete;
  Resource& operator=(const Resource&) = delete;
  virtual ~Resource() = default;

  virtual void init(const ResourceCall& call) = 0;
  // Health check; the default has nothing to check.
  virtual void ping(const ResourceCall& call) { (void)call; }
  virtual void close(const ResourceCall& call) = 0;
};

// What a failed or timed-out Resource::ping does once it is recorded (the
// failure, ping_failed or ping_timed_out, is the same either way).
enum class PingFailure : std::uint8_t {
  halt,          // the graceful path: main gets termination_timeout to return
  shutdown_now,  // the hard path at once, as Application::shutdown_now(): for a
                 // resource without which main can only do harm (its database
                 // is gone), so nothing waits termination_timeout for it
};

[[nodiscard]] std::string_view to_string(PingFailure p) noexcept;

struct ResourceOptions {
  // Non-empty, unique within the application; used in logs and failures.
  std::string name;
  // Resources this one uses. They must be registered before it (so they are
  // initialized first), and are closed only after it has closed.
  std::vector<std::string> depends_on{};
  // What a failed ping of this resource does; empty:
  // ApplicationOptions::on_ping_failure.
  std::optional<PingFailure> on_ping_failure{};
};

struct ApplicationOptions {
  // Prefix of log lines and thread names.
  std::string name = "app";
  // For the init of all resources together.
  std::chrono::nanoseconds init_timeout = std::chrono::seconds(15);
  // From the halt until the hard path: how long main has to return.
  std::chrono::nanoseconds termination_timeout = std::chrono::seconds(15);
  // For closing all resources together; also how long main still has to
  // return once the context's stop token was stopped.
  std::chrono::nanoseconds shutdown_timeout = std::chrono::seconds(10);
  // Bounds the graceful shutdown of each registered pool that has no
  // shutdown_timeout of its own (0; PoolOptions' default is 10 s, so a pool
  // inherits this value only when it sets .shutdown_timeout = 0ns):
  // such a pool is shut down in its mode with this timeout, then goes hard.
  // A pool's own non-zero shutdown_timeout is kept. 0 leaves those pools
  // unbounded (only a second signal then cuts their drain short).
  std::chrono::nanoseconds pool_shutdown_timeout = std::chrono::seconds(10);
  std::chrono::nanoseconds ping_period = std::chrono::seconds(5);
  std::chrono::nanoseconds ping_timeout = std::chrono::milliseconds(1500);
  // What a failed or timed-out ping does, for resources that do not say
  // (ResourceOptions::on_ping_failure). The default halts gracefully.
  PingFailure on_ping_failure = PingFailure::halt;
  // Signals that halt the application (a second one forces the hard path;
  // during the pools' shutdown it makes them go hard).
  // Empty: the application installs no handler and leaves signals alone.
  // SIGKILL, SIGSTOP and the synchronous fault signals are refused.
  std::vector<int> signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  // Called on the thread of run() after each state change. Must not throw
  // and must not block for long.
  std::function<void(AppState)> on_state_change{};
  // Where the application logs signals, state changes, resource calls and
  // failures, as "application <name>: <message>" (crew/log.hpp). Empty:
  // crew::default_logger(), which writes warnings and errors to stderr.
  std::shared_ptr<Logger> logger{};
};

// Thread safety: halt(), state(), context(), failure() and options() are
// thread-safe. add_resource() and add_pool() must be called before run(),
// from one thread. run() is called once.
//
// Lifetime: registered pools must outlive run(). Do not destroy the
// Application while run() runs. If main ignores both tokens, run() gives up
// on it shutdown_timeout after the cancellation and returns; main's thread is
// then left running, so the caller should exit the process promptly.
class Application {
 public:
  // Throws crew::Error(Errc::invalid_options) naming the bad field.
  explicit Application(ApplicationOptions options = {});
  ~Application();

  Application(const Application&) = delete;
  Application& operator=(const Application&) = delete;
  Application(Application&&) = delete;
  Application& operator=(Application&&) = delete;

  // Throws crew::Error(Errc::invalid_options) for a null resource, a bad
  // name, dependency or on_ping_failure, or when called after run() started.
  void add_resource(std::shared_ptr<Resource> resource, ResourceOptions options);
  // The application shuts the pool down during its shutdown, on a thread of
  // its own, after the context's stop token was stopped: with
  // pool.options().shutdown_mode and its shutdown_timeout (or, if that is 0,
  // ApplicationOptions::pool_shutdown_timeout), or hard on the hard path or
  // at a second signal. Throws crew::Error(Errc::invalid_options) after
  // run() started.
  void add_pool(Pool& pool);

  // Runs the whole lifecycle on the calling thread (main itself runs on a
  // thread of its own) and returns the process exit code (an ExitCode).
  // Blocks until the application is off.
  [[nodiscard]] int run(std::function<void(const Context&)> main) noexcept;

  // Asks the application to halt: from running it stops the halt token and
  // starts the termination timeout; during init it abandons start-up. Returns
  // at once; the controller (the thread in run()) makes the transition.
  void halt() noexcept;

  // Stops the application at once, on the hard path (an admin endpoint, or
  // main found its state corrupted): records a failure of kind hard_stop
  // from `source` with `reason` (exit code 7, unless an earlier failure
  // decided the code already) and goes to shutdown without the halting
  // state's termination_timeout. Both tokens are stopped at once; registered
  // pools are shut down hard (those already shutting down go hard at once);
  // main, if still running, gets shutdown_timeout after the cancellation, as
  // on any hard path; resources are closed under shutdown_timeout. During
  // init it abandons start-up (the init running gets its token stopped and
  // is not waited for). Returns at once, from any thread (main, a task, a
  // resource call); the controller makes the transitions. Later calls are
  // logged only.
  void shutdown_now(std::string_view source, std::string_view reason) noexcept;

  [[nodiscard]] AppState state() const noexcept;
  [[nodiscard]] Context context() const noexcept;
  [[nodiscard]] std::optional<Failure> failure() const;
  [[nodiscard]] const ApplicationOptions& options() const noexcept;

 private:
  std::shared_ptr<detail::AppCore> core_;
};

}  // namespace crew
