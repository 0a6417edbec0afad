// Exception safety of shutdown(): every allocation the calling thread makes
// inside shutdown() is made to fail in turn (a replaced operator new that
// throws at the N-th allocation from now). Whatever throws, a later
// shutdown() must complete, and the pool must be destroyable: no waiter is
// left on a shutdown that never ends, and nothing points at a dead frame.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "crew/log.hpp"
#include "crew/pool.hpp"
#include "replaced_new.hpp"  // operator new: counts allocations, fails one on demand
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Watchdog;

// A paused pool with named tasks queued: a soft shutdown lists each one it
// drops in its report, and keeps a copy of the report for later callers.
TEST(ShutdownAllocations, AShutdownThatThrowsLeavesThePoolShutDownable) {
  Watchdog dog;
  int threw = 0;
  for (long n = 1; n < 10'000; ++n) {
    PoolOptions o;
    o.name = "alloc";
    o.min_workers = 0;
    o.max_workers = 2;
    o.logger = std::make_shared<StderrLogger>(LogLevel::error);
    Pool pool(std::move(o));
    pool.pause();
    std::atomic<int> ran{0};
    for (int i = 0; i < 8; ++i) {
      (void)pool.post([&] { ran.fetch_add(1); }, {.name = "queued-" + std::to_string(i)});
    }
    bool failed = false;
    test::t_fail_allocation_in = n;
    try {
      (void)pool.shutdown(ShutdownMode::soft, 1s);
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    test::t_fail_allocation_in = 0;
    const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 1s);
    EXPECT_TRUE(r.final_state == PoolState::stopped || r.final_state == PoolState::stopped_timeout)
        << "after a failure at allocation " << n;
    EXPECT_EQ(ran.load(), 0);
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.outcomes.total(), s.submitted) << "after a failure at allocation " << n;
    if (!failed) break;  // every allocation of the shutdown has been failed once
    ++threw;
  }
  RecordProperty("failed_allocations", threw);
  EXPECT_GT(threw, 0) << "shutdown() allocated nothing: the test proves nothing";
}

}  // namespace
}  // namespace crew
