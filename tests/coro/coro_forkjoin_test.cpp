// Fork-join written as coroutine tasks: one spawn and one co_await per
// call. The end of an awaited task resumes its waiter on the same worker by
// symmetric transfer (crew/detail/coro_task.hpp), so a long chain of such
// ends must keep the worker's stack flat, and a deep fork-join must run in
// the default 8 MiB of a worker's stack.
#include <gtest/gtest.h>

#include <cstdint>

#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using test::fixed_workers;
using test::Watchdog;

Co<long> fib(Pool& pool, int n) {
  if (n < 2) co_return n;
  Task<long> a = spawn(pool, fib(pool, n - 1));
  const long b = co_await fib(pool, n - 2);
  co_return b + co_await a;
}

long fib_of(int n) {
  long a = 0;
  long b = 1;
  for (int i = 0; i < n; ++i) b = std::exchange(a, b) + b;
  return a;
}

// 15 million spawns in the release build. The sanitizer builds run
// fib(27) (0.3 million), 8 levels less deep: fib(35) itself completes
// there too, but takes 100 s under ASan and 190 s under TSan on two
// shared CPUs, too long for a unit test.
TEST(CoroForkJoin, FibThirtyFiveRunsOnTwoWorkersWithEightMiBStacks) {
  constexpr int n = test::kAddressSanitizer || test::kThreadSanitizer ? 27 : 35;
  Watchdog dog(std::chrono::seconds(120));
  PoolOptions o = fixed_workers("fib", 2);
  o.stack_size = std::size_t{8} << 20;
  Pool pool(o);
  EXPECT_EQ(spawn(pool, fib(pool, n)).get(), fib_of(n));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

// The address of a local in the calling frame's stack.
[[gnu::noinline]] std::uintptr_t stack_here() {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

struct Depth {
  std::uintptr_t top = 0;            // the root's stack at its start
  std::uintptr_t low = UINTPTR_MAX;  // the lowest seen after a resumption
};

// Each link spawns the next one and awaits it: when the last one ends,
// each end resumes the link above it on the same worker.
Co<int> link(Pool& pool, int left, Depth* d) {
  if (left == 0) co_return 0;
  Task<int> next = spawn(pool, link(pool, left - 1, d));
  const int below = co_await next;
  const std::uintptr_t here = stack_here();
  if (here < d->low) d->low = here;
  co_return below + 1;
}

TEST(CoroForkJoin, AHundredThousandEndsResumingTheirWaitersKeepTheStackFlat) {
  Watchdog dog(std::chrono::seconds(60));
  Pool pool(fixed_workers("chain", 1));
  Depth d;
  Task<int> t = spawn(pool, [](Pool& p, Depth* depth) -> Co<int> {
    depth->top = stack_here();
    co_return co_await link(p, 100'000, depth);
  }(pool, &d));
  EXPECT_EQ(t.get(), 100'000);
  ASSERT_NE(d.low, UINTPTR_MAX);
  // A few frames of call overhead, not one per end.
  EXPECT_LT(static_cast<std::intptr_t>(d.top - d.low), 64 * 1024);
}

}  // namespace
}  // namespace crew
