// Application: the controller (the thread in run()), the signal pipe, resource
// calls with deadlines, the ping keeper, and the shutdown sequence.
//
// Who owns what:
//   controller   every state transition, init, the waits for main, shutdown
//   main thread  runs main; sets main_done
//   keeper       pings; records ping failures
//   call threads one per resource call; set AppCall::done and notify
//   watcher      reads the signal pipe; counts signals
// Everything they share is in AppCore, behind one mutex and one condition
// variable (every event notifies all waiters: there are at most two).
#include "crew/application.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "crew/detail/mutex.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"

namespace crew {

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
  }
  return ExitCode::runtime_failure;
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using Method = void (Resource::*)(const ResourceCall&);

Clock::time_point after(Clock::time_point t, std::chrono::nanoseconds d) noexcept {
  return saturating_deadline(t, d);
}

long long ms_since(Clock::time_point t) noexcept {
  return static_cast<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

long long ms_of(std::chrono::nanoseconds d) noexcept {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// Returns false once the deadline has passed.
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

std::string signal_name(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "signal " + std::to_string(signo);
  }
}

void name_thread(const std::string& app, std::string_view role) noexcept {
  std::string name = app + "-" + std::string(role);
  if (name.size() > 15) name.resize(15);
  (void)pthread_setname_np(pthread_self(), name.c_str());
}

[[noreturn]] void invalid(const std::string& field, const std::string& why) {
  throw Error(Errc::invalid_options, "crew::" + field + ": " + why);
}

// The signal pipe. The handler only writes the signal number to it; it is
// async-signal-safe (lock-free atomics, write(2), errno saved).
std::atomic<int> g_signal_fd{-1};
std::atomic<int> g_in_handler{0};
std::atomic<bool> g_signals_owned{false};
static_assert(std::atomic<int>::is_always_lock_free);

void on_signal_handler(int signo) {
  const int saved = errno;
  g_in_handler.fetch_add(1, std::memory_order_seq_cst);
  const int fd = g_signal_fd.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    const auto byte = static_cast<unsigned char>(signo);
    if (write(fd, &byte, 1) < 0) {
      // The pipe is full (tens of thousands of unread signals) or gone: the
      // signals already queued say enough.
    }
  }
  g_in_handler.fetch_sub(1, std::memory_order_seq_cst);
  errno = saved;
}

}  // namespace

// One init, ping or close running on its own thread.
struct AppCall {
  std::stop_source stop;
  std::atomic<bool> done{false};
  std::exception_ptr error;  // written before `done`
  std::thread thread;        // owned by the waiter
  Clock::time_point started = Clock::now();
};

struct AppResource {
  std::shared_ptr<Resource> resource;
  std::string name;
  std::vector<std::size_t> deps;  // indices of entries registered earlier
};

struct AppCore {
  explicit AppCore(ApplicationOptions o)
      : opts(std::move(o)),
        logger(opts.logger ? opts.logger : default_logger()),
        prefix("application " + opts.name + ": ") {}

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
  bool forced CREW_GUARDED_BY(mu) = false;
  int signals_received CREW_GUARDED_BY(mu) = 0;
  bool main_done CREW_GUARDED_BY(mu) = false;
  bool keeper_stop CREW_GUARDED_BY(mu) = false;

  void log(LogLevel level, std::string_view message) const noexcept {
    if (level < logger->level()) return;
    try {
      logger->log(level, LogContext{}, prefix + std::string(message));
    } catch (...) {  // out of memory while formatting: drop the line
    }
  }

  void notify() noexcept {
    { MutexLock lock(mu); }
    changed.notify_all();
  }

  // Keeps the first failure; logs every one. Any failure halts. The line is
  // logged before the halt is requested, so logs read in causal order.
  void record(Failure f) noexcept {
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
    }
    changed.notify_all();
  }

  void request_halt() noexcept {
    bool first = false;
    {
      MutexLock lock(mu);
      first = !halt_requested;
      halt_requested = true;
    }
    changed.notify_all();
    if (first) log(LogLevel::info, "halt requested");
  }

  // The first signal halts; any later one forces the hard path.
  void on_signal(int signo) {
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

  static Context context_of(std::shared_ptr<AppCore> core) noexcept {
    return Context(std::move(core));
  }

  [[nodiscard]] ExitCode exit_code() const {
    MutexLock lock(mu);
    return failure ? exit_code_of(failure->kind) : ExitCode::ok;
  }
};

namespace {

// Installs the handlers for the configured signals and reads the pipe on a
// thread of its own, the only thread whose mask the application changes.
class SignalWatcher {
 public:
  SignalWatcher() = default;
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  ~SignalWatcher() { stop(); }

  // Returns an empty string, or why signals cannot be handled.
  std::string start(const std::shared_ptr<AppCore>& core) {
    const std::vector<int>& signals = core->opts.signals;
    if (signals.empty()) return {};
    bool expected = false;
    if (!g_signals_owned.compare_exchange_strong(expected, true)) {
      return "another Application is handling signals";
    }
    owned_ = true;
    if (pipe2(fds_, O_CLOEXEC) != 0) return std::string("pipe2: ") + std::strerror(errno);
    // The handler must never block; a full pipe drops the byte.
    (void)fcntl(fds_[1], F_SETFL, fcntl(fds_[1], F_GETFL) | O_NONBLOCK);
    g_signal_fd.store(fds_[1], std::memory_order_seq_cst);

    sigset_t mask;
    sigemptyset(&mask);
    for (int s : signals) sigaddset(&mask, s);
    try {
      const int rfd = fds_[0];
      thread_ = std::thread([core, rfd, mask] {
        // Only this thread blocks the signals: it must not be interrupted in
        // read(), and it is the application's own.
        (void)pthread_sigmask(SIG_BLOCK, &mask, nullptr);
        name_thread(core->opts.name, "signals");
        read_loop(*core, rfd);
      });
    } catch (const std::exception& e) {
      return std::string("cannot start the signal thread: ") + e.what();
    }

    struct sigaction sa {};
    sa.sa_handler = &on_signal_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s : signals) {
      struct sigaction old {};
      if (sigaction(s, &sa, &old) != 0) {
        return "sigaction(" + signal_name(s) + "): " + std::strerror(errno);
      }
      installed_.emplace_back(s, old);
    }
    return {};
  }

  // Restores the previous dispositions, then stops the reader. Idempotent.
  void stop() noexcept {
    for (auto it = installed_.rbegin(); it != installed_.rend(); ++it) {
      (void)sigaction(it->first, &it->second, nullptr);
    }
    installed_.clear();
    if (fds_[1] >= 0) {
      g_signal_fd.store(-1, std::memory_order_seq_cst);
      // A handler that loaded the fd before the store may still write to it.
      while (g_in_handler.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
      (void)close(fds_[1]);  // the reader sees end of file
      fds_[1] = -1;
    }
    if (thread_.joinable()) thread_.join();
    if (fds_[0] >= 0) {
      (void)close(fds_[0]);
      fds_[0] = -1;
    }
    if (owned_) {
      g_signals_owned.store(false);
      owned_ = false;
    }
  }

 private:
  static void read_loop(AppCore& core, int fd) {
    unsigned char buf[64];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      for (ssize_t i = 0; i < n; ++i) core.on_signal(buf[i]);
    }
  }

  std::vector<std::pair<int, struct sigaction>> installed_;
  int fds_[2] = {-1, -1};
  std::thread thread_;
  bool owned_ = false;
};

// Starts `method` of a resource on a new thread. The thread owns references
// to the resource and the core, so a call left behind after its deadline
// touches nothing that can be freed under it.
std::shared_ptr<AppCall> start_call(const std::shared_ptr<AppCore>& core, const AppResource& entry,
                                    Method method, std::string_view role,
                                    Clock::time_point deadline) {
  auto call = std::make_shared<AppCall>();
  try {
    call->thread = std::thread(
        [core, call, resource = entry.resource, method, deadline, role = std::string(role)] {
          name_thread(core->opts.name, role);
          try {
            ((*resource).*method)(ResourceCall{call->stop.get_token(), deadline});
          } catch (...) {
            call->error = std::current_exception();
          }
          call->done.store(true, std::memory_order_release);
          core->notify();
        });
  } catch (...) {
    call->error = std::current_exception();
    call->done.store(true, std::memory_order_release);
  }
  return call;
}

// A finished call is joined; one that overran is told to stop and left.
void finish_call(AppCall& call) {
  if (!call.thread.joinable()) return;
  if (call.done.load(std::memory_order_acquire)) {
    call.thread.join();
  } else {
    call.stop.request_stop();
    call.thread.detach();
  }
}

// Pings the initialized resources every ping_period until told to stop or
// one fails. Runs on the keeper thread.
void keep(const std::shared_ptr<AppCore>& core, const std::vector<std::size_t>& live) {
  AppCore& c = *core;
  auto next = after(Clock::now(), c.opts.ping_period);
  for (;;) {
    {
      MutexLock lock(c.mu);
      while (!c.keeper_stop) {
        if (!wait_or_timeout(c.changed, lock.native(), next)) break;
      }
      if (c.keeper_stop) return;
    }
    const auto round_start = Clock::now();
    const auto deadline = after(round_start, c.opts.ping_timeout);
    std::vector<std::shared_ptr<AppCall>> calls;
    calls.reserve(live.size());
    for (std::size_t i : live) {
      calls.push_back(start_call(core, c.resources[i], &Resource::ping, "ping", deadline));
    }
    // Wait for the round. When told to stop meanwhile, stop the pings'
    // tokens and give them the rest of their deadline, so that close does
    // not overlap a ping that is about to return.
    bool stopping = false;
    bool stop_sent = false;
    for (;;) {
      bool send_stop = false;
      {
        MutexLock lock(c.mu);
        for (;;) {
          const bool all_done = std::all_of(calls.begin(), calls.end(), [](const auto& call) {
            return call->done.load(std::memory_order_acquire);
          });
          stopping = c.keeper_stop;
          if (all_done) break;
          if (stopping && !stop_sent) {
            send_stop = true;
            break;
          }
          if (!wait_or_timeout(c.changed, lock.native(), deadline)) break;
        }
      }
      if (!send_stop) break;
      stop_sent = true;
      for (auto& call : calls) call->stop.request_stop();
    }
    bool failed = false;
    for (std::size_t k = 0; k < calls.size(); ++k) {
      AppCall& call = *calls[k];
      const std::string& name = c.resources[live[k]].name;
      const bool done = call.done.load(std::memory_order_acquire);
      if (done && call.error) {
        failed = true;
        if (stopping) {
          c.log(LogLevel::warning,
                "ping of " + name + " failed during shutdown: " + describe(call.error));
        } else {
          c.record({FailureKind::ping_failed, name, describe(call.error), call.error});
        }
      } else if (!done) {
        failed = true;
        const std::string what = "ping did not return within ping_timeout (" +
                                 std::to_string(ms_of(c.opts.ping_timeout)) + " ms)";
        if (stopping) {
          c.log(LogLevel::warning, "ping of " + name + " left behind during shutdown: " + what);
        } else {
          c.record({FailureKind::ping_timed_out, name, what, nullptr});
        }
      }
      finish_call(call);
    }
    if (failed || stopping) return;
    next = after(round_start, c.opts.ping_period);
  }
}

// The thread in run(): makes every transition and drives the lifecycle.
class Controller {
 public:
  explicit Controller(std::shared_ptr<AppCore> core) : core_(std::move(core)), c_(*core_) {}
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;
  ~Controller() {
    // Only reached with live threads when run() itself failed; they own what
    // they touch (the core), so letting them go is safe.
    if (keeper_.joinable()) keeper_.detach();
    if (main_.joinable()) main_.detach();
  }

  ExitCode run(std::function<void(const Context&)> main) {
    if (!main) {
      c_.record({FailureKind::init_failed, "main", "run() was given no main function", nullptr});
      return abort_startup();
    }
    if (std::string err = signals_.start(core_); !err.empty()) {
      c_.record({FailureKind::init_failed, "signals", err, nullptr});
      return abort_startup();
    }
    if (!init_resources()) return abort_startup();

    transition(AppState::running);
    start_keeper();
    start_main(std::move(main));

    bool halted = false;
    {
      MutexLock lock(c_.mu);
      while (!c_.halt_requested && !c_.main_done) c_.changed.wait(lock.native());
      halted = c_.halt_requested;
    }
    bool hard = false;
    if (halted) {
      transition(AppState::halting);
      c_.log(LogLevel::info, "halting: main has " +
                                 std::to_string(ms_of(c_.opts.termination_timeout)) +
                                 " ms to return");
      const auto deadline = after(Clock::now(), c_.opts.termination_timeout);
      bool main_done = false;
      bool forced = false;
      {
        MutexLock lock(c_.mu);
        while (!c_.main_done && !c_.forced) {
          if (!wait_or_timeout(c_.changed, lock.native(), deadline)) break;
        }
        main_done = c_.main_done;
        forced = c_.forced;
      }
      if (!main_done) {
        hard = true;
        if (forced) {
          c_.record({FailureKind::forced, "signals",
                     "a second signal arrived while main was still running", nullptr});
        } else {
          c_.record({FailureKind::termination_timeout, "main",
                     "main did not return within termination_timeout (" +
                         std::to_string(ms_of(c_.opts.termination_timeout)) + " ms)",
                     nullptr});
        }
      }
    }
    transition(AppState::shutdown);
    shutdown(hard);
    transition(AppState::off);
    signals_.stop();
    return c_.exit_code();
  }

 private:
  void transition(AppState to) {
    const AppState from = c_.state.load();
    assert(is_legal_transition(from, to) && "illegal Application state transition");
    if (!is_legal_transition(from, to)) {
      c_.log(LogLevel::error, "illegal state transition " + std::string(to_string(from)) + " -> " +
                                  std::string(to_string(to)) + " ignored");
      return;
    }
    c_.state.store(to);
    c_.log(LogLevel::info,
           "state " + std::string(to_string(from)) + " -> " + std::string(to_string(to)));
    if (c_.opts.on_state_change) {
      try {
        c_.opts.on_state_change(to);
      } catch (...) {
        c_.log(LogLevel::error, "on_state_change threw; ignored");
      }
    }
    // The halt token means "we are going down": stopped on entering halting
    // or shutdown, whatever the reason (idempotent), after the state change
    // is visible, so whoever watches the token sees the new state.
    if (to == AppState::halting || to == AppState::shutdown) c_.halt_source.request_stop();
  }

  // init -> shutdown: the same sequence without main and the keeper; only
  // what was initialized is closed.
  ExitCode abort_startup() {
    transition(AppState::shutdown);
    bool forced = false;
    {
      MutexLock lock(c_.mu);
      forced = c_.forced;
    }
    cancel_context();
    shut_down_pools(forced);
    close_resources();
    transition(AppState::off);
    signals_.stop();
    return c_.exit_code();
  }

  // Initializes the resources in order. Returns true if all are up and no
  // halt or failure came meanwhile.
  bool init_resources() {
    const auto deadline = after(Clock::now(), c_.opts.init_timeout);
    for (std::size_t i = 0; i < c_.resources.size(); ++i) {
      {
        MutexLock lock(c_.mu);
        if (c_.halt_requested) break;
      }
      const AppResource& entry = c_.resources[i];
      auto call = start_call(core_, entry, &Resource::init, "init", deadline);
      const Wait end = wait_call(*call, deadline);
      const long long took = ms_since(call->started);
      if (end.done && !call->error) {
        initialized_.push_back(i);
        c_.log(LogLevel::info,
               "resource " + entry.name + " initialized in " + std::to_string(took) + " ms");
      } else if (end.done && end.stop_sent) {
        c_.log(LogLevel::info, "resource " + entry.name +
                                   " stopped its init after the halt: " + describe(call->error));
      } else if (end.done) {
        c_.record({FailureKind::init_failed, entry.name, describe(call->error), call->error});
      } else if (end.forced) {
        c_.record({FailureKind::forced, "signals",
                   "a second signal arrived during the init of " + entry.name, nullptr});
      } else {
        c_.record({FailureKind::init_timed_out, entry.name,
                   "init did not return within init_timeout (" +
                       std::to_string(ms_of(c_.opts.init_timeout)) + " ms)",
                   nullptr});
      }
      finish_call(*call);
      if (!end.done || call->error) break;
    }
    MutexLock lock(c_.mu);
    return !c_.halt_requested && !c_.failure && initialized_.size() == c_.resources.size();
  }

  struct Wait {
    bool done = false;       // the call returned (or threw)
    bool forced = false;     // a second signal: stop waiting
    bool stop_sent = false;  // its token was stopped because of a halt
  };

  // Waits for an init call until it returns, the deadline passes or a second
  // signal forces the hard path. A halt stops the call's token.
  Wait wait_call(AppCall& call, Clock::time_point deadline) {
    Wait w;
    for (;;) {
      bool send_stop = false;
      {
        MutexLock lock(c_.mu);
        for (;;) {
          w.done = call.done.load(std::memory_order_acquire);
          w.forced = c_.forced;
          if (w.done || w.forced) break;
          if (c_.halt_requested && !w.stop_sent) {
            send_stop = true;
            break;
          }
          if (!wait_or_timeout(c_.changed, lock.native(), deadline)) break;
        }
      }
      // Outside the lock: stop callbacks of the resource run synchronously.
      if (!send_stop) return w;
      w.stop_sent = true;
      call.stop.request_stop();
    }
  }

  void start_keeper() {
    if (initialized_.empty()) return;
    try {
      keeper_ = std::thread([core = core_, live = initialized_] {
        name_thread(core->opts.name, "keeper");
        keep(core, live);
      });
    } catch (const std::exception& e) {
      c_.record({FailureKind::reported, "keeper", std::string("cannot start: ") + e.what(),
                 std::current_exception()});
    }
  }

  void start_main(std::function<void(const Context&)> main) {
    try {
      main_ = std::thread([core = core_, main = std::move(main)] {
        name_thread(core->opts.name, "main");
        const Context ctx = AppCore::context_of(core);
        try {
          main(ctx);
        } catch (...) {
          const std::exception_ptr e = std::current_exception();
          core->record({FailureKind::main_threw, "main", describe(e), e});
        }
        {
          MutexLock lock(core->mu);
          core->main_done = true;
        }
        core->changed.notify_all();
      });
    } catch (const std::exception& e) {
      c_.record({FailureKind::main_threw, "main", std::string("cannot start: ") + e.what(),
                 std::current_exception()});
      MutexLock lock(c_.mu);
      c_.main_done = true;
    }
  }

  void shutdown(bool hard) {
    cancel_context();
    shut_down_pools(hard);
    {
      MutexLock lock(c_.mu);
      c_.keeper_stop = true;
    }
    c_.changed.notify_all();
    if (keeper_.joinable()) keeper_.join();
    wait_for_main();
    close_resources();
  }

  // First in the shutdown, before the pools: long tasks that watch the
  // context's token end, so a drain never waits for them to end by
  // themselves (which they would not).
  void cancel_context() {
    c_.log(LogLevel::info, "cancelling the context");
    c_.cancel_source.request_stop();
  }

  void shut_down_pools(bool hard) {
    const std::size_t n = c_.pools.size();
    if (n == 0) return;
    std::vector<std::optional<ShutdownReport>> reports(n);
    std::vector<std::string> errors(n);
    std::size_t finished = 0;  // under c_.mu
    auto one = [&](std::size_t i, bool hard_now) {
      Pool& pool = *c_.pools[i];
      const PoolOptions& o = pool.options();
      // A pool without a limit of its own gets the application's.
      const std::chrono::nanoseconds timeout =
          o.shutdown_timeout.count() != 0 ? o.shutdown_timeout : c_.opts.pool_shutdown_timeout;
      std::optional<ShutdownReport> report;
      std::string error;
      try {
        report = hard_now ? pool.shutdown(ShutdownMode::hard, std::chrono::nanoseconds{0})
                          : pool.shutdown(o.shutdown_mode, timeout);
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (hard_now && !hard) return;  // an escalation: the first call reports
      {
        MutexLock lock(c_.mu);
        reports[i] = std::move(report);
        errors[i] = std::move(error);
        ++finished;
      }
      c_.changed.notify_all();
    };
    // In parallel, each on a thread of its own: each pool's timeout bounds
    // its shutdown, so the slowest one decides, not their sum; and this
    // thread stays free to escalate them on a second signal.
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < n; ++i) {
      try {
        threads.emplace_back([&one, i, hard] { one(i, hard); });
      } catch (...) {
        one(i, hard);
      }
    }
    bool escalate = false;
    {
      MutexLock lock(c_.mu);
      while (finished < n && !(c_.forced && !hard)) c_.changed.wait(lock.native());
      escalate = finished < n;
    }
    if (escalate) {
      // A second signal: a concurrent hard shutdown makes a running one
      // escalate at once (Pool::shutdown); the first call still reports.
      c_.record({FailureKind::forced, "signals",
                 "a second signal arrived while the pools were shutting down", nullptr});
      for (std::size_t i = 0; i < n; ++i) {
        try {
          threads.emplace_back([&one, i] { one(i, true); });
        } catch (...) {
          one(i, true);
        }
      }
    }
    for (auto& t : threads) t.join();

    for (std::size_t i = 0; i < n; ++i) {
      const std::string name(c_.pools[i]->name());
      if (!reports[i]) {
        c_.record({FailureKind::pool_shutdown, name, "shutdown threw: " + errors[i], nullptr});
        continue;
      }
      const ShutdownReport& r = *reports[i];
      const std::size_t abandoned = r.abandoned.size() + r.abandoned_unnamed;
      c_.log(LogLevel::debug, "pool " + name + ": " + std::string(to_string(r.mode)) +
                                  " shutdown in " + std::to_string(ms_of(r.elapsed)) + " ms" +
                                  (r.escalated ? " (escalated to hard)" : "") + "; succeeded " +
                                  std::to_string(r.during.succeeded) + ", failed " +
                                  std::to_string(r.during.failed) + ", cancelled " +
                                  std::to_string(r.during.cancelled) + ", timed out " +
                                  std::to_string(r.during.timed_out) + ", rejected " +
                                  std::to_string(r.during.rejected) + ", abandoned " +
                                  std::to_string(abandoned));
      if (!hard && (r.escalated || abandoned > 0)) {
        c_.record({FailureKind::pool_shutdown, name,
                   r.escalated ? "shutdown_timeout expired; the pool went hard"
                               : std::to_string(abandoned) + " tasks abandoned",
                   nullptr});
      }
    }
  }

  // After the cancellation main gets shutdown_timeout more (or until another
  // signal); then it is left running and the failure says so.
  void wait_for_main() {
    const auto deadline = after(Clock::now(), c_.opts.shutdown_timeout);
    bool done = false;
    {
      MutexLock lock(c_.mu);
      const int signals_before = c_.signals_received;
      while (!c_.main_done && c_.signals_received == signals_before) {
        if (!wait_or_timeout(c_.changed, lock.native(), deadline)) break;
      }
      done = c_.main_done;
    }
    if (!main_.joinable()) return;
    if (done) {
      main_.join();
      return;
    }
    c_.record({FailureKind::termination_timeout, "main",
               "main ignored the cancellation; its thread is left running", nullptr});
    main_.detach();
  }

  // Closes the initialized resources in parallel, each one only after the
  // resources that depend on it, all under one shutdown deadline.
  void close_resources() {
    const std::size_t n = initialized_.size();
    if (n == 0) return;
    const auto deadline = after(Clock::now(), c_.opts.shutdown_timeout);
    std::vector<std::size_t> pos(c_.resources.size(), n);  // entry index -> k
    for (std::size_t k = 0; k < n; ++k) pos[initialized_[k]] = k;
    std::vector<int> dependents(n, 0);
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t d : c_.resources[initialized_[k]].deps) {
        if (pos[d] < n) ++dependents[pos[d]];
      }
    }
    enum class Step : std::uint8_t { waiting, closing, closed };
    std::vector<Step> step(n, Step::waiting);
    std::vector<std::shared_ptr<AppCall>> calls(n);
    std::size_t closed = 0;
    bool expired = false;
    while (closed < n && !expired) {
      for (std::size_t k = 0; k < n; ++k) {
        if (step[k] == Step::waiting && dependents[k] == 0) {
          step[k] = Step::closing;
          calls[k] =
              start_call(core_, c_.resources[initialized_[k]], &Resource::close, "close", deadline);
        }
      }
      {
        MutexLock lock(c_.mu);
        for (;;) {
          const bool any_done = std::any_of(calls.begin(), calls.end(), [](const auto& call) {
            return call && call->done.load(std::memory_order_acquire);
          });
          if (any_done) break;
          if (!wait_or_timeout(c_.changed, lock.native(), deadline)) {
            expired = true;
            break;
          }
        }
      }
      for (std::size_t k = 0; k < n; ++k) {
        if (!calls[k] || !calls[k]->done.load(std::memory_order_acquire)) continue;
        const AppResource& entry = c_.resources[initialized_[k]];
        if (calls[k]->error) {
          c_.record(
              {FailureKind::close_failed, entry.name, describe(calls[k]->error), calls[k]->error});
        } else {
          c_.log(LogLevel::info, "resource " + entry.name + " closed in " +
                                     std::to_string(ms_since(calls[k]->started)) + " ms");
        }
        finish_call(*calls[k]);
        calls[k].reset();
        step[k] = Step::closed;
        ++closed;
        for (std::size_t d : entry.deps) {
          if (pos[d] < n) --dependents[pos[d]];
        }
      }
    }
    if (closed == n) return;
    for (std::size_t k = 0; k < n; ++k) {
      const std::string& name = c_.resources[initialized_[k]].name;
      const std::string limit = std::to_string(ms_of(c_.opts.shutdown_timeout)) + " ms";
      if (step[k] == Step::closing) {
        c_.record({FailureKind::close_timed_out, name,
                   "close did not return within shutdown_timeout (" + limit + ")", nullptr});
        finish_call(*calls[k]);
      } else if (step[k] == Step::waiting) {
        c_.record({FailureKind::close_timed_out, name,
                   "not closed: resources using it were still closing at the shutdown deadline (" +
                       limit + ")",
                   nullptr});
      }
    }
  }

  std::shared_ptr<AppCore> core_;
  AppCore& c_;
  SignalWatcher signals_;
  std::vector<std::size_t> initialized_;  // entry indices, in init order
  std::thread keeper_;
  std::thread main_;
};

}  // namespace
}  // namespace detail

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
  try {
    const FailureKind kind =
        state() == AppState::init ? FailureKind::init_failed : FailureKind::reported;
    core_->record({kind, std::string(source), std::string(message), nullptr});
  } catch (...) {
    core_->request_halt();
  }
}

void Context::fail(std::string_view source, std::exception_ptr error) const noexcept {
  try {
    const FailureKind kind =
        state() == AppState::init ? FailureKind::init_failed : FailureKind::reported;
    core_->record({kind, std::string(source), detail::describe(error), error});
  } catch (...) {
    core_->request_halt();
  }
}

void Context::log(LogLevel level, std::string_view message) const noexcept {
  core_->log(level, message);
}

// Application

Application::Application(ApplicationOptions options) {
  using std::chrono::nanoseconds;
  if (options.name.empty()) detail::invalid("ApplicationOptions.name", "must not be empty");
  const std::pair<const char*, nanoseconds> durations[] = {
      {"init_timeout", options.init_timeout},
      {"termination_timeout", options.termination_timeout},
      {"shutdown_timeout", options.shutdown_timeout},
      {"ping_period", options.ping_period},
      {"ping_timeout", options.ping_timeout},
  };
  for (const auto& [field, d] : durations) {
    if (d <= nanoseconds{0}) {
      detail::invalid(std::string("ApplicationOptions.") + field, "must be positive");
    }
  }
  if (options.pool_shutdown_timeout < nanoseconds{0}) {
    detail::invalid("ApplicationOptions.pool_shutdown_timeout", "must not be negative");
  }
  std::set<int> seen;
  for (int s : options.signals) {
    const std::string field = "ApplicationOptions.signals";
    if (s <= 0 || s >= NSIG) detail::invalid(field, std::to_string(s) + " is not a signal number");
    if (s == SIGKILL || s == SIGSTOP)
      detail::invalid(field, "SIGKILL and SIGSTOP cannot be caught");
    if (s == SIGSEGV || s == SIGBUS || s == SIGFPE || s == SIGILL || s == SIGTRAP || s == SIGSYS) {
      detail::invalid(field, detail::signal_name(s) + " is a fault signal; it cannot mean halt");
    }
    if (!seen.insert(s).second) detail::invalid(field, detail::signal_name(s) + " is listed twice");
  }
  core_ = std::make_shared<detail::AppCore>(std::move(options));
}

Application::~Application() = default;

void Application::add_resource(std::shared_ptr<Resource> resource, ResourceOptions options) {
  const std::string field = "ResourceOptions";
  if (core_->started.load()) detail::invalid("Application::add_resource", "run() has started");
  if (!resource) detail::invalid("Application::add_resource", "resource is null");
  if (options.name.empty()) detail::invalid(field + ".name", "must not be empty");
  auto& entries = core_->resources;
  auto index_of = [&entries](const std::string& name) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name == name) return i;
    }
    return entries.size();
  };
  if (index_of(options.name) != entries.size()) {
    detail::invalid(field + ".name", "'" + options.name + "' is registered already");
  }
  detail::AppResource entry{std::move(resource), options.name, {}};
  for (const std::string& dep : options.depends_on) {
    const std::size_t i = index_of(dep);
    if (i == entries.size()) {
      detail::invalid(field + ".depends_on", "'" + options.name + "' depends on '" + dep +
                                                 "', which is not registered before it");
    }
    entry.deps.push_back(i);
  }
  entries.push_back(std::move(entry));
}

void Application::add_pool(Pool& pool) {
  if (core_->started.load()) detail::invalid("Application::add_pool", "run() has started");
  if (std::find(core_->pools.begin(), core_->pools.end(), &pool) != core_->pools.end()) {
    detail::invalid("Application::add_pool",
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
    detail::Controller controller(core_);
    return static_cast<int>(controller.run(std::move(main)));
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

AppState Application::state() const noexcept { return core_->state.load(); }

Context Application::context() const noexcept { return detail::AppCore::context_of(core_); }

std::optional<Failure> Application::failure() const {
  detail::MutexLock lock(core_->mu);
  return core_->failure;
}

const ApplicationOptions& Application::options() const noexcept { return core_->opts; }

}  // namespace crew
