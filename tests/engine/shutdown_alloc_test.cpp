// Exception safety of shutdown(): every allocation the calling thread makes
// inside shutdown() is made to fail in turn (a replaced operator new that
// throws at the N-th allocation from now). Whatever throws, a later
// shutdown() must complete, and the pool must be destroyable: no waiter is
// left on a shutdown that never ends, and nothing points at a dead frame.
// Also a worker held in an allocation (AllocationGate) while a hard
// shutdown writes it off: the task it had taken still gets one outcome.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <latch>
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
using test::cooperative;
using test::Watchdog;

// The pool's one worker, inside a task posted here, waits until
// `submit_next` has queued the task it is to take next, and then arms
// `gate` for its next allocation: it takes that task straight from the
// queue, and the first long task a worker runs allocates its stop source
// before it starts. (Armed before the task was queued, the hold could catch
// an allocation of the worker's idle path instead.)
template <class F>
void hold_allocation_of_next_task(Pool& pool, test::AllocationGate& gate, F submit_next) {
  auto queued = std::make_shared<std::atomic<bool>>(false);
  ASSERT_EQ(pool.post([&gate, queued] {
    queued->wait(false);
    test::t_hold_next_allocation = &gate;
  }),
            Admission::accepted);
  submit_next();
  queued->store(true);
  queued->notify_all();
}

bool wait_held(const test::AllocationGate& gate) {
  return test::eventually([&] { return gate.held.load(); }, 10s * test::kSlowdown);
}

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

// A hard shutdown writes off a worker that has taken a long task with a
// handle from the queue and is held before the task starts (in the
// allocation of its stop source). The write-off decides the task's outcome
// (abandoned); before the worker turned busy in the same step as its run
// slot took the task, the write-off found an empty slot, took the run for
// a plain task's, and the task never got an outcome.
TEST(ShutdownAllocations, ATaskTakenByAWorkerWrittenOffBeforeItStartsGetsAnOutcome) {
  Watchdog dog;
  test::AllocationGate gate;
  Pool pool({.min_workers = 1, .max_workers = 1, .abandon_grace = 20ms});
  // A first long task, cancelled while it runs: the clock is set up (its
  // first use allocates), and the stop went through the worker's stop
  // source, so the next long task replaces the source: an allocation after
  // it took that task.
  std::latch started(1);
  Task<void> first = pool.submit(cooperative(started), {.name = "first"});
  started.wait();
  first.cancel();
  ASSERT_TRUE(first.wait_for(10s * test::kSlowdown));
  std::atomic<bool> ran{false};
  Task<void> taken;
  hold_allocation_of_next_task(pool, gate, [&] {
    taken = pool.submit([&ran](std::stop_token) { ran = true; }, {.name = "taken"});
  });
  ASSERT_TRUE(wait_held(gate));
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  const bool decided = taken.wait_for(2s * test::kSlowdown);
  gate.open = true;
  gate.open.notify_all();
  // Its callable runs on the written-off thread now; `ran` outlives it.
  EXPECT_TRUE(test::eventually([&] { return ran.load(); }));
  ASSERT_TRUE(decided) << "the task has no outcome";
  EXPECT_EQ(taken.status(), TaskStatus::cancelled);
  EXPECT_EQ(taken.reason(), Errc::abandoned);
  EXPECT_TRUE(std::any_of(r.abandoned.begin(), r.abandoned.end(),
                          [](const TaskRef& t) { return t.name == "taken"; }));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_EQ(s.abandoned, 1u);
}

// The same for an inline long task (posted, no handle): the worker turned
// busy when it took the cell, so the write-off takes the run for a plain
// task's, whose thread counts the outcome when it returns. The long run
// counts it too now, stopped (cancelled) as the shutdown stops long runs;
// it returned without counting before.
TEST(ShutdownAllocations, AnInlineLongTaskWrittenOffBeforeItStartsIsCountedByItsThread) {
  Watchdog dog;
  test::AllocationGate gate;
  Pool pool({.min_workers = 1, .max_workers = 1, .abandon_grace = 20ms});
  std::atomic<bool> stopped{false};
  hold_allocation_of_next_task(pool, gate, [&] {
    ASSERT_EQ(pool.post([&stopped](std::stop_token stop) { stopped = stop.stop_requested(); }),
              Admission::accepted);
  });
  ASSERT_TRUE(wait_held(gate));
  const ShutdownReport r = pool.shutdown(ShutdownMode::hard, 0s);
  EXPECT_EQ(r.abandoned_unnamed, 1u);
  gate.open = true;
  gate.open.notify_all();
  EXPECT_TRUE(test::eventually([&] {
    const PoolStats s = pool.stats();
    return s.outcomes.total() == s.submitted;
  })) << "the task's outcome was never counted";
  EXPECT_TRUE(stopped.load()) << "the hard shutdown's stop did not reach the task";
  EXPECT_EQ(pool.stats().outcomes.cancelled, 1u);
  EXPECT_EQ(pool.stats().abandoned, 1u);
}

}  // namespace
}  // namespace crew
