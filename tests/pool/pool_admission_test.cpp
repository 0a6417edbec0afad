// Tests of admission: a full queue under each overflow policy, blocked
// submitters and the low-water mark that releases them, the bound on how
// many may block, their release by shutdown, and by their task's queue
// deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <semaphore>
#include <thread>

#include "crew/pool.hpp"
#include "crew/task.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;

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

// A refusal decides the outcome even when the task's queue deadline passes
// while it is refused: the supervisor's timer, firing then, must find the
// outcome decided. With the claim after the deadline's hand-over, 4-14 of
// this test's 1,000,000 refusals ended `expired` instead (3 runs), counted
// twice (outcomes above submissions).
TEST(PoolAdmission, ARefusalWhoseQueueDeadlinePassesMeanwhileStaysARefusal) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .queue_capacity = 1, .overflow = Overflow::reject});
  pool.pause();
  ASSERT_EQ(pool.post([] {}), Admission::accepted);  // the queue is full from now on
  const int n = 1'000'000 / test::kSlowdown;
  int expired = 0;
  int other = 0;
  for (int i = 0; i < n; ++i) {
    Task<void> h = pool.submit([] {}, {.queue_timeout = std::chrono::microseconds(1 + i % 50)});
    if (h.status() == TaskStatus::rejected && h.reason() == Errc::expired) {
      ++expired;
    } else if (h.status() != TaskStatus::rejected || h.reason() != Errc::rejected) {
      ++other;
    }
  }
  EXPECT_EQ(expired, 0) << "of " << n << " refusals";
  EXPECT_EQ(other, 0);
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.rejected, static_cast<std::uint64_t>(n));
  EXPECT_EQ(s.outcomes.total(), s.submitted);
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

// A paused one-worker pool whose queue of one is full.
struct FullPausedPool {
  FullPausedPool() {
    pool.pause();
    EXPECT_EQ(pool.post([] {}), Admission::accepted);
  }
  Pool pool{{.max_workers = 1, .queue_capacity = 1}};
};

// A submitter blocked for room stops waiting at its task's queue deadline,
// while the queue is still full: the task ends expired without being
// queued or run, and is counted once, as submitted and as rejected; a
// post() returns accepted, as for a task that expired in the queue.
TEST(PoolAdmission, ASubmitterBlockedForRoomStopsWaitingAtItsTasksQueueDeadline) {
  Watchdog dog;
  FullPausedPool full;  // the queue stays full until resume()
  Pool& pool = full.pool;
  std::atomic<int> ran{0};
  std::atomic<int> returned{0};
  Task<void> late;
  Admission posted = Admission::closed;
  const auto start = std::chrono::steady_clock::now();
  std::thread submitter([&] {
    late = pool.submit([&] { ran.fetch_add(1); }, {.queue_timeout = 20ms});
    returned.fetch_add(1);
  });
  std::thread poster([&] {
    posted = pool.post([&] { ran.fetch_add(1); }, {.queue_timeout = 20ms});
    returned.fetch_add(1);
  });
  EXPECT_TRUE(eventually([&] { return returned.load() == 2; }))
      << "a submitter still waits for room past its task's queue deadline";
  pool.resume();  // lets any that still wait go on (a failure above), before the joins
  submitter.join();
  poster.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
  EXPECT_EQ(posted, Admission::accepted);
  ASSERT_TRUE(late.wait_for(5s));
  EXPECT_EQ(late.status(), TaskStatus::rejected);
  EXPECT_EQ(late.reason(), Errc::expired);
  ASSERT_TRUE(pool.wait_idle(5s));
  EXPECT_EQ(ran.load(), 0);
  const PoolStats after = pool.stats();
  EXPECT_EQ(after.blocked_submitters, 0u);
  EXPECT_EQ(after.submitted, 3u);
  EXPECT_EQ(after.outcomes.total(), 3u);
  EXPECT_EQ(after.outcomes.rejected, 2u);
  EXPECT_EQ(after.outcomes.succeeded, 1u);
}

// A thread submitting `f` with a queue timeout of a minute to `pool`,
// once it is blocked for room in the full queue (the caller joins it).
template <class R, class F>
std::thread blocked_submitter(Pool& pool, Task<R>& out, F f) {
  std::thread t([&pool, &out, f] { out = pool.submit(f, {.queue_timeout = 60s}); });
  EXPECT_TRUE(eventually([&] { return pool.stats().blocked_submitters == 1; }));
  return t;
}

// A task whose queue deadline is far: its blocked submitter still goes on
// once there is room, and the task runs.
TEST(PoolAdmission, ASubmitterBlockedForRoomWithAFarQueueDeadlineGoesOnAtTheLowWaterMark) {
  Watchdog dog;
  FullPausedPool full;
  Pool& pool = full.pool;
  Task<int> t;
  std::thread submitter = blocked_submitter(pool, t, [] { return 7; });
  pool.resume();
  submitter.join();
  EXPECT_EQ(t.get(), 7);
}

// The pool closes while a submitter with a queue deadline waits for room:
// the refusal decides (the handle says rejected, not expired) and the
// task is counted once.
TEST(PoolAdmission, AShutdownBeforeTheQueueDeadlineOfABlockedSubmitterRefusesIt) {
  Watchdog dog;
  FullPausedPool full;
  Pool& pool = full.pool;
  Task<void> refused;
  std::thread submitter = blocked_submitter(pool, refused, [] {});
  (void)pool.shutdown(ShutdownMode::soft, 0s);
  submitter.join();
  EXPECT_EQ(refused.status(), TaskStatus::rejected);
  EXPECT_EQ(refused.reason(), Errc::rejected);
  const PoolStats st = pool.stats();
  EXPECT_EQ(st.submitted, 2u);
  EXPECT_EQ(st.outcomes.total(), 2u);  // the first dropped by the shutdown, this one refused
}

}  // namespace
}  // namespace crew
