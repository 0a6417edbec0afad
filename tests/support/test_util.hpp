// tests/support/test_util.hpp: helpers shared by crew's tests.
//
// Every concurrency test holds a Watchdog: if the test has not finished when
// it fires, the process prints the test's name and aborts, so a deadlock
// fails fast (with a core and a stack in gdb) instead of hanging CI.
#pragma once

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/error.hpp"
#include "crew/pool_types.hpp"

namespace crew::test {

// The sanitizer the tests run under: g++ says so by macro, clang by
// __has_feature.
#if defined(__has_feature)
#define CREW_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define CREW_TEST_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || CREW_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#if defined(__SANITIZE_THREAD__) || CREW_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#undef CREW_TEST_HAS_FEATURE

// Sanitizers slow everything down; bounds scale with it.
inline constexpr int kSlowdown = kAddressSanitizer || kThreadSanitizer ? 5 : 1;

class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit = std::chrono::seconds(30))
      : name_(current_test_name()), thread_([this, limit] { watch(limit * kSlowdown); }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      const std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // A child process to SIGKILL before aborting, so that a test that hangs
  // leaves nothing running.
  void guard(pid_t pid) {
    const std::lock_guard lock(mu_);
    if (pid > 0) pids_.push_back(pid);
  }

 private:
  static std::string current_test_name() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return info == nullptr ? "?" : std::string(info->test_suite_name()) + "." + info->name();
  }
  void watch(std::chrono::seconds limit) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
      std::fprintf(stderr, "\nwatchdog: %s did not finish within %lld s; aborting\n", name_.c_str(),
                   static_cast<long long>(limit.count()));
      std::fflush(stderr);
      for (const pid_t p : pids_) ::kill(p, SIGKILL);
      std::abort();
    }
  }

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::vector<pid_t> pids_;
  std::thread thread_;
};

// The path of a program built beside this test: `relative` taken from the
// directory of this test's executable (/proc/self/exe). CMake hands such paths
// to the tests relative, never absolute: an absolute path inside a -D value
// made every file compiled with it miss ccache in a clone at another path
// (CCACHE_BASEDIR rewrites the paths of a command line, not a macro's value).
inline std::string beside_this_test(const std::string& relative) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self);
  if (n <= 0 || static_cast<std::size_t>(n) == sizeof self) {
    throw std::runtime_error("cannot read /proc/self/exe");
  }
  std::string dir(self, static_cast<std::size_t>(n));
  dir.resize(dir.rfind('/') + 1);
  return dir + relative;
}

// CPU time a thread has used, in milliseconds (0 if it cannot be read).
inline double thread_cpu_ms(pthread_t thread) {
  clockid_t clock{};
  if (pthread_getcpuclockid(thread, &clock) != 0) return 0;
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// Polls `pred` until it holds or `limit` passes. Returns the last value.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit * kSlowdown;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A one-shot gate: tasks block in wait() until open() (bounded by a limit so
// a forgotten open() cannot hang a test).
class Gate {
 public:
  void open() {
    {
      const std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::seconds limit = std::chrono::seconds(20)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit * kSlowdown, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Holds `n` workers of a pool (anything with post()) in tasks until
// release() or its destruction, so that tasks posted meanwhile stay queued.
// The constructor returns once all n tasks run, and fails the test if they
// do not within eventually()'s bound (then the tasks may still start later
// and hold their workers until released). A task waits at most Gate's limit. The tasks
// share their state with the hold, so it may be destroyed before they
// return; declare it after the pool, so that it lets the workers go before
// the pool's destructor waits for them.
class WorkerHold {
 public:
  template <class P>
  explicit WorkerHold(P& pool, int n = 1) : s_(std::make_shared<Shared>()) {
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(pool.post([s = s_] {
        s->running.fetch_add(1);
        (void)s->gate.wait();
      }),
                Admission::accepted);
    }
    EXPECT_TRUE(eventually([this, n] { return s_->running.load() == n; }))
        << s_->running.load() << " of " << n << " holding tasks started";
  }
  WorkerHold(const WorkerHold&) = delete;
  WorkerHold& operator=(const WorkerHold&) = delete;
  ~WorkerHold() { release(); }

  void release() { s_->gate.open(); }

 private:
  struct Shared {
    std::atomic<int> running{0};
    Gate gate;
  };
  std::shared_ptr<Shared> s_;
};

// A capture that notes its own destruction, late: its destructor sleeps
// `delay`, then sets the flag. A moved-from probe notes nothing.
struct DestructionProbe {
  explicit DestructionProbe(std::atomic<bool>* flag,
                            std::chrono::milliseconds pause = std::chrono::milliseconds(50))
      : f(flag), delay(pause) {}
  DestructionProbe(DestructionProbe&& o) noexcept
      : f(std::exchange(o.f, nullptr)), delay(o.delay) {}
  DestructionProbe(const DestructionProbe&) = delete;
  DestructionProbe& operator=(const DestructionProbe&) = delete;
  DestructionProbe& operator=(DestructionProbe&&) = delete;
  ~DestructionProbe() {
    if (f == nullptr) return;
    std::this_thread::sleep_for(delay);
    f->store(true);
  }
  std::atomic<bool>* f;
  std::chrono::milliseconds delay;
};

// Options of a pool with exactly `n` workers, all started at once.
inline PoolOptions fixed_workers(std::string name, std::size_t n) {
  PoolOptions o;
  o.name = std::move(name);
  o.min_workers = n;
  o.max_workers = n;
  return o;
}

// fixed_workers with the overload controller set to `overload`.
inline PoolOptions overloaded_workers(std::string name, std::size_t n, OverloadOptions overload) {
  PoolOptions o = fixed_workers(std::move(name), n);
  o.overload = overload;
  return o;
}

// A cooperative long task's body: returns once `stop` is requested, checking
// every `poll`.
inline void until_stopped(const std::stop_token& stop,
                          std::chrono::microseconds poll = std::chrono::milliseconds(1)) {
  while (!stop.stop_requested()) std::this_thread::sleep_for(poll);
}

// A cooperative long task: counts `started` down, then returns once its
// token is stopped (polled every 100 us).
inline auto cooperative(std::latch& started) {
  return [&started](std::stop_token stop) {  // NOLINT(performance-unnecessary-value-param)
    started.count_down();
    until_stopped(stop, std::chrono::microseconds(100));
  };
}

}  // namespace crew::test
