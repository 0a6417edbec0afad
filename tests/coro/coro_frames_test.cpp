// Where coroutine frames come from (the block cache, not the global
// operator new per coroutine or per spawn), and spawns whose allocations
// fail (nothing leaks, the counts still add up).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <new>

#include "coro_test_util.hpp"
#include "crew/coro.hpp"
#include "crew/detail/block_cache.hpp"
#include "crew/pool.hpp"
#include "replaced_new.hpp"  // operator new: counts allocations, injects failures
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::Watchdog;

Co<int> leaf(Pool* /*pool*/, int i) {
  co_await yield();
  co_return i;
}

Co<int> child(int i) { co_return i; }

// A spawned child, awaited: a task state, its extras and a frame, none of
// them from the global operator new (no std::stop_source unless
// current_stop_token() asks for one).
Co<int> spawned(Pool* pool, int i) {
  Task<int> t = spawn(*pool, child(i));
  co_return co_await t;
}

// Allocations made while 10,000 coroutines `run(pool, i)` were awaited,
// after 1,000 warmed the worker's block cache.
Co<std::uint64_t> allocations_of(Co<int> (*run)(Pool*, int), Pool* pool) {
  int sum = 0;
  for (int i = 0; i < 1000; ++i) sum += co_await run(pool, i);
  const std::uint64_t before = test::g_allocations.load();
  for (int i = 0; i < 10'000; ++i) sum += co_await run(pool, i);
  const std::uint64_t after = test::g_allocations.load();
  co_return sum > 0 ? after - before : ~std::uint64_t{0};
}

TEST(CoroFrames, FramesComeFromTheBlockCacheNotTheGlobalNew) {
  if (!detail::kBlockCacheOn) {
    GTEST_SKIP() << "the block cache is off under AddressSanitizer (it must see every free)";
  }
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));  // one worker: its cache serves every frame
  // A thousand allocations in 10,000 frames would be a cache that misses.
  EXPECT_LT(spawn(pool, allocations_of(leaf, &pool)).get(), 100u);
}

TEST(CoroFrames, SpawnsAndJoinsFromACoroutineTaskMakeNoGlobalAllocation) {
  if (!detail::kBlockCacheOn) {
    GTEST_SKIP() << "the block cache is off under AddressSanitizer (it must see every free)";
  }
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  EXPECT_LT(spawn(pool, allocations_of(spawned, &pool)).get(), 100u);
}

Co<int> guarded(int v) {
  test::FrameGuard g;
  co_await sleep_for(1ms);
  co_return v;
}

TEST(CoroFrames, ASpawnWhoseAllocationFailsLeavesNothingBehind) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  int threw = 0;
  for (long n = 1; n <= 12; ++n) {
    test::t_fail_allocation_in = n;
    try {
      Task<int> t = spawn(pool, guarded(5), {.name = "a name long enough to be allocated"});
      test::t_fail_allocation_in = 0;
      EXPECT_EQ(t.get(), 5);
    } catch (const std::bad_alloc&) {
      ++threw;
    }
    test::t_fail_allocation_in = 0;
  }
  EXPECT_GT(threw, 0) << "no allocation of a spawn failed";
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(test::FrameGuard::alive(), 0);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.submitted, s.outcomes.total());
  EXPECT_EQ(s.outcomes.failed + s.outcomes.cancelled + s.outcomes.rejected, 0u);
}

}  // namespace
}  // namespace crew
