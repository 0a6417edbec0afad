// Tests of the core pool: options, submission, admission policies, nested
// submission, elastic workers, pause / resume / resize, stats, hooks.
#include "crew/pool.hpp"

#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <semaphore>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "crew/usable_cpus.hpp"
#include "os_thread.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;
using test::WorkerHold;

std::string invalid_message(const PoolOptions& o) {
  try {
    Pool pool(o);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    return e.what();
  }
  return "";
}

TEST(PoolOptions, InvalidValuesAreRejectedWithTheFieldName) {
  EXPECT_NE(invalid_message({.min_workers = 5, .max_workers = 4}).find("min_workers"),
            std::string::npos);
  EXPECT_NE(invalid_message({.name = ""}).find("name"), std::string::npos);
  EXPECT_NE(invalid_message({.max_workers = static_cast<std::size_t>(-1)}).find("max_workers"),
            std::string::npos);
  EXPECT_NE(invalid_message({.idle_timeout = -1s}).find("idle_timeout"), std::string::npos);
  EXPECT_NE(invalid_message({.idle_timeout = 0s}).find("idle_timeout"), std::string::npos);
  EXPECT_NE(invalid_message({.task_timeout = -1ms}).find("task_timeout"), std::string::npos);
  EXPECT_NE(invalid_message({.shutdown_timeout = -1ms}).find("shutdown_timeout"),
            std::string::npos);
  EXPECT_NE(invalid_message({.abandon_grace = -1ms}).find("abandon_grace"), std::string::npos);
  EXPECT_NE(invalid_message({.worker_policy = static_cast<WorkerPolicy>(7)}).find("worker_policy"),
            std::string::npos);
  EXPECT_NE(invalid_message({.overflow = static_cast<Overflow>(7)}).find("overflow"),
            std::string::npos);
  EXPECT_NE(invalid_message({.shutdown_mode = static_cast<ShutdownMode>(7)}).find("shutdown_mode"),
            std::string::npos);
}

// A shutdown mode out of the enum's range is refused, and the pool runs on.
TEST(PoolOptions, ShutdownRefusesAModeOutOfRange) {
  Pool pool({.max_workers = 1});
  try {
    (void)pool.shutdown(static_cast<ShutdownMode>(7), 1s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("mode 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.state(), PoolState::running);
  EXPECT_EQ(pool.submit_wait([] { return 4; }), 4);
}

// The scheduling policy a task of `pool` runs under (sched_getscheduler).
int policy_of_a_worker(Pool& pool) {
  Task<int> t = pool.submit([] { return sched_getscheduler(0); });
  return t.get();
}

TEST(PoolOptions, WorkerPolicyIsTheWorkersSchedulingPolicy) {
#if !defined(__linux__)
  GTEST_SKIP() << "WorkerPolicy::batch is SCHED_BATCH, a Linux policy";
#else
  Watchdog dog;
  Pool normal({.name = "normal", .max_workers = 1});
  EXPECT_EQ(policy_of_a_worker(normal), SCHED_OTHER);
  Pool batch({.name = "batch", .max_workers = 1, .worker_policy = WorkerPolicy::batch});
  EXPECT_EQ(policy_of_a_worker(batch), SCHED_BATCH);
  EXPECT_EQ(to_string(WorkerPolicy::batch), "batch");
  // Replacements too: a worker whose start hook throws dies and is replaced.
  std::atomic<int> starts{0};
  Pool replaced({.name = "replaced",
                 .max_workers = 1,
                 .on_worker_start =
                     [&](std::uint64_t) {
                       if (starts.fetch_add(1) == 0) throw std::runtime_error("first start fails");
                     },
                 .worker_policy = WorkerPolicy::batch});
  EXPECT_EQ(policy_of_a_worker(replaced), SCHED_BATCH);
  EXPECT_GE(starts.load(), 2);
#endif
}

TEST(PoolOptions, ZeroMeansTheDocumentedDefaults) {
  Watchdog dog;
  Pool pool;
  const std::size_t cpus = usable_cpus();
  EXPECT_EQ(pool.options().max_workers, 2 * cpus);
  EXPECT_EQ(pool.stats().max_workers, 2 * cpus);
  EXPECT_EQ(pool.options().queue_capacity, 1000 * cpus);
  EXPECT_EQ(pool.name(), "crew");
  EXPECT_EQ(pool.state(), PoolState::running);
}

TEST(PoolSubmit, PostRunsEveryTask) {
  Watchdog dog;
  Pool pool({.max_workers = 4});
  std::atomic<int> ran{0};
  for (int i = 0; i < 10'000; ++i) {
    ASSERT_EQ(pool.post([&ran] { ran.fetch_add(1); }), Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(ran.load(), 10'000);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.submitted, 10'000u);
  EXPECT_EQ(s.outcomes.succeeded, 10'000u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

TEST(PoolSubmit, LargeCallablesAreBoxedAndStillRun) {
  Watchdog dog;
  Pool pool;
  std::atomic<long> sum{0};
  std::array<long, 32> big{};  // 256 bytes: beyond the inline buffer
  big.fill(1);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(pool.post([big, &sum] {
      long s = 0;
      for (long v : big) s += v;
      sum.fetch_add(s);
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(sum.load(), 100 * 32);
}

TEST(PoolSubmit, MoveOnlyCallablesWork) {
  Watchdog dog;
  Pool pool;
  auto owned = std::make_unique<int>(7);
  auto t = pool.submit([p = std::move(owned)] { return *p * 6; });
  EXPECT_EQ(t.get(), 42);
}

TEST(PoolSubmit, SubmitReturnsTheValueOrRethrows) {
  Watchdog dog;
  Pool pool;
  auto ok = pool.submit([] { return std::string("done"); });
  auto bad = pool.submit([]() -> int { throw std::runtime_error("boom"); });
  auto nothing = pool.submit([] {});
  EXPECT_EQ(ok.get(), "done");
  EXPECT_THROW(
      {
        try {
          (void)bad.get();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "boom");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_NO_THROW(nothing.get());
  EXPECT_EQ(ok.status(), TaskStatus::succeeded);
  EXPECT_EQ(bad.status(), TaskStatus::failed);
  EXPECT_NE(ok.id(), bad.id());
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().outcomes.failed, 1u);
}

TEST(PoolSubmit, SubmitWaitReturnsTheResult) {
  Watchdog dog;
  Pool pool;
  EXPECT_EQ(pool.submit_wait([] { return 5; }), 5);
  EXPECT_THROW(pool.submit_wait([]() -> int { throw std::logic_error("x"); }), std::logic_error);
}

TEST(PoolSubmit, WaitForTimesOutOnASlowTask) {
  Watchdog dog;
  Pool pool;
  Gate gate;
  auto t = pool.submit([&gate] { return gate.wait(); });
  EXPECT_FALSE(t.wait_for(20ms));
  EXPECT_FALSE(t.ready());
  gate.open();
  EXPECT_TRUE(t.wait_for(10s));
  EXPECT_TRUE(t.get());
}

TEST(PoolSubmit, AnEmptyHandleThrows) {
  Task<int> t;
  EXPECT_FALSE(t.valid());
  EXPECT_THROW(t.wait(), Error);
  try {
    (void)t.get();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::empty_handle);
  }
}

// A paused pool takes submissions but runs none: a queue of capacity N is
// full after N posts.
TEST(PoolAdmission, TryPostOnAFullQueueSaysFull) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 4});
  pool.pause();
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(pool.try_post([&] { ran.fetch_add(1); }), Admission::accepted);
  EXPECT_EQ(pool.try_post([&] { ran.fetch_add(1); }), Admission::full);
  auto refused = pool.try_submit([] { return 1; });
  EXPECT_EQ(refused.status(), TaskStatus::rejected);
  try {
    (void)refused.get();
    ADD_FAILURE() << "get() of a refused task must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::rejected);
  }
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 4);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.rejected, 2u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

TEST(PoolAdmission, RejectPolicyNeverBlocks) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 2, .overflow = Overflow::reject});
  pool.pause();
  EXPECT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_EQ(pool.post([] {}), Admission::full);
  pool.resume();
}

TEST(PoolAdmission, CallerRunsPolicyRunsOnTheSubmittingThread) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 1, .overflow = Overflow::caller_runs});
  pool.pause();
  EXPECT_EQ(pool.post([] {}), Admission::accepted);
  std::thread::id ran_on;
  EXPECT_EQ(pool.post([&ran_on] { ran_on = std::this_thread::get_id(); }), Admission::accepted);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  auto t = pool.submit([] { return std::this_thread::get_id(); });
  EXPECT_EQ(t.get(), std::this_thread::get_id());
  pool.resume();
}

TEST(PoolAdmission, BlockPolicyWaitsForRoom) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 1});
  pool.pause();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  std::atomic<bool> posted{false};
  std::thread submitter([&] {
    EXPECT_EQ(pool.post([] {}), Admission::accepted);
    posted = true;
  });
  ASSERT_TRUE(eventually([&] { return pool.stats().blocked_submitters == 1; }));
  EXPECT_FALSE(posted.load());
  pool.resume();
  submitter.join();
  EXPECT_TRUE(posted.load());
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().outcomes.succeeded, 2u);
}

// A submitter blocked on a full queue goes on once its level is down to
// half the capacity (the low-water mark), not at the first freed slot: the
// worker here frees one slot per step, and the submitter must stay blocked
// until the fourth. With priority levels the mark is per level.
class BlockedSubmitterLowWater : public ::testing::TestWithParam<std::size_t> {};

TEST_P(BlockedSubmitterLowWater, GoesOnAtHalfTheCapacity) {
  Watchdog dog;
  const std::size_t levels = GetParam();
  constexpr std::size_t kCapacity = 8;
  Pool pool({.max_workers = 1, .queue_capacity = kCapacity, .priority_levels = levels});
  TaskOptions top;
  top.priority = static_cast<std::uint8_t>(levels - 1);
  Gate first;
  std::counting_semaphore<> step(0);
  std::atomic<int> stuck{0};  // steps that timed out (a hang, not a pass)
  auto one_step = [&] {
    if (!step.try_acquire_for(20s * test::kSlowdown)) stuck.fetch_add(1);
  };
  ASSERT_EQ(pool.post([&] { (void)first.wait(); }, top), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  for (std::size_t i = 0; i < kCapacity; ++i) {
    ASSERT_EQ(pool.post(one_step, top), Admission::accepted);
  }
  std::atomic<bool> posted{false};
  std::thread submitter([&] {
    EXPECT_EQ(pool.post([] {}, top), Admission::accepted);
    posted = true;
  });
  ASSERT_TRUE(eventually([&] { return pool.stats().blocked_submitters == 1; }));
  // The worker takes one stepping task (7 queued), then one more per step.
  first.open();
  for (std::size_t queued = kCapacity - 1; queued > kCapacity / 2; --queued) {
    ASSERT_TRUE(eventually([&] { return pool.stats().queued == queued; })) << queued;
    std::this_thread::sleep_for(20ms);  // room for a wrong early release
    EXPECT_FALSE(posted.load()) << "released with " << queued << " queued";
    step.release();
  }
  // Now 4 queued: the mark.
  ASSERT_TRUE(eventually([&] { return posted.load(); }));
  submitter.join();
  step.release(static_cast<std::ptrdiff_t>(kCapacity));
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(stuck.load(), 0);
  EXPECT_EQ(pool.stats().outcomes.succeeded, kCapacity + 2);
}

INSTANTIATE_TEST_SUITE_P(Levels, BlockedSubmitterLowWater, ::testing::Values(1u, 3u));

// A worker whose local queue is empty takes up to 8 cells in a row from a
// shared ring of 256 slots or more: the first to run, the rest into its
// local queue (task_queue.hpp, Queues::pop_batch). One worker must still
// run one submitter's tasks in submission order, and each task must count
// as submitted once, though its cell moved from one queue to another.
TEST(SharedBatches, OneWorkerRunsOneSubmittersTasksInOrderCountingEachOnce) {
  Watchdog dog;
  constexpr int kTasks = 1000;
  // No worker until resume(): one started at construction may still be
  // spinning when pause() returns and take the first task, which would
  // leave the batch test to the tasks behind it.
  Pool pool({.min_workers = 0, .max_workers = 1, .queue_capacity = 4096, .queue_shards = 1});
  std::vector<int> order;
  order.reserve(kTasks);
  pool.pause();  // every cell is published before the worker looks
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([&order, i] { order.push_back(i); }), Admission::accepted);
  }
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(20s * test::kSlowdown));
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i) << "at " << i;
  const PoolStats st = pool.stats();
  EXPECT_EQ(st.submitted, static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(st.outcomes.succeeded, static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(st.queued, 0u);
}

// The cells a batch moved behind a running task are not held by it: a task
// that waits for the tasks queued right behind it (which its own worker may
// have taken in the same batch) sees them run on the other worker.
TEST(SharedBatches, ATaskWaitingForTheTasksBehindItSeesThemRunElsewhere) {
  Watchdog dog;
  constexpr int kBehind = 7;
  for (int round = 0; round < 20; ++round) {
    Pool pool({.min_workers = 2, .max_workers = 2, .queue_capacity = 4096, .queue_shards = 1});
    std::atomic<int> ran{0};
    std::atomic<bool> saw_all{false};
    pool.pause();
    ASSERT_EQ(pool.post([&] { saw_all = eventually([&] { return ran.load() == kBehind; }, 20s); }),
              Admission::accepted);
    for (int i = 0; i < kBehind; ++i) {
      ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
    }
    pool.resume();
    ASSERT_TRUE(pool.wait_idle(30s * test::kSlowdown));
    ASSERT_TRUE(saw_all.load()) << "round " << round << ": " << ran.load() << " of " << kBehind;
  }
}

// Small rings give one cell at a time, so the capacity stays exact: with
// the queue full and the one worker in the first task, exactly one more
// task fits (a batch would have freed up to 8 slots).
TEST(SharedBatches, ASmallQueueKeepsItsExactCapacity) {
  Watchdog dog;
  constexpr std::size_t kCapacity = 64;
  // No worker until resume(): one started at construction may still be
  // spinning when pause() returns, take the first task and free its slot.
  Pool pool({.min_workers = 0,
             .max_workers = 1,
             .queue_capacity = kCapacity,
             .queue_shards = 1,
             .overflow = Overflow::reject});
  Gate gate;
  pool.pause();
  ASSERT_EQ(pool.post([&] { (void)gate.wait(); }), Admission::accepted);
  for (std::size_t i = 1; i < kCapacity; ++i) ASSERT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_EQ(pool.post([] {}), Admission::full);
  pool.resume();
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  EXPECT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_EQ(pool.post([] {}), Admission::full);
  EXPECT_EQ(pool.stats().queued, kCapacity);
  gate.open();
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(pool.stats().outcomes.succeeded, kCapacity + 1);
}

TEST(PoolAdmission, TooManyBlockedSubmittersAreRejected) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 1, .max_blocked_submitters = 1});
  pool.pause();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  std::thread blocked([&] { EXPECT_EQ(pool.post([] {}), Admission::accepted); });
  ASSERT_TRUE(eventually([&] { return pool.stats().blocked_submitters == 1; }));
  EXPECT_EQ(pool.post([] {}), Admission::too_many_blocked);
  pool.resume();
  blocked.join();
}

TEST(PoolAdmission, BlockedSubmittersAreReleasedByShutdown) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 1});
  pool.pause();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  std::thread blocked([&] { EXPECT_EQ(pool.post([] {}), Admission::closed); });
  ASSERT_TRUE(eventually([&] { return pool.stats().blocked_submitters == 1; }));
  (void)pool.shutdown(ShutdownMode::soft, 0s);
  blocked.join();
  EXPECT_EQ(pool.post([] {}), Admission::closed);
}

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

// Submits trivial tasks one at a time until stopped: outcomes keep being
// counted while another thread reads stats().
class Churn {
 public:
  explicit Churn(Pool& pool)
      : thread_([this, &pool] {
          while (!stop_.load()) pool.submit([] {}).wait();
        }) {}
  Churn(const Churn&) = delete;
  Churn& operator=(const Churn&) = delete;
  ~Churn() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One snapshot: every outcome it counts belongs to a submission it counts.
TEST(PoolStats, ASnapshotNeverCountsMoreOutcomesThanSubmissions) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  Churn churn(pool);
  const auto until = std::chrono::steady_clock::now() + 1s;
  std::uint64_t snapshots = 0;
  while (std::chrono::steady_clock::now() < until) {
    const PoolStats s = pool.stats();
    ++snapshots;
    ASSERT_LE(s.outcomes.total(), s.submitted) << "after " << snapshots << " snapshots";
  }
}

TEST(PoolIdle, WaitIdleNeverReturnsTrueWhileAnEarlierTaskStillRuns) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  std::atomic<bool> running{false};
  std::atomic<bool> release{false};
  ASSERT_EQ(pool.post([&] {
    running = true;
    while (!release.load()) std::this_thread::sleep_for(100us);
  }),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  {
    Churn churn(pool);  // later tasks end while the first one runs
    const auto until = std::chrono::steady_clock::now() + 1s;
    std::uint64_t calls = 0;
    while (std::chrono::steady_clock::now() < until) {
      ++calls;
      if (pool.wait_idle(0ns)) {
        release = true;
        FAIL() << "wait_idle returned true while the first task still ran (call " << calls << ")";
      }
    }
  }
  release = true;
  EXPECT_TRUE(pool.wait_idle(10s));
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

TEST(PoolWorkers, WorkersStartOnDemandUpToMax) {
  Watchdog dog;
  Pool pool({.max_workers = 3});
  EXPECT_EQ(pool.stats().workers, 0u);
  WorkerHold hold(pool, 3);  // three tasks run at once: three workers
  EXPECT_EQ(pool.stats().workers, 3u);
  EXPECT_EQ(pool.stats().busy, 3u);
  ASSERT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_LE(pool.stats().workers, 3u);
  hold.release();
  ASSERT_TRUE(pool.wait_idle(10s));
}

TEST(PoolWorkers, IdleWorkersAboveTheMinimumExit) {
  Watchdog dog;
  Pool pool({.min_workers = 1, .max_workers = 3, .idle_timeout = 50ms});
  WorkerHold hold(pool, 3);
  hold.release();
  EXPECT_TRUE(eventually([&] { return pool.stats().workers == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(pool.stats().workers, 1u);  // the minimum stays
}

TEST(PoolWorkers, ResizeGrowsAndShrinks) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  Gate gate;
  std::atomic<int> running{0};
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(pool.post([&] {
      running.fetch_add(1);
      gate.wait();
      running.fetch_sub(1);
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(eventually([&] { return running.load() == 1; }));
  pool.resize(4);
  EXPECT_TRUE(eventually([&] { return running.load() == 4; }));
  EXPECT_EQ(pool.stats().max_workers, 4u);
  pool.resize(2);
  gate.open();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_TRUE(eventually([&] { return pool.stats().workers <= 2; }));
  EXPECT_THROW(Pool({.min_workers = 2, .max_workers = 2}).resize(1), Error);
}

TEST(PoolWorkers, PauseStopsTakingTasksAndResumeContinues) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  std::atomic<int> ran{0};
  pool.pause();
  EXPECT_EQ(pool.state(), PoolState::paused);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(pool.stats().queued, 10u);
  pool.resume();
  EXPECT_EQ(pool.state(), PoolState::running);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), 10);
}

TEST(PoolWorkers, ThreadsAreNamedAfterThePool) {
  Watchdog dog;
  Pool pool({.name = "namedpool", .min_workers = 2, .max_workers = 2});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  std::set<std::string> names;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      if (std::getline(comm, name)) names.insert(name);
    }
    closedir(dir);
  }
  EXPECT_EQ(names.count("namedpool-1"), 1u);
  EXPECT_EQ(names.count("namedpool-2"), 1u);
}

TEST(PoolWorkers, HooksRunOnEveryWorkerThread) {
  Watchdog dog;
  std::atomic<int> started{0}, stopped{0};
  {
    Pool pool({.min_workers = 2,
               .max_workers = 2,
               .on_worker_start = [&](std::uint64_t) { started.fetch_add(1); },
               .on_worker_stop = [&](std::uint64_t) { stopped.fetch_add(1); }});
    ASSERT_TRUE(eventually([&] { return started.load() == 2; }));
  }
  EXPECT_EQ(stopped.load(), 2);
}

TEST(PoolWorkers, AWorkerWhoseStartHookThrowsIsReplaced) {
  Watchdog dog;
  std::atomic<int> calls{0};
  Pool pool({.min_workers = 1,
             .max_workers = 1,
             .on_exception = [](const TaskRef&, std::exception_ptr) {},
             .on_worker_start =
                 [&](std::uint64_t) {
                   if (calls.fetch_add(1) == 0) throw std::runtime_error("first start fails");
                 }});
  // The supervisor replaces the dead minimum worker (after a short backoff).
  ASSERT_TRUE(eventually([&] {
    const PoolStats s = pool.stats();
    return s.workers_replaced == 1 && s.workers == 1 && calls.load() == 2;
  }));
  auto t = pool.submit([] { return 3; });
  EXPECT_EQ(t.get(), 3);
}

// What on_exception heard: "<task name>:<what()>" per call.
struct SeenExceptions {
  std::mutex mu;
  std::vector<std::string> seen;
  std::function<void(const TaskRef&, std::exception_ptr)> handler() {
    return [this](const TaskRef& task, std::exception_ptr e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        const std::lock_guard lock(mu);
        seen.push_back(task.name + ":" + ex.what());
      }
    };
  }
  bool has(const std::string& entry) {
    const std::lock_guard lock(mu);
    return std::find(seen.begin(), seen.end(), entry) != seen.end();
  }
  std::size_t count() {
    const std::lock_guard lock(mu);
    return seen.size();
  }
};

TEST(PoolExceptions, PostedTaskExceptionsReachTheHandler) {
  Watchdog dog;
  SeenExceptions heard;
  Pool pool({.on_exception = heard.handler()});
  ASSERT_EQ(pool.post([] { throw std::runtime_error("plain"); }), Admission::accepted);
  ASSERT_EQ(pool.post([] { throw std::runtime_error("named"); }, {.name = "job"}),
            Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  ASSERT_EQ(heard.count(), 2u);
  EXPECT_TRUE(heard.has(":plain"));
  EXPECT_TRUE(heard.has("job:named"));
  EXPECT_EQ(pool.stats().outcomes.failed, 2u);
}

// A posted long task that throws after its deadline counts as timed out,
// and what it threw still reaches the handler: nobody else could see it.
TEST(PoolExceptions, ALongTaskThrowingAfterItsDeadlineStillReportsTheException) {
  Watchdog dog;
  SeenExceptions heard;
  Pool pool({.max_workers = 2, .on_exception = heard.handler()});
  auto throw_when_stopped = [](const std::string& what) {
    return [what](std::stop_token stop) {
      while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
      throw std::runtime_error(what);
    };
  };
  ASSERT_EQ(pool.post(throw_when_stopped("unnamed"), {.timeout = 20ms}), Admission::accepted);
  ASSERT_EQ(pool.post(throw_when_stopped("named"), {.name = "job", .timeout = 20ms}),
            Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  ASSERT_EQ(heard.count(), 2u);
  EXPECT_TRUE(heard.has(":unnamed"));
  EXPECT_TRUE(heard.has("job:named"));
  EXPECT_EQ(pool.stats().outcomes.timed_out, 2u);
  EXPECT_EQ(pool.stats().outcomes.failed, 0u);
}

TEST(PoolExceptions, WithoutAHandlerTheyGoToStderrWithTheTaskName) {
  Watchdog dog;
  testing::internal::CaptureStderr();
  {
    Pool pool({.name = "errpool"});
    ASSERT_EQ(pool.post([] { throw std::runtime_error("lost?"); }, {.name = "reindex"}),
              Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("errpool"), std::string::npos) << err;
  EXPECT_NE(err.find("reindex"), std::string::npos) << err;
  EXPECT_NE(err.find("lost?"), std::string::npos) << err;
}

TEST(PoolLifetime, DestructionRunsEverythingQueued) {
  Watchdog dog;
  std::atomic<int> ran{0};
  {
    Pool pool({.max_workers = 2});
    pool.pause();
    for (int i = 0; i < 1000; ++i)
      ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
  }  // default shutdown mode: drain
  EXPECT_EQ(ran.load(), 1000);
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

// A worker started for queued work used to hold the spinning token through
// its start hook, and while any worker holds one no submission wakes or
// starts another: one slow hook stalled every later task.
TEST(PoolHooks, ASlowStartHookDoesNotStallOtherSubmissions) {
  Watchdog dog;
  Gate hook_release;
  std::atomic<int> starts{0};
  PoolOptions o;
  o.name = "slow-hook";
  o.min_workers = 1;
  o.max_workers = 3;
  o.on_worker_start = [&](std::uint64_t) {
    if (starts.fetch_add(1) == 1) hook_release.wait();  // the second worker's hook
  };
  Pool pool(std::move(o));
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 1; }));
  Gate busy_release;
  ASSERT_EQ(pool.post([&] { busy_release.wait(); }), Admission::accepted);  // worker 1
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  ASSERT_EQ(pool.post([] {}), Admission::accepted);  // starts worker 2, whose hook blocks
  ASSERT_TRUE(eventually([&] { return starts.load() >= 2; }));
  std::atomic<bool> ran{false};
  ASSERT_EQ(pool.post([&] { ran = true; }), Admission::accepted);
  EXPECT_TRUE(eventually([&] { return ran.load(); }, 2000ms))
      << "a task waited for another worker's start hook";
  hook_release.open();
  busy_release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
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

// A pair of tasks queued together where the first waits for the second:
// the worker that takes the first must not be left as the only one awake.
// Returns false if the second did not start within `limit`.
bool run_waiting_pair(Pool& pool, std::chrono::milliseconds limit) {
  auto b_ran = std::make_shared<std::atomic<bool>>(false);
  auto a_done = std::make_shared<std::atomic<bool>>(false);
  EXPECT_EQ(pool.post([b_ran, a_done, limit] {
    const auto give_up = std::chrono::steady_clock::now() + limit * test::kSlowdown;
    while (!b_ran->load() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(20us);
    }
    a_done->store(true);
  }),
            Admission::accepted);
  EXPECT_EQ(pool.post([b_ran] { b_ran->store(true); }), Admission::accepted);
  const bool ok = eventually([&] { return b_ran->load(); }, limit);
  EXPECT_TRUE(eventually([&] { return a_done->load(); }));
  return ok;
}

// Help for a short backlog is deferred (one worker clears it sooner than
// another wakes up) only while a sleeper watches the queue; with every
// other worker asleep without a deadline it comes at once.
TEST(PoolWake, ATaskWaitingForASiblingQueuedBesideItGetsASecondWorker) {
  Watchdog dog;
  Pool pool({.name = "pair", .min_workers = 2, .max_workers = 2});
  for (int round = 0; round < 100; ++round) {
    // Odd rounds: both workers asleep first; even rounds: still spinning.
    if (round % 2 == 1) std::this_thread::sleep_for(2ms);
    ASSERT_TRUE(run_waiting_pair(pool, 2000ms)) << "round " << round;
  }
  ASSERT_TRUE(pool.wait_idle(10s));
}

// The deferred case: one worker is busy in a long task, the two others fell
// asleep while it was (so they watch the queue). The worker woken for the
// pair defers help and takes the first task, which waits for the second:
// a watching sleeper must take the second.
TEST(PoolWake, DeferredHelpIsTakenByAWatchingSleeper) {
  Watchdog dog;
  Pool pool({.name = "watch", .min_workers = 3, .max_workers = 3});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 3; }));
  Gate release;
  ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  for (int round = 0; round < 50; ++round) {
    std::this_thread::sleep_for(2ms);  // the two others asleep, watching
    ASSERT_TRUE(run_waiting_pair(pool, 2000ms)) << "round " << round;
  }
  release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
}

// The watcher that takes deferred work may block in it too, and so must
// bring in help for what it leaves queued. One worker is held; the two
// others sleep watching. Tasks a and b each wait for c, posted in the order
// a, c, b: the worker woken for them defers help (fewer than Core::kBurst
// queued beside the one it takes) and takes a, with c and b in its local
// queue; a watcher, on its look, steals the newest, b; c then needs a
// fourth worker, which only that watcher can ask for (nobody else is awake
// and free). Without it c stayed queued in the first round. A fresh pool
// per round, so that the fourth worker is new each time.
TEST(PoolWake, AWatcherThatTakesDeferredWorkBringsInHelpForTheRest) {
  Watchdog dog;
  for (int round = 0; round < 20; ++round) {
    Pool pool({.name = "rest", .min_workers = 3, .max_workers = 4});
    ASSERT_TRUE(eventually([&] { return pool.stats().idle == 3; }));
    Gate release;
    ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
    // Wake the two others, so that they fall asleep while the held worker
    // is awake, and watch.
    ASSERT_TRUE(run_waiting_pair(pool, 2000ms));
    std::this_thread::sleep_for(2ms);
    auto c_ran = std::make_shared<std::atomic<bool>>(false);
    auto wait_for_c = [c_ran] {
      const auto give_up = std::chrono::steady_clock::now() + 3s * test::kSlowdown;
      while (!c_ran->load() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(20us);
      }
    };
    ASSERT_EQ(pool.post(wait_for_c), Admission::accepted);
    ASSERT_EQ(pool.post([c_ran] { c_ran->store(true); }), Admission::accepted);
    ASSERT_EQ(pool.post(wait_for_c), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return c_ran->load(); }, 2000ms)) << "round " << round;
    release.open();
    ASSERT_TRUE(pool.wait_idle(10s));
  }
}

// Voluntary context switches of this process's threads whose name starts
// with `prefix` (Linux: /proc/self/task/*/status).
std::uint64_t voluntary_switches(const std::string& prefix) {
  std::uint64_t sum = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      const std::string task = std::string("/proc/self/task/") + e->d_name;
      std::ifstream comm(task + "/comm");
      std::string name;
      if (!std::getline(comm, name) || name.rfind(prefix, 0) != 0) continue;
      std::ifstream status(task + "/status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
          sum += std::stoull(line.substr(line.find(':') + 1));
        }
      }
    }
    closedir(dir);
  }
  return sum;
}

// A sleeper watches the queues (a look every 4 ms) while another worker is
// awake, but only for a few looks once they stay empty: a pool with one
// long task and nothing queued does not wake its idle worker 250 times a
// second. (Counted as the idle worker's voluntary switches: each look is
// one.)
TEST(PoolWake, ASleeperStopsWatchingQueuesThatStayEmpty) {
  Watchdog dog;
  Pool pool({.name = "quiet", .min_workers = 2, .max_workers = 2});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  Gate release;
  ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  std::this_thread::sleep_for(100ms);  // the idle worker's looks are over
  const std::uint64_t before = voluntary_switches("quiet-");
  std::this_thread::sleep_for(400ms);  // 100 looks at the watch period
  const std::uint64_t looks = voluntary_switches("quiet-") - before;
  release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_LE(looks, 5u);
}

// With the whole process on one CPU every woken worker lands on its waker's
// CPU: it runs what is queued without spinning and sleeps at the bottom of
// the idle stack. Every task still runs, and waiting pairs still complete.
TEST(PoolWake, WorkersWokenOntoTheirWakersCpuStillRunEverything) {
  Watchdog dog;
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  std::size_t first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  {
    Pool pool({.name = "one-cpu", .min_workers = 2, .max_workers = 3});  // threads inherit it
    std::atomic<int> ran{0};
    constexpr int kTasks = 3000;
    for (int i = 0; i < kTasks; ++i) {
      ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
      if (i % 100 == 99) std::this_thread::sleep_for(200us);
    }
    EXPECT_TRUE(eventually([&] { return ran.load() == kTasks; }));
    for (int round = 0; round < 20; ++round) {
      EXPECT_TRUE(run_waiting_pair(pool, 2000ms)) << "round " << round;
    }
    EXPECT_TRUE(pool.wait_idle(10s));
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

// ---- a spinner that lost its CPU ----

// Worker threads stopped in a signal handler stand in for spinners that
// lost their CPU (preempted by the thread that submits, or a virtual CPU
// the hypervisor took away): they hold their spinning tokens and do not
// poll.
std::atomic<bool> g_stall_release{false};
std::atomic<int> g_stalled{0};

extern "C" void stall_in_handler(int) {
  g_stalled.fetch_add(1);
  const timespec nap{0, 100'000};
  // Bounded, so that a test that fails still ends: 20 s.
  for (int i = 0; i < 200'000 && !g_stall_release.load(); ++i) nanosleep(&nap, nullptr);
}

// A submitter used to rely on any worker holding a spinning token, so a
// task posted while the only spinner was off its CPU waited until the
// spinner came back (a whole time slice, milliseconds, when it shared its
// CPU with the submitter) although another worker slept. A token whose
// holder has not polled for a few microseconds no longer counts: the
// sleeper is woken and runs the task.
TEST(PoolWake, ATaskIsNotLeftToASpinnerThatLostItsCpu) {
  Watchdog dog;
  struct sigaction action {};
  action.sa_handler = stall_in_handler;
  sigemptyset(&action.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGUSR2, &action, &saved), 0);
  g_stall_release = false;
  g_stalled = 0;

  // One worker more than may spin at once in the process, so at least one
  // sleeps; the others spin for as long as the test lasts.
  const std::size_t spinners = std::max<std::size_t>(1, usable_cpus() / 2);
  std::mutex mu;
  std::vector<pthread_t> threads;
  PoolOptions o;
  o.name = "stalled";
  o.min_workers = spinners + 1;
  o.max_workers = spinners + 1;
  o.spin = 30s;
  o.spin_when_contended = true;  // a busy machine must not stop the spinners
  o.on_worker_start = [&](std::uint64_t) {
    const std::lock_guard lock(mu);
    threads.push_back(pthread_self());
  };
  {
    Pool pool(std::move(o));
    ASSERT_TRUE(eventually([&] {
      const std::lock_guard lock(mu);
      return threads.size() == spinners + 1;
    }));
    // The spinners are the threads that burn CPU while the pool is idle.
    std::vector<pthread_t> spinning;
    ASSERT_TRUE(eventually(
        [&] {
          std::vector<double> before;
          for (const pthread_t t : threads) before.push_back(test::thread_cpu_ms(t));
          std::this_thread::sleep_for(100ms);
          spinning.clear();
          for (std::size_t i = 0; i < threads.size(); ++i) {
            if (test::thread_cpu_ms(threads[i]) - before[i] > 20.0) spinning.push_back(threads[i]);
          }
          return !spinning.empty() && spinning.size() < threads.size();
        },
        10'000ms))
        << "expected some workers spinning and one asleep";
    for (const pthread_t t : spinning) ASSERT_EQ(pthread_kill(t, SIGUSR2), 0);
    ASSERT_TRUE(eventually([&] { return g_stalled.load() == static_cast<int>(spinning.size()); }));

    const auto posted = std::chrono::steady_clock::now();
    std::atomic<bool> ran{false};
    ASSERT_EQ(pool.post([&] { ran = true; }), Admission::accepted);
    const bool in_time = eventually([&] { return ran.load(); }, 1000ms);
    const auto waited = std::chrono::steady_clock::now() - posted;
    g_stall_release = true;
    EXPECT_TRUE(in_time) << "the task waited for the stalled spinner ("
                         << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                         << " ms)";
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  ASSERT_EQ(sigaction(SIGUSR2, &saved, nullptr), 0);
}

}  // namespace
}  // namespace crew
