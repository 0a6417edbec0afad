// crew::fork and crew::Forked (crew/coro.hpp): forked children of a
// coroutine task, joined inline or after another worker took them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "coro_test_util.hpp"
#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::FrameGuard;
using test::Watchdog;

Co<long> fib(int n) {
  if (n < 2) co_return n;
  Forked<long> a = fork(fib(n - 1));
  const long b = co_await fib(n - 2);
  co_return co_await a + b;
}

long fib_plain(int n) { return n < 2 ? n : fib_plain(n - 1) + fib_plain(n - 2); }

// Read again after a suspension (coro_traps_test.cpp: pthread_self() is
// declared const, and a compiler may reuse its value across one).
[[gnu::noinline]] std::thread::id thread_now() {
  asm volatile("" ::: "memory");
  return std::this_thread::get_id();
}
[[gnu::noinline]] std::uintptr_t stack_here() {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

TEST(CoroFork, FibOnTheDefaultPoolOneWorkerAndTwo) {
  Watchdog dog;
  Pool def;
  EXPECT_EQ(spawn(def, fib(22)).get(), fib_plain(22));
  Pool one({.min_workers = 1, .max_workers = 1});
  EXPECT_EQ(spawn(one, fib(22)).get(), fib_plain(22));
  Pool two({.min_workers = 2, .max_workers = 2});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(spawn(two, fib(18)).get(), fib_plain(18));
  // Forks are steps, not tasks: one submission and one outcome per spawn.
  two.wait_idle();
  const PoolStats st = two.stats();
  EXPECT_EQ(st.submitted, 20u);
  EXPECT_EQ(st.outcomes.succeeded, 20u);
}

// 30 million forks on two workers whose stacks are 8 MiB, in every build
// (a recursion 35 levels deep of joins that each run their child by
// symmetric transfer or suspend): 1 s in release, 8 s under ASan, 20 s
// under TSan on two quiet CPUs.
TEST(CoroFork, FibThirtyFiveOnTwoWorkersWithEightMiBStacks) {
  Watchdog dog(std::chrono::seconds(120));
  PoolOptions o{.min_workers = 2, .max_workers = 2};
  o.stack_size = std::size_t{8} << 20;
  Pool pool(o);
  EXPECT_EQ(spawn(pool, fib(35)).get(), 9227465);
}

// Ten children per node, joined in the order they were forked (the
// newest cell is on top, so most joins find another child's cell there).
Co<long> tree(int depth) {
  if (depth == 0) co_return 1;
  std::vector<Forked<long>> kids;
  for (int i = 0; i < 10; ++i) kids.push_back(fork(tree(depth - 1)));
  long sum = 0;
  for (auto& k : kids) sum += co_await k;
  co_return sum;
}

TEST(CoroFork, ManyChildrenJoinedInForkOrder) {
  Watchdog dog;
  Pool pool({.min_workers = 2, .max_workers = 2});
  EXPECT_EQ(spawn(pool, tree(5)).get(), 100000);
  pool.wait_idle();
  // The steps of children joined before a worker took them are no tasks:
  // wait_idle() does not wait for them, and the workers drop them soon.
  EXPECT_TRUE(eventually([&] { return pool.stats().queued == 0; }));
}

// A chain of forks 100,000 deep: each join runs its child by symmetric
// transfer, so the stack does not grow (a pool's worker has 8 MiB at most
// by default; a nested call per level would need far more), and the join
// takes its child's cell back, so the queues do not fill with them.
struct Depth {
  std::atomic<std::uintptr_t> high{0};
  std::atomic<std::uintptr_t> low{UINTPTR_MAX};
  void see(std::uintptr_t here) {
    std::uintptr_t h = high.load();
    while (here > h && !high.compare_exchange_weak(h, here)) {
    }
    std::uintptr_t l = low.load();
    while (here < l && !low.compare_exchange_weak(l, here)) {
    }
  }
};

Co<int> chain(int n, Depth* d) {
  d->see(stack_here());
  if (n == 0) co_return 0;
  Forked<int> f = fork(chain(n - 1, d));
  const int below = co_await f;
  d->see(stack_here());
  co_return below + 1;
}

TEST(CoroFork, ADeepChainNeitherGrowsTheStackNorFillsTheQueue) {
  Watchdog dog(60s);
  for (std::size_t workers : {1u, 2u}) {
    Pool pool({.min_workers = workers, .max_workers = workers, .queue_capacity = 1024});
    Depth d;
    Task<int> t = spawn(pool, chain(100000, &d));
    // Sampled while it runs: without the joins taking their children's
    // steps back, the 100,000 would fill the worker's queue (512) and the
    // shared one (1024).
    std::size_t most_queued = 0;
    while (!t.wait_for(1ms)) most_queued = std::max(most_queued, pool.stats().queued);
    EXPECT_EQ(t.get(), 100000);
    EXPECT_LT(most_queued, 64u);
    // On one worker every frame runs on its one stack; on two, each
    // stack's spread is at most this too (the highest and lowest of both
    // stacks would be far apart, hence the one-worker figure alone).
    if (workers == 1) {
      EXPECT_LT(d.high.load() - d.low.load(), 64u * 1024) << "the stack grew";
    }
    pool.wait_idle();
    EXPECT_EQ(pool.stats().outcomes.succeeded, 1u);
    EXPECT_TRUE(eventually([&] { return pool.stats().queued == 0; }));
  }
}

// The child is taken by the other worker while its parent keeps the first
// one busy; the parent then finds it started and suspends at the join, and
// the thread that ends the child goes on with the parent.
TEST(CoroFork, AStolenChildResumesItsJoinerOnItsOwnThread) {
  Watchdog dog;
  Pool pool({.min_workers = 2, .max_workers = 2});
  std::atomic<bool> child_started{false};
  std::atomic<bool> parent_joining{false};
  std::thread::id child_thread, parent_before, parent_after;
  auto child = [&]() -> Co<int> {
    child_thread = thread_now();
    child_started = true;
    // Until the parent is at its join, and then a little longer, so that
    // it is suspended there when this ends.
    (void)eventually([&] { return parent_joining.load(); });
    std::this_thread::sleep_for(20ms);
    co_return 7;
  };
  auto parent = [&]() -> Co<int> {
    parent_before = thread_now();
    Forked<int> f = fork(child());
    const bool taken = eventually([&] { return child_started.load(); });
    parent_joining = true;
    const int v = co_await f;
    parent_after = thread_now();
    co_return taken ? v : -1;
  };
  EXPECT_EQ(spawn(pool, parent()).get(), 7);
  EXPECT_NE(child_thread, parent_before);
  EXPECT_EQ(parent_after, child_thread);
}

TEST(CoroFork, AChildsExceptionIsThrownAtItsJoin) {
  Watchdog dog;
  Pool pool({.min_workers = 2, .max_workers = 2});
  auto thrower = [](int n) -> Co<int> {
    if (n == 3) throw std::runtime_error("child 3");
    co_return n;
  };
  auto parent = [&]() -> Co<int> {
    std::vector<Forked<int>> kids;
    for (int i = 0; i < 6; ++i) kids.push_back(fork(thrower(i)));
    int sum = 0;
    int caught = 0;
    for (auto& k : kids) {
      try {
        sum += co_await k;
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "child 3");
        ++caught;
      }
    }
    co_return caught == 1 ? sum : -1;
  };
  EXPECT_EQ(spawn(pool, parent()).get(), 0 + 1 + 2 + 4 + 5);
  // Uncaught, it fails the task.
  auto rethrows = [&]() -> Co<int> {
    Forked<int> f = fork(thrower(3));
    co_return co_await f;
  };
  Task<int> t = spawn(pool, rethrows());
  EXPECT_THROW((void)t.get(), std::runtime_error);
  EXPECT_EQ(t.status(), TaskStatus::failed);
}

TEST(CoroFork, AForkedChildCannotSuspendItsTask) {
  Watchdog dog;
  Pool pool({.min_workers = 2, .max_workers = 2});
  auto sleeper = []() -> Co<int> {
    co_await sleep_for(1ms);
    co_return 1;
  };
  auto nested = [&]() -> Co<int> { co_return co_await sleeper(); };
  auto parent = [&]() -> Co<int> {
    int codes = 0;
    for (int i = 0; i < 2; ++i) {
      Forked<int> f = i == 0 ? fork(sleeper()) : fork(nested());
      try {
        (void)co_await f;
      } catch (const Error& e) {
        if (e.code() == Errc::wait_in_fork) ++codes;
      }
    }
    // The parent itself still may.
    co_await sleep_for(1ms);
    co_return codes;
  };
  EXPECT_EQ(spawn(pool, parent()).get(), 2);
}

TEST(CoroFork, ForkOutsideACoroutineTaskThrows) {
  auto body = []() -> Co<int> { co_return 1; };
  try {
    (void)fork(body());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
  }
}

// A stopped task starts no more children: a join of one not started throws
// the stop's error, and the task ends cancelled. Children that were running
// finish.
TEST(CoroFork, AStoppedTaskStartsNoMoreChildren) {
  Watchdog dog;
  Pool pool({.min_workers = 2, .max_workers = 2});
  std::atomic<int> ran{0};
  std::atomic<int> thrown{0};
  std::atomic<bool> running{false};
  auto child = [&]() -> Co<void> {
    ran.fetch_add(1);
    co_return;
  };
  auto parent = [&]() -> Co<void> {
    running = true;
    // Until the task is stopped: the forks below come after the stop.
    (void)eventually([] { return current_stop_token().stop_requested(); });
    std::vector<Forked<void>> kids;
    for (int i = 0; i < 8; ++i) kids.push_back(fork(child()));
    for (auto& k : kids) {
      try {
        co_await k;
      } catch (const Error& e) {
        if (e.code() == Errc::cancelled) thrown.fetch_add(1);
      }
    }
  };
  Task<void> t = spawn(pool, parent());
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  (void)t.cancel();
  t.wait();
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(thrown.load(), 8);
}

// A Forked destroyed unjoined: a child not started never runs, a running
// one is waited for; no frame is left behind.
TEST(CoroFork, AnUnjoinedForkedLetsGoOfItsChild) {
  Watchdog dog;
  FrameGuard::reset();
  Pool pool({.min_workers = 2, .max_workers = 2});
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  auto slow = [&]() -> Co<void> {
    FrameGuard g;
    started = true;
    std::this_thread::sleep_for(30ms);
    finished = true;
    co_return;
  };
  auto guarded = []() -> Co<void> {
    FrameGuard g;
    co_return;
  };
  auto parent = [&]() -> Co<int> {
    {
      Forked<void> a = fork(slow());
      (void)eventually([&] { return started.load(); });
      Forked<void> b = fork(guarded());  // on top of the queue, not started
    }
    co_return finished.load() ? 1 : 0;
  };
  EXPECT_EQ(spawn(pool, parent()).get(), 1);
  pool.wait_idle();
  EXPECT_TRUE(eventually([] { return FrameGuard::alive() == 0; }));
}

// A soft shutdown stops the task: its joins of children not started
// throw, those children never run, and no frame is left behind. A drain
// runs them all.
TEST(CoroFork, AShutdownStopsTheChildrenNotStartedADrainRunsThem) {
  Watchdog dog;
  for (const ShutdownMode mode : {ShutdownMode::soft, ShutdownMode::drain}) {
    FrameGuard::reset();
    Pool pool({.min_workers = 1, .max_workers = 1});
    std::atomic<bool> forked{false};
    std::atomic<int> ran{0};
    auto child = [&]() -> Co<void> {
      FrameGuard g;
      ran.fetch_add(1);
      co_return;
    };
    auto parent = [&]() -> Co<void> {
      std::vector<Forked<void>> kids;
      for (int i = 0; i < 8; ++i) kids.push_back(fork(child()));
      forked = true;
      // Until the soft shutdown stopped the task (a drain leaves the pool
      // running until its coroutine tasks ended).
      if (mode == ShutdownMode::soft) {
        (void)eventually([] { return current_stop_token().stop_requested(); });
      }
      for (auto& k : kids) co_await k;
    };
    Task<void> t = spawn(pool, parent());
    ASSERT_TRUE(eventually([&] { return forked.load(); }));
    const ShutdownReport r = pool.shutdown(mode, 10s);
    t.wait();
    if (mode == ShutdownMode::soft) {
      EXPECT_EQ(t.status(), TaskStatus::cancelled);
      EXPECT_EQ(ran.load(), 0);
      EXPECT_TRUE(r.abandoned.empty());
    } else {
      EXPECT_EQ(t.status(), TaskStatus::succeeded);
      EXPECT_EQ(ran.load(), 8);
    }
    EXPECT_EQ(FrameGuard::alive(), 0);
  }
}

}  // namespace
}  // namespace crew
