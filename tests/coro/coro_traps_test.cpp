// The compilers' known coroutine traps, each with a test that fails if the
// build falls into it (docs/coroutines.md, "Traps"):
//   - symmetric transfer that is not a tail call (g++ 12 at -O0 or under
//     sanitizers): a long co_await chain or loop grows the stack;
//   - a thread_local whose address the compiler keeps across a suspension
//     that changes threads (clang): crew reads its own through functions
//     that are not inlined, and users must do the same;
//   - g++ 12's double destruction when a co_await and a capturing lambda
//     share one full expression: the safe pattern names the lambda first.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>

#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::Watchdog;

// The address of a local in the calling frame's stack.
[[gnu::noinline]] std::uintptr_t stack_here() {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

std::uintptr_t g_low = UINTPTR_MAX;  // the lowest stack address seen (one task at a time)

Co<int> ready(int i) {
  const std::uintptr_t here = stack_here();
  if (here < g_low) g_low = here;
  co_return i;
}

Co<std::int64_t> loop_of_ready_awaits(int n) {
  std::int64_t sum = 0;
  for (int i = 0; i < n; ++i) sum += co_await ready(i);
  co_return sum;
}

// Each co_await that completes at once returns to the loop through the
// child's final suspension (symmetric transfer); without a tail call every
// iteration keeps a frame on the stack.
TEST(CoroTraps, AMillionReadyAwaitsInALoopKeepTheStackFlat) {
  Watchdog dog(std::chrono::seconds(60));
  Pool pool(fixed_workers("co", 1));
  g_low = UINTPTR_MAX;
  std::uintptr_t top = 0;
  Task<std::int64_t> t = spawn(pool, [](std::uintptr_t* root) -> Co<std::int64_t> {
    *root = stack_here();
    co_return co_await loop_of_ready_awaits(1'000'000);
  }(&top));
  constexpr std::int64_t n = 1'000'000;
  EXPECT_EQ(t.get(), n * (n - 1) / 2);
  ASSERT_NE(g_low, UINTPTR_MAX);
  // A few frames of call overhead, not a million (a child's frame may sit
  // above the root's: each replaced the last).
  EXPECT_LT(static_cast<std::intptr_t>(top - g_low), 64 * 1024);
}

Co<int> chain(int depth) {
  if (depth == 0) {
    const std::uintptr_t here = stack_here();
    if (here < g_low) g_low = here;
    co_return 0;
  }
  co_return 1 + co_await chain(depth - 1);
}

// A chain 100,000 coroutines deep: each is started by symmetric transfer
// from its parent and returns to it the same way.
TEST(CoroTraps, AChainAHundredThousandDeepKeepsTheStackFlat) {
  Watchdog dog(std::chrono::seconds(60));
  Pool pool(fixed_workers("co", 1));
  g_low = UINTPTR_MAX;
  std::uintptr_t top = 0;
  Task<int> t = spawn(pool, [](std::uintptr_t* root) -> Co<int> {
    *root = stack_here();
    co_return co_await chain(100'000);
  }(&top));
  EXPECT_EQ(t.get(), 100'000);
  EXPECT_LT(static_cast<std::intptr_t>(top - g_low), 64 * 1024);
}

// A per-thread value the test can tell apart.
std::atomic<int> g_next_thread{1};
thread_local int t_marker = 0;
// The empty asm keeps the compiler from deducing that these calls may be
// folded (a `const` function), so each call reads the thread again.
[[gnu::noinline]] int* marker_address() {
  asm volatile("" ::: "memory");
  if (t_marker == 0) t_marker = g_next_thread.fetch_add(1);
  return &t_marker;
}
[[gnu::noinline]] int marker() { return *marker_address(); }
// std::this_thread::get_id() is pthread_self(), which glibc declares
// __attribute__((const)): a compiler may reuse its value from before a
// suspension. Through a call it cannot see into, it is read again.
[[gnu::noinline]] std::thread::id thread_now() {
  asm volatile("" ::: "memory");
  return std::this_thread::get_id();
}

struct Seen {
  int before = 0;
  int after = 0;
  int after_through_function = 0;
  bool moved = false;
  bool token_ok = false;
};

Co<void> hop_threads(Pool* pool, Seen* seen) {
  const std::thread::id first = thread_now();
  seen->before = marker();
  // Tasks that hold the coroutine's worker until it has resumed: queued on
  // this worker, which runs them once the coroutine suspends, so the
  // resumption lands on the other worker (unless that one took them all:
  // then try again). On the other worker they return at once.
  for (int i = 0; i < 100 && thread_now() == first; ++i) {
    auto resumed = std::make_shared<std::atomic<bool>>(false);
    for (int k = 0; k < 4; ++k) {
      (void)pool->post([resumed, first] {
        const auto until = std::chrono::steady_clock::now() + 1s;
        while (thread_now() == first && !resumed->load() &&
               std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(50us);
        }
      });
    }
    co_await sleep_for(1ms);
    resumed->store(true);
  }
  seen->moved = thread_now() != first;
  // The safe pattern: read the thread_local again, through a call that
  // the compiler cannot fold into the code before the suspension.
  seen->after_through_function = marker();
  seen->after = *marker_address();
  seen->token_ok = current_stop_token().stop_possible();
}

TEST(CoroTraps, AThreadLocalReadAfterAResumeOnAnotherWorkerIsThatWorkers) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Seen seen;
  spawn(pool, hop_threads(&pool, &seen)).get();
  ASSERT_TRUE(seen.moved) << "the coroutine never resumed on the other worker";
  EXPECT_NE(seen.before, seen.after_through_function);
  EXPECT_EQ(seen.after, seen.after_through_function);
  EXPECT_TRUE(seen.token_ok);  // crew's own thread_local, read after the move
}

// Counts live copies: a double destruction shows as a negative count (and
// as a double free under ASan).
std::atomic<int> g_copies{0};
struct Counted {
  int v = 7;
  Counted() { g_copies.fetch_add(1); }
  Counted(const Counted& o) : v(o.v) { g_copies.fetch_add(1); }
  Counted(Counted&& o) noexcept : v(o.v) { g_copies.fetch_add(1); }
  Counted& operator=(const Counted&) = default;
  Counted& operator=(Counted&&) = default;
  ~Counted() { g_copies.fetch_sub(1); }
};

template <class F>
Co<int> call(F f) {
  co_await yield();
  co_return f();
}

// The trap is `co_await call([c] { ... })` in one expression under g++ 12;
// the safe form names the lambda, so that it is an ordinary local.
Co<int> safe_lambda_pattern() {
  Counted c;
  auto f = [c] { return c.v; };
  const int v = co_await call(f);
  co_return v + 1;
}

TEST(CoroTraps, ANamedCapturingLambdaPassedToACoAwaitIsDestroyedOnce) {
  Watchdog dog;
  {
    Pool pool(fixed_workers("co", 2));
    g_copies = 0;
    for (int i = 0; i < 100; ++i) EXPECT_EQ(spawn(pool, safe_lambda_pattern()).get(), 8);
  }
  EXPECT_EQ(g_copies.load(), 0);
}

}  // namespace
}  // namespace crew
