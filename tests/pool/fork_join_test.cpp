// Tests of fork-join on worker-local queues: recursion through Group and
// through Task handles as deep as real divide-and-conquer, on one and two
// workers, with the default and an unbounded shared queue, within a bounded
// stack; shutdown of each mode while local queues hold tasks. The queues
// themselves, and stealing, are tested in tests/engine/local_queue_test.cpp.
#include <gtest/gtest.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "crew/batch.hpp"
#include "crew/group.hpp"
#include "crew/pool.hpp"
#include "fork_join_util.hpp"
#include "peak.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::fib_calls;
using test::fib_group;
using test::fib_serial;
using test::fib_task;
using test::Gate;
using test::kSanitized;
using test::StackProbe;
using test::Watchdog;

// 10-way fan-out to `depth`; leaves return their index.
std::uint64_t skynet(Pool& pool, StackProbe& probe, std::uint64_t index, int depth) {
  probe.sample();
  if (depth == 0) return index;
  std::uint64_t parts[10] = {};
  Group g(pool);
  for (std::uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(g.submit([&, i] { parts[i] = skynet(pool, probe, index * 10 + i, depth - 1); }),
              Admission::accepted);
  }
  g.wait();
  std::uint64_t sum = 0;
  for (const std::uint64_t p : parts) sum += p;
  return sum;
}

enum class Join { group, task, batch };
enum class Queue { bounded, unbounded };

struct Shape {
  std::size_t workers;
  Queue queue;
  Join join;
};

std::string name_of(const ::testing::TestParamInfo<Shape>& info) {
  return std::to_string(info.param.workers) + "w_" +
         (info.param.queue == Queue::bounded ? "default_queue" : "unbounded_queue") + "_" +
         (info.param.join == Join::group ? "group" : "task");
}

class ForkJoin : public ::testing::TestWithParam<Shape> {
 protected:
  PoolOptions options(StackProbe& probe) const {
    PoolOptions o = test::fixed_workers("fork-join", GetParam().workers);
    if (GetParam().queue == Queue::unbounded) o.queue_capacity = kUnbounded;
    return probe.attach(std::move(o));
  }
  std::uint64_t fib(Pool& pool, StackProbe& probe, int n) const {
    return GetParam().join == Join::group ? fib_group(pool, probe, n) : fib_task(pool, probe, n);
  }
};

// The old scheduler nested tasks by their number, not by the recursion's
// depth: fib(24) through Group overflowed an 8 MiB stack. Thousands of
// levels of tasks in all, 25 levels deep.
TEST_P(ForkJoin, DeepRecursionCompletesWithTheStackBoundedByItsDepth) {
  Watchdog dog(60s);
  StackProbe probe;
  const int n = kSanitized ? 18 : 25;
  std::uint64_t result = 0;
  {
    Pool pool(options(probe));
    result = pool.submit_wait([&] { return fib(pool, probe, n); });
    ASSERT_TRUE(pool.wait_idle(30s));
    const PoolStats s = pool.stats();
    // Exactly one outcome per task: the root and one task per call below it.
    EXPECT_EQ(s.outcomes.succeeded, fib_calls(n));
    EXPECT_EQ(s.outcomes.total(), s.submitted);
    EXPECT_EQ(s.queued, 0u);
  }
  EXPECT_EQ(result, fib_serial(n));
  // Depth 25 with a handful of frames per level; the old scheduler used
  // tens of MiB here. Sanitizers make frames several times larger.
  EXPECT_LT(probe.peak(), (kSanitized ? 4u : 1u) << 20) << "peak stack " << probe.peak();
  RecordProperty("peak_stack_bytes", std::to_string(probe.peak()));
}

// A small worker stack suffices: what a wait nests is bounded by the
// recursion (own tasks) and by a share of the stack (anything else).
TEST_P(ForkJoin, RunsOnAWorkerStackSizedForItsDepth) {
  Watchdog dog(60s);
  StackProbe probe;
  PoolOptions o = options(probe);
  o.stack_size = kSanitized ? std::size_t{2} << 20 : std::size_t{256} << 10;
  Pool pool(std::move(o));
  const int n = kSanitized ? 16 : 22;
  EXPECT_EQ(pool.submit_wait([&] { return fib(pool, probe, n); }), fib_serial(n));
  EXPECT_LT(probe.peak(), pool.options().stack_size);
}

// A chain of nested waits: each level a task that submits the next and
// waits for it, `depth` levels, through Task handles, Group or run_batch.
// Returns the depth the chain reached (its deepest task's level).
int chain(Pool& pool, Join join, int level, int depth, std::atomic<int>& deepest) {
  test::raise_peak(deepest, level, std::memory_order_relaxed);
  if (level == depth) return level;
  if (join == Join::task) {
    return pool
        .submit([&pool, join, level, depth, &deepest] {
          return chain(pool, join, level + 1, depth, deepest);
        })
        .get();
  }
  if (join == Join::batch) {
    const std::vector<int> next{level + 1};
    BatchResult<int> r = run_batch(pool, next, [&pool, join, depth, &deepest](int l) {
      return chain(pool, join, l, depth, deepest);
    });
    return r.outcomes.at(0).get();
  }
  int reached = 0;
  Group g(pool);
  g.submit([&] { reached = chain(pool, join, level + 1, depth, deepest); });
  g.wait();
  g.rethrow_if_failed();
  return reached;
}

class NestedWaitChain : public ::testing::TestWithParam<Join> {};

// Deeper than the stack holds (about 1 KiB a level): the wait that would
// nest the next level on the stack's last sixteenth throws
// Error(stack_exhausted) instead of overflowing, the error travels up the
// chain, and every task has exactly one outcome.
TEST_P(NestedWaitChain, DeeperThanTheStackThrowsStackExhausted) {
  Watchdog dog(60s);
  std::atomic<int> deepest{0};
  Pool pool(test::fixed_workers("chain", 2));
  try {
    (void)pool.submit_wait([&] { return chain(pool, GetParam(), 0, 1'000'000, deepest); });
    ADD_FAILURE() << "a chain of 1,000,000 nested waits completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::stack_exhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("PoolOptions::stack_size"), std::string::npos) << e.what();
  }
  // It went deep before it stopped: the reserve is a sixteenth of 8 MiB.
  EXPECT_GT(deepest.load(), kSanitized ? 100 : 1000);
  ASSERT_TRUE(pool.wait_idle(30s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_GE(s.outcomes.cancelled, 1u);
  RecordProperty("deepest_level", std::to_string(deepest.load()));
}

// The same chain within the stack completes; a larger stack holds a
// deeper one.
TEST_P(NestedWaitChain, WithinTheStackCompletes) {
  Watchdog dog(60s);
  std::atomic<int> deepest{0};
  const int depth = kSanitized ? 100 : 2'000;
  {
    Pool pool(test::fixed_workers("chain", 2));
    EXPECT_EQ(pool.submit_wait([&] { return chain(pool, GetParam(), 0, depth, deepest); }), depth);
  }
  PoolOptions o = test::fixed_workers("chain", 2);
  o.stack_size = std::size_t{256} << 20;
  Pool big(std::move(o));
  deepest = 0;
  EXPECT_EQ(big.submit_wait([&] { return chain(big, GetParam(), 0, depth * 10, deepest); }),
            depth * 10);
}

INSTANTIATE_TEST_SUITE_P(Joins, NestedWaitChain,
                         ::testing::Values(Join::task, Join::group, Join::batch),
                         [](const auto& p) {
                           return p.param == Join::task    ? "Task"
                                  : p.param == Join::group ? "Group"
                                                           : "RunBatch";
                         });

// A chain of nested waits run while an exception unwinds (a destructor's
// fork-join): those waits cannot throw, and they used to nest with no floor
// at all, to a stack overflow. Below a quarter of the reserve they nest
// nothing: the task waited for is cancelled, the wait returns, and the
// chain ends early without throwing out of the destructor.
TEST(StackChecks, WaitsRunWhileAnExceptionUnwindsStopNestingAtAFloor) {
  Watchdog dog(60s);
  std::atomic<int> deepest{0};
  // One worker: every level is nested on its stack (none is stolen).
  Pool pool(test::fixed_workers("unwind", 1));
  struct ChainInDestructor {
    Pool* pool;
    std::atomic<int>* deepest;
    // A destructor must not throw: a part of the chain stolen by the other
    // worker, whose waits may throw, ends with Error(stack_exhausted), and
    // the group that waited for it rethrows it here.
    ~ChainInDestructor() {
      try {
        (void)chain(*pool, Join::group, 0, 1'000'000, *deepest);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::stack_exhausted) << e.what();
      }
    }
  };
  auto t = pool.submit([&] {
    const ChainInDestructor deep{&pool, &deepest};
    throw std::runtime_error("unwinding");
  });
  EXPECT_THROW((void)t.get(), std::runtime_error);
  EXPECT_GT(deepest.load(), kSanitized ? 100 : 1000);
  ASSERT_TRUE(pool.wait_idle(30s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_GE(s.outcomes.cancelled, 1u);
}

// A thread that runs queued tasks from a stack that is not its own (a
// fiber's, here a 128 KiB ucontext stack; the checks cannot know its size)
// nests one task at most there: tasks that each take 16 KiB of stack and
// call run_pending_task() again do not overflow it.
std::atomic<int> g_fiber_depth{0};
std::atomic<int> g_fiber_deepest{0};
std::atomic<int> g_fiber_ran{0};
Pool* g_fiber_pool = nullptr;
ucontext_t g_main_ctx;
ucontext_t g_fiber_ctx;

void fiber_body() {
  while (g_fiber_pool->run_pending_task()) {
  }
  (void)swapcontext(&g_fiber_ctx, &g_main_ctx);
}

TEST(StackChecks, AFiberStackNestsOneTaskAtMost) {
  if (test::kAddressSanitizer || test::kThreadSanitizer) {
    GTEST_SKIP() << "the sanitizers must be told of every switch of stacks "
                    "(__sanitizer_start_switch_fiber), which plain ucontext does not do";
  }
  Watchdog dog;
  g_fiber_ran = 0;  // this process may run the test more than once (--gtest_repeat)
  g_fiber_depth = 0;
  g_fiber_deepest = 0;
  Pool pool({.name = "fiber", .max_workers = 1});
  test::WorkerHold hold(pool);  // the tasks stay queued for the fiber
  g_fiber_pool = &pool;
  constexpr int kTasks = 64;  // 64 x 16 KiB nested would be 1 MiB
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([] {
      volatile char pad[16 * 1024];
      pad[0] = 1;
      pad[sizeof pad - 1] = pad[0];
      test::raise_peak(g_fiber_deepest, g_fiber_depth.fetch_add(1) + 1);
      g_fiber_ran.fetch_add(1);
      (void)g_fiber_pool->run_pending_task();
      g_fiber_depth.fetch_sub(1);
    }),
              Admission::accepted);
  }
  std::vector<char> stack(128 * 1024);
  ASSERT_EQ(getcontext(&g_fiber_ctx), 0);
  g_fiber_ctx.uc_stack.ss_sp = stack.data();
  g_fiber_ctx.uc_stack.ss_size = stack.size();
  g_fiber_ctx.uc_link = nullptr;
  makecontext(&g_fiber_ctx, fiber_body, 0);
  ASSERT_EQ(swapcontext(&g_main_ctx, &g_fiber_ctx), 0);
  EXPECT_EQ(g_fiber_ran.load(), kTasks);
  EXPECT_EQ(g_fiber_deepest.load(), 1);
  g_fiber_pool = nullptr;
}

// skynet: 10-way fan-out through Group, on each worker count and queue.
TEST(ForkJoinWide, FanOutSumsEveryLeaf) {
  Watchdog dog(60s);
  const int depth = kSanitized ? 3 : 5;
  std::uint64_t leaves = 1;
  for (int i = 0; i < depth; ++i) leaves *= 10;
  for (const std::size_t workers : {std::size_t{1}, std::size_t{2}}) {
    for (const bool unbounded : {false, true}) {
      StackProbe probe;
      PoolOptions o = test::fixed_workers("skynet", workers);
      if (unbounded) o.queue_capacity = kUnbounded;
      Pool pool(probe.attach(std::move(o)));
      const std::uint64_t sum = pool.submit_wait([&] { return skynet(pool, probe, 0, depth); });
      EXPECT_EQ(sum, leaves * (leaves - 1) / 2) << workers << " workers";
      ASSERT_TRUE(pool.wait_idle(30s));
      EXPECT_EQ(pool.stats().outcomes.total(), pool.stats().submitted);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ForkJoin,
                         ::testing::Values(Shape{1, Queue::bounded, Join::group},
                                           Shape{1, Queue::bounded, Join::task},
                                           Shape{2, Queue::bounded, Join::group},
                                           Shape{2, Queue::bounded, Join::task},
                                           Shape{1, Queue::unbounded, Join::group},
                                           Shape{1, Queue::unbounded, Join::task},
                                           Shape{2, Queue::unbounded, Join::group},
                                           Shape{2, Queue::unbounded, Join::task}),
                         name_of);

// A worker's local queue holds named tasks it forked while it is still
// running; a shutdown of each mode must settle them exactly as it does the
// shared queue's: drain runs them, soft and hard reject and list them.
class LocalQueueShutdown : public ::testing::TestWithParam<ShutdownMode> {};

TEST_P(LocalQueueShutdown, SettlesForkedTasksAndListsThem) {
  Watchdog dog;
  const ShutdownMode mode = GetParam();
  constexpr int kChildren = 20;
  // One worker: nobody steals the children before the shutdown sees them.
  Pool pool(test::fixed_workers("local-shutdown", 1));
  Gate forked;
  Gate release;
  std::atomic<int> ran{0};
  Task<void> parent = pool.submit([&] {
    for (int i = 0; i < kChildren; ++i) {
      EXPECT_EQ(pool.post([&ran] { ran.fetch_add(1); }, {.name = "child-" + std::to_string(i)}),
                Admission::accepted);
    }
    forked.open();
    release.wait();
  });
  ASSERT_TRUE(forked.wait());
  EXPECT_EQ(pool.stats().queued, static_cast<std::size_t>(kChildren));

  ShutdownReport report;
  std::thread stopper([&] { report = pool.shutdown(mode, 0s); });
  ASSERT_TRUE(eventually([&] { return pool.state() != PoolState::running; }));
  if (mode != ShutdownMode::drain) {
    // The sweep reaches into the worker's own queue while the worker runs.
    ASSERT_TRUE(eventually([&] { return pool.stats().queued == 0; }));
  }
  release.open();
  stopper.join();
  parent.wait();

  if (mode == ShutdownMode::drain) {
    EXPECT_EQ(ran.load(), kChildren);
    EXPECT_EQ(report.during.succeeded, static_cast<std::uint64_t>(kChildren + 1));
    EXPECT_TRUE(report.rejected.empty());
  } else {
    EXPECT_EQ(ran.load(), 0);
    EXPECT_EQ(report.during.rejected, static_cast<std::uint64_t>(kChildren));
    ASSERT_EQ(report.rejected.size(), static_cast<std::size_t>(kChildren));
    std::vector<std::string> names;
    for (const TaskRef& t : report.rejected) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    std::vector<std::string> expected;
    for (int i = 0; i < kChildren; ++i) expected.push_back("child-" + std::to_string(i));
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(names, expected);
    EXPECT_EQ(parent.status(), TaskStatus::succeeded);
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

INSTANTIATE_TEST_SUITE_P(Modes, LocalQueueShutdown,
                         ::testing::Values(ShutdownMode::drain, ShutdownMode::soft,
                                           ShutdownMode::hard),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// A drain that starts in the middle of a fork-join refuses its nested
// submissions; the group's result says so instead of a partial sum.
long group_fib(Pool& pool, int n) {
  if (n < 2) return n;
  long a = 0;
  long b = 0;
  Group g(pool);
  (void)g.submit([&] { a = group_fib(pool, n - 1); });
  (void)g.submit([&] { b = group_fib(pool, n - 2); });
  g.wait();
  g.rethrow_if_failed();
  return a + b;
}

TEST(ForkJoinDrain, ADrainMidComputationFailsTheGroupsResultInsteadOfLosingWork) {
  Watchdog dog;
  Pool pool({.name = "fib", .max_workers = 2});
  // About 2.7 million tasks (57 thousand under a sanitizer): the drain
  // comes long before the end.
  const int n = test::kSlowdown > 1 ? 22 : 30;
  auto t = pool.submit([&] { return group_fib(pool, n); });
  std::this_thread::sleep_for(5ms);
  const ShutdownReport r = pool.shutdown(ShutdownMode::drain, 0s);
  EXPECT_EQ(r.final_state, PoolState::stopped);
  try {
    const long got = t.get();
    EXPECT_EQ(got, n == 30 ? 832040 : 17711) << "a fork-join returned a partial answer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::rejected) << e.what();
  }
}

TEST(PoolOptions, StackSizeIsValidated) {
  PoolOptions o;
  o.stack_size = 1024;
  EXPECT_THROW(Pool{o}, Error);
  o.stack_size = PoolOptions::kMaxStackSize + 1;
  EXPECT_THROW(Pool{o}, Error);
  o.stack_size = PoolOptions::kMinStackSize;
  Pool ok(o);
  EXPECT_EQ(ok.submit_wait([] { return 7; }), 7);
}

}  // namespace
}  // namespace crew
