// The lifecycle controller: the thread in Application::run(). It makes every
// state transition (init -> running -> halting -> shutdown -> off, or
// init -> shutdown), initializes the resources, starts main and the keeper,
// waits for main within the termination timeout (not after shutdown_now()),
// and runs the shutdown:
// cancel the context, shut the pools down, stop the keeper, wait for main,
// close the resources. The first failure decides the exit code.
//
// Who touches what:
//   the controller  AppCore::state, the halt and cancel sources, keeper_stop;
//                   owns the signal watcher, main's and the keeper's threads,
//                   the list of initialized resources, and the threads that
//                   shut pools down (one per pool, joined before it goes on)
//   main's thread   runs main; sets main_done
//   any thread      may halt, fail or signal meanwhile: the controller sees
//                   it through the core's fields under AppCore::mu
#include "app_controller.hpp"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/pool.hpp"
#include "resource_calls.hpp"
#include "signals.hpp"
#include "thread_name.hpp"

namespace crew::detail {
namespace {

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
    if (std::string err = signals_.start(c_.opts.signals, c_.opts.name,
                                         [core = core_](int signo) { core->on_signal(signo); });
        !err.empty()) {
      c_.record({FailureKind::init_failed, "signals", err, nullptr});
      return abort_startup();
    }
    if (!init_resources()) return abort_startup();

    transition(AppState::running);
    start_keeper();
    start_main(std::move(main));

    bool halted = false;
    bool hard = false;
    {
      MutexLock lock(c_.mu);
      while (!c_.halt_requested && !c_.main_done) c_.changed.wait(lock.native());
      halted = c_.halt_requested;
      hard = c_.stop_now;  // shutdown_now(): no halting state, no wait for main
    }
    if (halted && !hard) {
      transition(AppState::halting);
      c_.log(LogLevel::info, "halting: main has " +
                                 std::to_string(ms_of(c_.opts.termination_timeout)) +
                                 " ms to return");
      const auto deadline = after(Clock::now(), c_.opts.termination_timeout);
      bool main_done = false;
      bool forced = false;
      bool stop_now = false;
      {
        MutexLock lock(c_.mu);
        while (!c_.main_done && !c_.hard_requested()) {
          if (!wait_or_timeout(c_.changed, lock.native(), deadline)) break;
        }
        main_done = c_.main_done;
        forced = c_.forced;
        stop_now = c_.stop_now;
      }
      // shutdown_now() recorded its own failure; it goes hard even when main
      // has returned meanwhile.
      if (stop_now) {
        hard = true;
      } else if (!main_done) {
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
    bool hard = false;
    {
      MutexLock lock(c_.mu);
      hard = c_.hard_requested();
    }
    cancel_context();
    shut_down_pools(hard);
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
      } else if (end.forced && end.stop_now) {
        c_.log(LogLevel::info, "init of " + entry.name + " left behind: shutdown_now() was called");
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
    bool forced = false;     // a second signal or shutdown_now(): stop waiting
    bool stop_now = false;   // shutdown_now() (or a failure that stops at once)
    bool stop_sent = false;  // its token was stopped because of a halt
  };

  // Waits for an init call until it returns, the deadline passes or a second
  // signal forces the hard path. A halt stops the call's token.
  Wait wait_call(AppCall& call, Clock::time_point deadline) {
    Wait w;
    w.stop_sent = wait_for_calls(
        c_, deadline,
        [this, &call, &w] {
          c_.mu.assert_held();
          w.done = call.done.load(std::memory_order_acquire);
          w.forced = c_.hard_requested();
          w.stop_now = c_.stop_now;
          return w.done || w.forced;
        },
        [this] {
          c_.mu.assert_held();
          return c_.halt_requested;
        },
        [&call] { call.stop.request_stop(); });
    return w;
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
    auto start_one = [&one, &threads](std::size_t i, bool hard_now) {
      try {
        threads.emplace_back([&one, i, hard_now] { one(i, hard_now); });
      } catch (...) {
        one(i, hard_now);
      }
    };
    for (std::size_t i = 0; i < n; ++i) start_one(i, hard);
    bool escalate = false;
    bool by_signal = false;
    {
      MutexLock lock(c_.mu);
      while (finished < n && !(c_.hard_requested() && !hard)) c_.changed.wait(lock.native());
      escalate = finished < n;
      by_signal = !c_.stop_now;  // shutdown_now() recorded its own failure
    }
    if (escalate) {
      // A second signal or shutdown_now(): a concurrent hard shutdown makes
      // a running one escalate at once (Pool::shutdown); the first call
      // still reports.
      if (by_signal) {
        c_.record({FailureKind::forced, "signals",
                   "a second signal arrived while the pools were shutting down", nullptr});
      }
      for (std::size_t i = 0; i < n; ++i) start_one(i, true);
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
  // signal); then it is left running and the failure says so. A
  // shutdown_now() meanwhile does not cut this wait: main may be the caller,
  // about to return, and the resources it uses are closed after it.
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

ExitCode run_lifecycle(const std::shared_ptr<AppCore>& core,
                       std::function<void(const Context&)> main) {
  Controller controller(core);
  return controller.run(std::move(main));
}

}  // namespace crew::detail
