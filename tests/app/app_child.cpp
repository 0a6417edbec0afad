// app_child: an Application in a small process, for tests/app/application_test.cpp.
//
//   app_child SCENARIO
//
// Runs one lifecycle scenario and writes every call it sees to stdout, one
// line each, "<ms since start> <event>" (resource calls, main, pool tasks,
// the halt and stop tokens, state changes, the application's log lines
// prefixed "log"). Lines are written whole under a mutex, so their order is
// the order of the calls. The test sends signals to this process and checks
// the lines, the exit code and the timing.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <crew/application.hpp>
#include <crew/pool.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>

using namespace std::chrono_literals;

namespace {

const auto g_start = std::chrono::steady_clock::now();
std::mutex g_out_mu;

void event(const std::string& text) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - g_start)
                      .count();
  const std::string line = std::to_string(ms) + " " + text + "\n";
  const std::lock_guard lock(g_out_mu);
  std::size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = write(1, line.data() + off, line.size() - off);
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

// Sleeps until the token is stopped or the limit passes; true if stopped.
bool sleep_unless_stopped(std::stop_token token, std::chrono::milliseconds limit) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  return cv.wait_for(lock, token, limit, [] { return false; }) || token.stop_requested();
}

// Application log lines become events "log <message>", without the
// "application child: " prefix.
class EventLogger final : public crew::Logger {
 public:
  [[nodiscard]] crew::LogLevel level() const noexcept override { return crew::LogLevel::debug; }
  void log(crew::LogLevel, const crew::LogContext& ctx,
           std::string_view message) noexcept override {
    constexpr std::string_view prefix = "application child: ";
    if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
    try {
      event((ctx.pool.empty() ? "log " : "pool log ") + std::string(message));
    } catch (...) {
    }
  }
};

enum class Act {
  ok,
  fail,       // throws
  hang,       // sleeps 3 s, ignoring its token
  wait_stop,  // waits for its token (5 s at most), then throws
};

struct Behavior {
  Act init = Act::ok;
  Act ping = Act::ok;
  int bad_ping = 0;  // the ping number (1-based) that does `ping`; 0 = none
  Act close = Act::ok;
};

void act(Act a, const crew::ResourceCall& call, const std::string& what) {
  switch (a) {
    case Act::ok:
      return;
    case Act::fail:
      throw std::runtime_error(what + " failed");
    case Act::hang:
      std::this_thread::sleep_for(3s);
      return;
    case Act::wait_stop:
      if (sleep_unless_stopped(call.stop_token, 5000ms))
        throw std::runtime_error(what + " stopped");
      return;
  }
}

class Probe final : public crew::Resource {
 public:
  Probe(std::string name, Behavior b) : name_(std::move(name)), b_(b) {}

  void init(const crew::ResourceCall& call) override {
    event("init " + name_);
    act(b_.init, call, "init " + name_);
    event("init " + name_ + " done");
  }
  void ping(const crew::ResourceCall& call) override {
    ++pings_;
    event("ping " + name_);
    if (pings_ == b_.bad_ping) act(b_.ping, call, "ping " + name_);
  }
  void close(const crew::ResourceCall& call) override {
    event("close " + name_);
    // Long enough that a dependency closed too early would be seen first.
    std::this_thread::sleep_for(20ms);
    act(b_.close, call, "close " + name_);
    event("close " + name_ + " done");
  }

 private:
  std::string name_;
  Behavior b_;
  int pings_ = 0;  // pings never overlap
};

enum class Main {
  wait_halt,      // waits for the halt, hands two tasks to the pool, returns
  leave_long,     // waits for the halt, hands the pool a 30 s task, returns
  ignore_halt,    // waits for the context's stop token only
  stuck,          // ignores both tokens
  throws,         // throws 100 ms after it started
  throw_on_halt,  // throws when halted
  shutdown_now,   // hands the pool a 30 s task, then calls shutdown_now()
};

struct Scenario {
  crew::ApplicationOptions opts;
  Behavior db;
  Behavior cache;
  Main main = Main::wait_halt;
  std::chrono::nanoseconds pool_timeout = 2s;  // the pool's shutdown_timeout
  std::optional<crew::PingFailure> db_on_ping_failure{};
};

crew::ApplicationOptions base_options() {
  return {.name = "child",
          .init_timeout = 2s,
          .termination_timeout = 3s,
          .shutdown_timeout = 2s,
          .ping_period = 10s,
          .ping_timeout = 1s};
}

bool make_scenario(const std::string& name, Scenario& s) {
  s.opts = base_options();
  if (name == "clean") return true;
  if (name == "usr1_only") {
    s.opts.signals = {SIGUSR1};
    return true;
  }
  if (name == "signals_off") {
    s.opts.signals = {};
    return true;
  }
  if (name == "termination_timeout") {
    s.opts.termination_timeout = 300ms;
    s.main = Main::ignore_halt;
    return true;
  }
  if (name == "second_signal_in_drain") {
    s.opts.pool_shutdown_timeout = 0s;  // the drain is bounded by nothing
    s.pool_timeout = 0s;
    s.main = Main::leave_long;
    return true;
  }
  if (name == "second_signal") {
    s.opts.termination_timeout = 10s;
    s.main = Main::ignore_halt;
    return true;
  }
  if (name == "stuck_main") {
    s.opts.termination_timeout = 200ms;
    s.opts.shutdown_timeout = 300ms;
    s.main = Main::stuck;
    return true;
  }
  if (name == "init_failure") {
    s.cache.init = Act::fail;
    return true;
  }
  if (name == "init_timeout") {
    s.opts.init_timeout = 300ms;
    s.cache.init = Act::hang;
    return true;
  }
  if (name == "halt_during_init") {
    s.opts.init_timeout = 10s;
    s.cache.init = Act::wait_stop;
    return true;
  }
  if (name == "ping_failure") {
    s.opts.ping_period = 50ms;
    s.db.ping = Act::fail;
    s.db.bad_ping = 3;
    return true;
  }
  if (name == "ping_failure_shutdown_now") {
    s.opts.ping_period = 50ms;
    s.db.ping = Act::fail;
    s.db.bad_ping = 3;
    s.db_on_ping_failure = crew::PingFailure::shutdown_now;
    s.main = Main::ignore_halt;
    return true;
  }
  if (name == "ping_timeout") {
    s.opts.ping_period = 50ms;
    s.opts.ping_timeout = 100ms;
    s.db.ping = Act::hang;
    s.db.bad_ping = 3;
    return true;
  }
  if (name == "close_timeout") {
    s.opts.shutdown_timeout = 300ms;
    s.db.close = Act::hang;
    return true;
  }
  if (name == "main_throws") {
    s.main = Main::throws;
    return true;
  }
  if (name == "shutdown_now") {
    s.opts.termination_timeout = 10s;
    s.main = Main::shutdown_now;
    return true;
  }
  if (name == "throw_on_halt") {
    s.main = Main::throw_on_halt;
    return true;
  }
  return false;
}

// A long pool task: finishes after `ms`, or earlier when its token stops.
void pool_task(crew::Pool& pool, int id, int ms) {
  const crew::Admission a = pool.post([id, ms](std::stop_token st) {
    event("task " + std::to_string(id) + " started");
    const bool stopped = sleep_unless_stopped(st, std::chrono::milliseconds(ms));
    event("task " + std::to_string(id) + (stopped ? " stopped" : " done"));
  });
  if (a != crew::Admission::accepted) event("task " + std::to_string(id) + " refused");
}

}  // namespace

int main(int argc, char** argv) {
  Scenario s;
  if (argc != 2 || !make_scenario(argv[1], s)) {
    std::fprintf(stderr, "usage: app_child SCENARIO\n");
    return 2;
  }
  s.opts.on_state_change = [](crew::AppState st) {
    event("state " + std::string(crew::to_string(st)));
  };
  const auto logger = std::make_shared<EventLogger>();
  s.opts.logger = logger;

  crew::Pool pool({.name = "work",
                   .max_workers = 2,
                   .shutdown_mode = crew::ShutdownMode::drain,
                   .shutdown_timeout = s.pool_timeout,
                   .abandon_grace = 200ms,
                   .logger = logger});
  crew::Application app(s.opts);
  app.add_resource(std::make_shared<Probe>("db", s.db),
                   {.name = "db", .on_ping_failure = s.db_on_ping_failure});
  app.add_resource(std::make_shared<Probe>("cache", s.cache),
                   {.name = "cache", .depends_on = {"db"}});
  app.add_pool(pool);
  const crew::Context ctx = app.context();
  const std::stop_callback on_halt(ctx.halt_token(), [] { event("halt token"); });
  const std::stop_callback on_cancel(ctx.stop_token(), [] { event("context cancelled"); });

  const Main mode = s.main;
  const int code = app.run([&pool, mode](const crew::Context& c) {
    event("main start");
    switch (mode) {
      case Main::wait_halt:
        (void)sleep_unless_stopped(c.halt_token(), 30000ms);
        event("main halt seen");
        // Work accepted just before the halt: the pool must finish it.
        pool_task(pool, 1, 150);
        pool_task(pool, 2, 150);
        break;
      case Main::leave_long:
        (void)sleep_unless_stopped(c.halt_token(), 30000ms);
        pool_task(pool, 3, 30000);
        break;
      case Main::ignore_halt:
        pool_task(pool, 1, 30000);
        (void)sleep_unless_stopped(c.stop_token(), 30000ms);
        event("main cancelled");
        break;
      case Main::stuck:
        std::this_thread::sleep_for(30s);
        break;
      case Main::throws:
        std::this_thread::sleep_for(100ms);
        event("main throw");
        throw std::runtime_error("main gave up");
      case Main::throw_on_halt:
        (void)sleep_unless_stopped(c.halt_token(), 30000ms);
        event("main throw");
        throw std::runtime_error("flush failed while halting");
      case Main::shutdown_now:
        pool_task(pool, 1, 30000);
        std::this_thread::sleep_for(100ms);
        event("main shutdown_now");
        c.shutdown_now("main", "corrupted state");
        (void)sleep_unless_stopped(c.stop_token(), 30000ms);
        event("main cancelled");
        break;
    }
    event("main return");
  });
  event("exit " + std::to_string(code));
  if (mode == Main::stuck) {
    // main's thread is still running; leave without running destructors.
    std::_Exit(code);
  }
  return code;
}
