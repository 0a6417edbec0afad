// crew::detail::SpinLock (crew/detail/spin_lock.hpp): sections under it
// exclude each other however the holders are scheduled, try_lock never
// waits, a waiter behind a long section sleeps instead of spinning, and a
// real-time waiter on the CPU of a preempted holder gets the lock as soon
// as the holder's section ends.
#include "crew/detail/spin_lock.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "affinity.hpp"  // first_cpu, may_use_fifo
#include "test_util.hpp"

namespace crew {
namespace {

using detail::SpinLock;
using detail::SpinLockGuard;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// CPU time the calling thread has used.
std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<std::size_t>(cpu), &set);
  ASSERT_EQ(::pthread_setaffinity_np(::pthread_self(), sizeof set, &set), 0);
}

TEST(SpinLock, SectionsExcludeEachOtherAlsoWhenHoldersSleepInside) {
  test::Watchdog dog;
  SpinLock mu;
  std::uint64_t counter = 0;  // guarded by mu, written without atomics
  constexpr int kThreads = 4;
  const int rounds = 100'000 / test::kSlowdown;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        const SpinLockGuard lock(mu);
        const std::uint64_t seen = counter;
        // Now and then a holder leaves its CPU inside the section, so that
        // waiters go to sleep and are woken.
        if ((i + t) % 5000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        counter = seen + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, static_cast<std::uint64_t>(kThreads) * static_cast<std::uint64_t>(rounds));
  EXPECT_TRUE(mu.is_free());
}

TEST(SpinLock, TryLockTakesOnlyAFreeLock) {
  SpinLock mu;
  EXPECT_TRUE(mu.is_free());
  if (mu.try_lock()) {
    EXPECT_FALSE(mu.is_free());
    bool again = true;
    std::thread([&] { again = mu.try_lock(); }).join();
    EXPECT_FALSE(again);  // not even for another thread
    mu.unlock();
  } else {
    ADD_FAILURE() << "try_lock failed on a free lock";
  }
  EXPECT_TRUE(mu.is_free());
  if (mu.try_lock()) {
    mu.unlock();
  } else {
    ADD_FAILURE() << "try_lock failed after the unlock";
  }
}

// Three threads wait behind a 100 ms section. Each must get the lock after
// it, one at a time, and must have slept meanwhile: a waiter that spun or
// yielded on a CPU of its own would burn the whole 100 ms.
TEST(SpinLock, WaitersBehindALongSectionSleepAndAllGetTheLock) {
  test::Watchdog dog;
  SpinLock mu;
  mu.lock();
  constexpr int kWaiters = 3;
  std::atomic<int> started{0};
  std::atomic<int> inside{0};
  std::atomic<int> most_inside{0};
  std::atomic<int> done{0};
  std::vector<std::chrono::nanoseconds> cpu(kWaiters);
  std::vector<std::thread> waiters;
  for (int w = 0; w < kWaiters; ++w) {
    waiters.emplace_back([&, w] {
      started.fetch_add(1);
      const auto before = thread_cpu_time();
      mu.lock();
      cpu[static_cast<std::size_t>(w)] = thread_cpu_time() - before;
      const int now = inside.fetch_add(1) + 1;
      int most = most_inside.load();
      while (now > most && !most_inside.compare_exchange_weak(most, now)) {
      }
      std::this_thread::sleep_for(milliseconds(1));
      inside.fetch_sub(1);
      mu.unlock();
      done.fetch_add(1);
    });
  }
  while (started.load() != kWaiters) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(done.load(), 0);
  mu.unlock();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(done.load(), kWaiters);
  EXPECT_EQ(most_inside.load(), 1);
  for (int w = 0; w < kWaiters; ++w) {
    // The spin before sleeping is about a microsecond; the bound leaves room
    // for the futex calls, a slow CPU and the sanitizers.
    EXPECT_LT(cpu[static_cast<std::size_t>(w)], milliseconds(20)) << "waiter " << w;
  }
}

// The case a lock that only yields cannot serve: a SCHED_FIFO waiter on the
// CPU of the holder. sched_yield never lets a normal thread run in place of
// a real-time one, so such a waiter would keep the holder off the CPU until
// the kernel's real-time throttling (950 ms in each second by default, or
// never if it is off). This lock's waiter sleeps and the holder ends its
// section at once.
TEST(SpinLock, ARealTimeWaiterLetsAPreemptedHolderOnItsCpuFinish) {
  test::Watchdog dog;
  const int cpu = test::first_cpu();
  ASSERT_GE(cpu, 0);
  if (!test::may_use_fifo()) GTEST_SKIP() << "SCHED_FIFO needs CAP_SYS_NICE or RLIMIT_RTPRIO >= 1";
  SpinLock mu;
  std::atomic<bool> held{false};
  std::thread holder([&] {
    pin_to(cpu);
    mu.lock();
    held.store(true);
    // A 20 ms section of work, which needs the CPU the waiter takes.
    const auto until = thread_cpu_time() + milliseconds(20);
    while (thread_cpu_time() < until) {
    }
    mu.unlock();
  });
  Clock::duration waited{};
  std::thread waiter([&] {
    pin_to(cpu);
    while (!held.load()) std::this_thread::yield();  // both normal until here
    sched_param param{};
    param.sched_priority = 1;
    ASSERT_EQ(::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &param), 0);
    const auto start = Clock::now();
    mu.lock();
    waited = Clock::now() - start;
    mu.unlock();
  });
  waiter.join();
  holder.join();
  // About the holder's 20 ms; a yielding waiter would take 950 ms or more.
  EXPECT_LT(waited, milliseconds(300) * test::kSlowdown);
}

}  // namespace
}  // namespace crew
