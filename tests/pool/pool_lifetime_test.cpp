// Tests of the pool's lifetime and of calls back into it: destruction
// drains (bounded by default), producers and consumers at full speed, a stats handle outliving
// the pool, an idle pool sleeping, pause() against spinning workers,
// nested submission and run_pending_task() (within a share of the stack),
// and wait_idle() refused from the pool's own tasks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/pool.hpp"
#include "os_thread.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;
using test::WorkerHold;

// The workload that deadlocks ants and BS::thread_pool: each task submits
// two subtasks and waits for both, 12 levels deep, on one worker with a
// queue of one slot.
std::uint64_t fan_out(Pool& pool, int depth) {
  if (depth == 0) return 1;
  auto left = pool.submit([&pool, depth] { return fan_out(pool, depth - 1); });
  auto right = pool.submit([&pool, depth] { return fan_out(pool, depth - 1); });
  return left.get() + right.get();
}

TEST(PoolNested, RecursiveSubmitAndWaitNeverDeadlocks) {
  Watchdog dog(60s);
  Pool pool({.max_workers = 1, .queue_capacity = 1});
  auto root = pool.submit([&pool] { return fan_out(pool, 12); });
  EXPECT_EQ(root.get(), 1u << 12);
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.succeeded, s.submitted);
}

TEST(PoolNested, NestedPostOnAFullQueueRunsInline) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 1});
  std::atomic<int> ran{0};
  auto outer = pool.submit([&] {
    for (int i = 0; i < 100; ++i)
      EXPECT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  });
  outer.get();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 100);
}

// Runs `f` on a thread of its own with a stack of `stack_bytes`, and returns
// once the thread has ended.
void run_on_stack(std::size_t stack_bytes, const std::function<void()>& f) {
  detail::OsThread thread(stack_bytes, f);
  thread.join();
}

// Calls `f` once the stack has grown down to `until` (frame addresses, not
// locals': under AddressSanitizer locals may live on a heap fake stack).
[[gnu::noinline]] bool call_below(std::uintptr_t until, const std::function<bool()>& f) {
  volatile char pad[512];
  pad[0] = 1;
  if (reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0)) <= until) return f();
  const bool r = call_below(until, f);
  return r && pad[0] == 1;  // not a tail call: every level keeps its frame
}

// A task run_pending_task() runs nests on the caller's stack: on a thread
// that is not a worker of the pool it runs one only while at most a
// sixteenth of that thread's stack is in use (docs/api.md, "Fork-join"), so
// a caller deep in its own recursion cannot be overflowed by whatever task
// is queued.
TEST(PoolNested, RunPendingTaskOnAnOutsideThreadNestsOnlyOnTheFirstSixteenthOfItsStack) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  WorkerHold hold(pool);  // the only worker is busy
  std::atomic<int> ran{0};
  for (int i = 0; i < 2; ++i) ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  constexpr std::size_t kStack = std::size_t{1} << 20;
  bool shallow = false;
  bool deep = true;
  run_on_stack(kStack, [&] {
    const auto top = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
    shallow = call_below(top - kStack / 64, [&] { return pool.run_pending_task(); });
    deep = call_below(top - kStack / 8, [&] { return pool.run_pending_task(); });
  });
  EXPECT_TRUE(shallow) << "a sixty-fourth of the stack in use: the task runs";
  EXPECT_FALSE(deep) << "an eighth of the stack in use: the task stays queued";
  EXPECT_EQ(ran.load(), 1);
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 2) << "the task left queued ran on the worker";
}

TEST(PoolNested, RunPendingTaskRunsQueuedWorkOnTheCaller) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  EXPECT_FALSE(pool.run_pending_task());  // nothing queued
  WorkerHold hold(pool);                  // the only worker is busy
  std::thread::id ran_on;
  auto t = pool.submit([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_TRUE(pool.run_pending_task());
  EXPECT_EQ(t.status(), TaskStatus::succeeded);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  pool.pause();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_FALSE(pool.run_pending_task());  // paused: nothing runs
  pool.resume();
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_EQ(s.helped, 1u);  // the one the caller ran; the worker's own are not counted
}

// The crew::Error code `f` throws, or nothing if it returns.
template <class F>
std::optional<Errc> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

// wait_idle() counts every task submitted so far, the caller's own included:
// from a task of the same pool it would wait for itself, so it throws at
// once. Each case runs such a task somewhere the pool counts as its own.
class PoolSelfCalls : public ::testing::Test {
 protected:
  // Posts a plain task that calls pool.wait_idle() and records where it ran
  // and the error it got.
  Admission post_self_wait(Pool& pool) {
    return pool.post([this, &pool] {
      ran_on_ = std::this_thread::get_id();
      seen_ = error_of([&] { (void)pool.wait_idle(); });
    });
  }
  // The task ran on this thread (not on a worker) and was refused there.
  void expect_refused_here() const {
    EXPECT_EQ(ran_on_, std::this_thread::get_id());
    EXPECT_EQ(seen_, Errc::would_deadlock);
  }

  Watchdog dog_;
  std::optional<Errc> seen_;
  std::thread::id ran_on_;
};

TEST_F(PoolSelfCalls, WaitIdleFromATaskOfTheSamePoolThrowsAtOnce) {
  Pool pool({.max_workers = 2});
  auto plain = pool.submit([&pool] { return error_of([&] { (void)pool.wait_idle(); }); });
  auto timed = pool.submit([&pool] { return error_of([&] { (void)pool.wait_idle(1h); }); });
  // Nested: run inline by the outer task's wait, on the same worker.
  auto nested = pool.submit([&pool] {
    return pool.submit([&pool] { return error_of([&] { (void)pool.wait_idle(); }); }).get();
  });
  for (auto* t : {&plain, &timed, &nested}) {
    ASSERT_TRUE(t->wait_for(5s * test::kSlowdown)) << "wait_idle() waited for its own task";
    EXPECT_EQ(t->get(), Errc::would_deadlock);
  }
  EXPECT_TRUE(pool.wait_idle(10s));  // from outside the pool it works as before
}

// A task the pool runs on a thread that is not one of its workers
// (caller_runs here) is one of its tasks just the same.
TEST_F(PoolSelfCalls, WaitIdleFromATaskRunOnTheSubmittersThreadThrowsAtOnce) {
  Pool pool({.max_workers = 1, .queue_capacity = 1, .overflow = Overflow::caller_runs});
  pool.pause();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);  // the queue is full now
  ASSERT_EQ(post_self_wait(pool), Admission::accepted);
  expect_refused_here();
  pool.resume();
  EXPECT_TRUE(pool.wait_idle(10s));
}

// run_pending_task() on an outside thread runs a queued task there.
TEST_F(PoolSelfCalls, WaitIdleFromATaskRunByRunPendingTaskThrowsAtOnce) {
  Pool pool({.max_workers = 1});
  WorkerHold hold(pool);  // the only worker is busy
  ASSERT_EQ(post_self_wait(pool), Admission::accepted);
  ASSERT_TRUE(pool.run_pending_task());
  expect_refused_here();
  hold.release();
  EXPECT_TRUE(pool.wait_idle(10s));
}

TEST(PoolLifetime, DestructionRunsEverythingQueued) {
  Watchdog dog;
  std::atomic<int> ran{0};
  {
    Pool pool({.max_workers = 2});
    pool.pause();
    for (int i = 0; i < 1000; ++i)
      ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  }  // default shutdown: drain (1000 empty tasks take far less than its 10 s)
  EXPECT_EQ(ran.load(), 1000);
}

TEST(PoolLifetime, TheDefaultShutdownIsADrainBoundedByTenSeconds) {
  const PoolOptions o;
  EXPECT_EQ(o.shutdown_mode, ShutdownMode::drain);
  EXPECT_EQ(o.shutdown_timeout, 10s);
}

// A task that ends only when told to (here: when its token is stopped, 60 s
// at most) can no longer hold a plain ~Pool: at the default 10 s the drain
// goes hard, the task's token is stopped and what is still queued is
// rejected.
TEST(PoolLifetime, TheDestructorsDefaultDrainGoesHardAfterTenSeconds) {
  Watchdog dog(60s);
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};
  std::atomic<bool> queued_ran{false};
  std::chrono::steady_clock::time_point t0;
  {
    Pool pool({.max_workers = 1});  // every shutdown option at its default
    ASSERT_EQ(pool.post([&](std::stop_token st) {
      started = true;
      std::mutex mu;
      std::condition_variable_any cv;
      std::unique_lock lock(mu);
      stopped = cv.wait_for(lock, st, 60s, [] { return false; }) || st.stop_requested();
    }),
              Admission::accepted);
    ASSERT_EQ(pool.post([&] { queued_ran = true; }), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return started.load(); }));
    t0 = std::chrono::steady_clock::now();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 10s);
  EXPECT_LT(took, 10s + 5s * test::kSlowdown);
  EXPECT_TRUE(stopped.load());
  EXPECT_FALSE(queued_ran.load());
}

// The bound costs an idle pool nothing: its destructor returns once the
// workers have left, not at the timeout.
TEST(PoolLifetime, AnIdleDefaultPoolIsDestroyedAtOnce) {
  Watchdog dog;
  for (int i = 0; i < 20; ++i) {
    auto pool = std::make_unique<Pool>();
    ASSERT_EQ(pool->post([] {}), Admission::accepted);
    ASSERT_TRUE(pool->wait_idle(10s));
    const auto t0 = std::chrono::steady_clock::now();
    pool.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s * test::kSlowdown);
  }
}

TEST(PoolLifetime, ManyProducersAndConsumersLoseNothing) {
  Watchdog dog(60s);
  constexpr int kProducers = 4;
  const int per = test::kThreadSanitizer ? 20'000 : 200'000;
  Pool pool({.max_workers = 4, .queue_capacity = 256});
  std::atomic<long> sum{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < per; ++i) {
        const long v = p * per + i;
        ASSERT_EQ(pool.post([&sum, v] { sum.fetch_add(v); }), Admission::accepted);
      }
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(pool.wait_idle(30s));
  const long n = static_cast<long>(kProducers) * per;
  EXPECT_EQ(sum.load(), n * (n - 1) / 2);
  EXPECT_EQ(pool.stats().outcomes.succeeded, static_cast<std::uint64_t>(n));
}

TEST(PoolLifetime, AStatsHandleReadsUntilThePoolIsGone) {
  Watchdog dog;
  PoolStatsHandle handle;
  {
    Pool pool({.name = "watched"});
    handle = pool.stats_handle();
    ASSERT_EQ(pool.post([] {}), Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
    const std::optional<PoolStats> s = handle.read();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->outcomes.succeeded, 1u);
    (void)pool.shutdown(ShutdownMode::drain, 0s);
    EXPECT_TRUE(handle.read().has_value());  // stopped, not gone
  }
  EXPECT_EQ(handle.pool_name(), "watched");
  EXPECT_FALSE(handle.read().has_value());
}

TEST(PoolLifetime, AnIdlePoolSleeps) {
  Watchdog dog;
  Pool pool({.min_workers = 2, .max_workers = 2});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  // Process CPU time over a 200 ms window, up to five windows: workers that
  // spin burn it in every one of them, while one window is enough for
  // sleeping workers (a busy machine may delay their last spin past the
  // first window).
  std::vector<double> windows_ms;
  for (int i = 0; i < 5; ++i) {
    const std::clock_t before = std::clock();
    std::this_thread::sleep_for(200ms);
    windows_ms.push_back(1000.0 * static_cast<double>(std::clock() - before) / CLOCKS_PER_SEC);
    if (windows_ms.back() < 20.0) break;
  }
  std::string seen;
  for (const double ms : windows_ms) seen += std::to_string(ms) + " ms ";
  EXPECT_LT(*std::min_element(windows_ms.begin(), windows_ms.end()), 20.0)
      << "idle workers must block, not spin; CPU per 200 ms window: " << seen;
}

// A worker still spinning for work when pause() returns took a task posted
// right after it: pause() promised that no new task starts until resume().
TEST(PoolPause, NoTaskSubmittedAfterPauseStartsBeforeResume) {
  Watchdog dog;
  PoolOptions o;
  o.name = "pause-race";
  o.min_workers = 2;
  o.max_workers = 2;
  o.spin = 20ms;                 // keep the workers spinning between rounds,
  o.spin_when_contended = true;  // also on a busy machine
  Pool pool(std::move(o));
  int early = 0;
  for (int round = 0; round < 300; ++round) {
    std::atomic<int> warm{0};
    for (int i = 0; i < 4; ++i)
      ASSERT_EQ(pool.post([&] { warm.fetch_add(1); }), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return warm.load() == 4; }));
    pool.pause();
    std::atomic<bool> ran{false};
    if (round % 2 == 0) {
      ASSERT_EQ(pool.post([&] { ran = true; }), Admission::accepted);
    } else {
      (void)pool.submit([&] { ran = true; });
    }
    std::this_thread::sleep_for(200us);
    if (ran.load()) ++early;
    pool.resume();
    ASSERT_TRUE(eventually([&] { return ran.load(); }));
  }
  EXPECT_EQ(early, 0) << "tasks started while the pool was paused";
  ASSERT_TRUE(pool.wait_idle(10s));
}

}  // namespace
}  // namespace crew
