// Tests of the signal self-pipe (src/app/signals.hpp) in process, on SIGUSR1 and
// SIGUSR2 only (gtest leaves them alone). raise() runs the handler on the
// calling thread before it returns, so every count below is exact. The
// lifecycle's use of signals is tested with real child processes in
// application_test.
#include "signals.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace crew::detail {
namespace {

using namespace std::chrono_literals;
using test::kSlowdown;
using test::Watchdog;

// What the callback saw, one entry per call.
class Received {
 public:
  void add(int signo) {
    char name[16] = {};
    (void)pthread_getname_np(pthread_self(), name, sizeof name);
    sigset_t mask;
    (void)pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    {
      const std::lock_guard lock(mu_);
      signals_.push_back(signo);
      threads_.push_back(std::this_thread::get_id());
      names_.emplace_back(name);
      blocked_.push_back(sigismember(&mask, SIGUSR1) == 1 && sigismember(&mask, SIGUSR2) == 1);
    }
    cv_.notify_all();
  }
  // True once `n` calls arrived; false after 5 s.
  bool wait_for(std::size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 5s * kSlowdown, [&] { return signals_.size() >= n; });
  }
  std::vector<int> signals() {
    const std::lock_guard lock(mu_);
    return signals_;
  }
  std::vector<std::thread::id> threads() {
    const std::lock_guard lock(mu_);
    return threads_;
  }
  std::vector<std::string> names() {
    const std::lock_guard lock(mu_);
    return names_;
  }
  std::vector<bool> blocked() {
    const std::lock_guard lock(mu_);
    return blocked_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> signals_;
  std::vector<std::thread::id> threads_;
  std::vector<std::string> names_;
  std::vector<bool> blocked_;
};

std::atomic<int> g_previous_calls{0};
void previous_handler(int) { g_previous_calls.fetch_add(1); }

// Installs previous_handler for `signo` for the scope; restores what was there.
class PreviousHandler {
 public:
  explicit PreviousHandler(int signo) : signo_(signo) {
    struct sigaction sa {};
    sa.sa_handler = &previous_handler;
    sigemptyset(&sa.sa_mask);
    EXPECT_EQ(sigaction(signo_, &sa, &saved_), 0);
  }
  PreviousHandler(const PreviousHandler&) = delete;
  PreviousHandler& operator=(const PreviousHandler&) = delete;
  ~PreviousHandler() { (void)sigaction(signo_, &saved_, nullptr); }

 private:
  int signo_;
  struct sigaction saved_ {};
};

using Handler = void (*)(int);
Handler handler_of(int signo) {
  struct sigaction now {};
  EXPECT_EQ(sigaction(signo, nullptr, &now), 0);
  return now.sa_handler;
}

TEST(SignalWatcher, EachSignalCaughtReachesTheCallbackInOrderOnTheReaderThread) {
  Watchdog dog;
  sigset_t caller_before;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &caller_before), 0);
  Received got;
  SignalWatcher watcher;
  ASSERT_EQ(watcher.start({SIGUSR1, SIGUSR2}, "unit", [&got](int s) { got.add(s); }), "");
  for (int s : {SIGUSR1, SIGUSR1, SIGUSR2, SIGUSR1, SIGUSR2}) ASSERT_EQ(raise(s), 0);
  ASSERT_TRUE(got.wait_for(5));
  watcher.stop();

  EXPECT_EQ(got.signals(), (std::vector<int>{SIGUSR1, SIGUSR1, SIGUSR2, SIGUSR1, SIGUSR2}));
  for (const auto& id : got.threads()) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, got.threads().front());  // one reader
  }
  for (const auto& name : got.names()) EXPECT_EQ(name, "unit-signals");
  for (const bool b : got.blocked()) EXPECT_TRUE(b) << "the reader must block what it watches";
  // Only the reader's mask changes.
  sigset_t caller_after;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &caller_after), 0);
  for (int s = 1; s < NSIG; ++s) {
    EXPECT_EQ(sigismember(&caller_before, s), sigismember(&caller_after, s)) << s;
  }
}

TEST(SignalWatcher, StopRestoresThePreviousDispositionsAndIsIdempotent) {
  Watchdog dog;
  const PreviousHandler previous(SIGUSR1);
  const Handler usr2_before = handler_of(SIGUSR2);
  g_previous_calls = 0;
  Received got;
  SignalWatcher watcher;
  ASSERT_EQ(watcher.start({SIGUSR1, SIGUSR2}, "unit", [&got](int s) { got.add(s); }), "");
  EXPECT_NE(handler_of(SIGUSR1), &previous_handler);
  ASSERT_EQ(raise(SIGUSR1), 0);
  ASSERT_TRUE(got.wait_for(1));
  EXPECT_EQ(g_previous_calls.load(), 0);

  watcher.stop();
  EXPECT_EQ(handler_of(SIGUSR1), &previous_handler);
  EXPECT_EQ(handler_of(SIGUSR2), usr2_before);
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_EQ(g_previous_calls.load(), 1);
  watcher.stop();
  EXPECT_EQ(handler_of(SIGUSR1), &previous_handler);
  EXPECT_EQ(got.signals(), (std::vector<int>{SIGUSR1}));
}

TEST(SignalWatcher, OnlyOneWatcherAtATimeHandlesSignals) {
  Watchdog dog;
  Received first_got;
  Received second_got;
  SignalWatcher first;
  SignalWatcher second;
  ASSERT_EQ(first.start({SIGUSR1}, "first", [&first_got](int s) { first_got.add(s); }), "");
  EXPECT_EQ(second.start({SIGUSR1}, "second", [&second_got](int s) { second_got.add(s); }),
            "another Application is handling signals");
  // Undoing the refused start leaves the first one in place.
  second.stop();
  EXPECT_EQ(second.start({SIGUSR2}, "second", [&second_got](int s) { second_got.add(s); }),
            "another Application is handling signals");
  second.stop();
  ASSERT_EQ(raise(SIGUSR1), 0);
  ASSERT_TRUE(first_got.wait_for(1));

  first.stop();
  ASSERT_EQ(second.start({SIGUSR1}, "second", [&second_got](int s) { second_got.add(s); }), "");
  ASSERT_EQ(raise(SIGUSR1), 0);
  ASSERT_TRUE(second_got.wait_for(1));
  second.stop();
  EXPECT_EQ(first_got.signals(), (std::vector<int>{SIGUSR1}));
  EXPECT_EQ(second_got.signals(), (std::vector<int>{SIGUSR1}));
}

TEST(SignalWatcher, AnEmptySetInstallsNothingAndTakesNoOwnership) {
  Watchdog dog;
  const Handler before = handler_of(SIGUSR1);
  SignalWatcher empty;
  EXPECT_EQ(empty.start({}, "unit", [](int) { ADD_FAILURE() << "no signal is watched"; }), "");
  EXPECT_EQ(handler_of(SIGUSR1), before);
  SignalWatcher other;
  EXPECT_EQ(other.start({SIGUSR1}, "unit", [](int) {}), "");
  other.stop();
  empty.stop();
  EXPECT_EQ(handler_of(SIGUSR1), before);
}

// The handler never blocks: with the reader held up, a full pipe drops the
// bytes instead of stalling the thread the signal landed on.
TEST(SignalWatcher, AFullPipeDropsSignalsInsteadOfBlockingTheHandler) {
  Watchdog dog;
  constexpr int kRaised = 100000;  // above the pipe's 64 KiB
  test::Gate gate;
  std::atomic<int> caught{0};
  SignalWatcher watcher;
  ASSERT_EQ(watcher.start({SIGUSR1}, "unit",
                          [&](int) {
                            if (caught.fetch_add(1) == 0) (void)gate.wait();
                          }),
            "");
  for (int i = 0; i < kRaised; ++i) ASSERT_EQ(raise(SIGUSR1), 0);
  gate.open();
  watcher.stop();  // reads what the pipe holds, then returns
  EXPECT_GE(caught.load(), 1);
  EXPECT_LT(caught.load(), kRaised);
}

// A stop() racing a stream of signals: once it has returned, the callback
// never runs again, and every signal went to exactly one handler or was
// dropped by the watcher's own handler after stop() took its pipe away.
// A child of fork() (without exec) does not inherit the watcher: a signal
// sent to it takes the disposition from before the watcher (SIGUSR2's
// default ends the child) and never reaches the parent's callback; and the
// parent's stop() does not wait for the child to exit.
TEST(SignalWatcher, AChildOfForkInheritsNeitherTheHandlerNorThePipe) {
  Watchdog dog;
  Received got;
  SignalWatcher watcher;
  ASSERT_EQ(watcher.start({SIGUSR2}, "unit", [&got](int s) { got.add(s); }), "");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Ends by SIGUSR2 if its default disposition is back; otherwise the
    // inherited handler runs and pause() returns.
    (void)pause();
    _exit(3);
  }
  dog.guard(child);
  std::this_thread::sleep_for(50ms);  // the child reaches pause()
  ASSERT_EQ(kill(child, SIGUSR2), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR2)
      << "the child ran the parent's handler (exit status " << status << ")";
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(got.signals().empty()) << "the child's signal reached the parent's callback";

  // A child that outlives stop(): it holds no copy of the pipe.
  const pid_t sleeper = fork();
  ASSERT_GE(sleeper, 0);
  if (sleeper == 0) {
    std::this_thread::sleep_for(3s);
    _exit(0);
  }
  dog.guard(sleeper);
  const auto t0 = std::chrono::steady_clock::now();
  watcher.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s * kSlowdown);
  (void)kill(sleeper, SIGKILL);
  (void)waitpid(sleeper, &status, 0);
}

TEST(SignalWatcher, NoCallbackRunsAfterStopReturns) {
  Watchdog dog;
  const PreviousHandler previous(SIGUSR1);
  g_previous_calls = 0;
  std::atomic<bool> stopped{false};
  std::atomic<int> caught{0};
  std::atomic<int> late{0};
  SignalWatcher watcher;
  ASSERT_EQ(watcher.start({SIGUSR1}, "unit",
                          [&](int) {
                            if (stopped.load()) late.fetch_add(1);
                            caught.fetch_add(1);
                          }),
            "");
  std::atomic<bool> quit{false};
  std::atomic<int> raised{0};
  std::thread raiser([&] {
    while (!quit.load()) {
      (void)raise(SIGUSR1);  // lands on this thread: its handler runs before raise returns
      raised.fetch_add(1);
    }
  });
  ASSERT_TRUE(test::eventually([&] { return caught.load() >= 100; }));
  watcher.stop();
  stopped = true;
  const int caught_at_stop = caught.load();
  ASSERT_TRUE(test::eventually([&] { return g_previous_calls.load() >= 100; }));
  quit = true;
  raiser.join();
  EXPECT_EQ(late.load(), 0);
  EXPECT_EQ(caught.load(), caught_at_stop);
  EXPECT_LE(caught.load() + g_previous_calls.load(), raised.load());
}

}  // namespace
}  // namespace crew::detail
