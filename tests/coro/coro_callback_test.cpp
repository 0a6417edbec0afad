// A coroutine waiting for a callback (crew/coro.hpp on_callback): it
// resumes on its pool with the callback's value, a stop ends the wait and
// makes a late callback do nothing, and a callback destroyed uncalled ends
// the wait with Errc::cancelled.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include "coro_test_util.hpp"
#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::FrameGuard;
using test::Watchdog;

// The thread of a step, read through a call the compiler cannot fold (see
// coro_traps_test.cpp).
[[gnu::noinline]] std::thread::id step_thread() {
  asm volatile("" ::: "memory");
  return std::this_thread::get_id();
}

Co<int> from_a_thread(std::thread::id* helper, std::thread::id* resumed_on) {
  auto start = [helper](Resume<int> resume) {
    std::thread t([r = std::move(resume)]() mutable {
      std::this_thread::sleep_for(10ms);
      r(41);
    });
    *helper = t.get_id();
    t.detach();
  };
  const int v = co_await on_callback<int>(start);
  *resumed_on = step_thread();
  co_return v + 1;
}

TEST(CoroTask, OnCallbackResumesOnThePoolWithTheCallbacksValue) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::thread::id helper;
  std::thread::id resumed_on;
  EXPECT_EQ(spawn(pool, from_a_thread(&helper, &resumed_on)).get(), 42);
  EXPECT_NE(resumed_on, helper);
  EXPECT_NE(resumed_on, std::this_thread::get_id());
}

struct Held {
  std::mutex mu;
  std::optional<Resume<int>> resume;  // guarded by mu
};

Co<int> held_callback(Held* held, std::atomic<bool>* waiting) {
  FrameGuard g;
  auto start = [held](Resume<int> resume) {
    const std::lock_guard lock(held->mu);
    held->resume.emplace(std::move(resume));
  };
  waiting->store(true);
  co_return co_await on_callback<int>(start);
}

TEST(CoroTask, AStopEndsACallbackWaitAndTheLateCallbackDoesNothing) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Held held;
  std::atomic<bool> waiting{false};
  Task<int> t = spawn(pool, held_callback(&held, &waiting));
  ASSERT_TRUE(test::eventually([&] { return waiting.load(); }));
  ASSERT_TRUE(test::eventually([&] { return coroutine_tasks(pool).suspended.size() == 1; }));
  EXPECT_EQ(coroutine_tasks(pool).suspended[0].waits_on, "callback");
  (void)t.cancel();
  ASSERT_TRUE(t.wait_for(5s));
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(FrameGuard::alive(), 0);
  const std::lock_guard lock(held.mu);
  ASSERT_TRUE(held.resume.has_value());
  (*held.resume)(7);  // the task has ended: nothing happens
}

Co<int> dropped_callback() {
  co_return co_await on_callback<int>([](Resume<int> resume) { (void)resume; });
}

TEST(CoroTask, ACallbackDestroyedUncalledEndsTheWaitWithCancelled) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Task<int> t = spawn(pool, dropped_callback());
  try {
    (void)t.get();
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::cancelled);
  }
  EXPECT_EQ(t.status(), TaskStatus::failed);  // the coroutine threw; no stop
}

}  // namespace
}  // namespace crew
