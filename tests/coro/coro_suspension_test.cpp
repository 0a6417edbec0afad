// The suspension word (crew/detail/coro_suspension.hpp): one claim per
// armed generation, and a claim that comes while the arming thread is
// still settling leaves the frame to that thread, so no other thread
// resumes (and may free) a frame whose own thread still reads it.
#include "crew/detail/coro_suspension.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace crew::detail {
namespace {

using test::Watchdog;

TEST(CoroSuspension, AClaimAfterSettlingResumesAndRecordsWhy) {
  Suspension s;
  const std::uint64_t gen = s.arm(std::noop_coroutine(), WaitKind::sleep, true);
  EXPECT_EQ(s.armed_gen(), gen);
  ASSERT_TRUE(s.settle(gen));
  EXPECT_EQ(s.claim(gen, Wake::event), Claimed::resume);
  EXPECT_EQ(s.armed_gen(), 0U);
  EXPECT_EQ(s.claim(gen, Wake::stop), Claimed::no);  // one claim per generation
  EXPECT_EQ(s.take_wake(), Wake::event);
  EXPECT_EQ(s.take_wake(), Wake::none);  // reset by the take
}

TEST(CoroSuspension, AClaimWhileSettlingLeavesTheFrameToTheArmingThread) {
  Suspension s;
  const std::uint64_t gen = s.arm(std::noop_coroutine(), WaitKind::task, true);
  EXPECT_EQ(s.claim(gen, Wake::stop), Claimed::settling);
  EXPECT_FALSE(s.settle(gen));  // the arming thread goes on, not suspended
  EXPECT_EQ(s.take_wake(), Wake::stop);
  EXPECT_EQ(s.armed_gen(), 0U);
}

TEST(CoroSuspension, AnOldGenerationIsNotClaimedAfterReArming) {
  Suspension s;
  const std::uint64_t first = s.arm(std::noop_coroutine(), WaitKind::sleep, true);
  ASSERT_TRUE(s.settle(first));
  ASSERT_EQ(s.claim(first, Wake::event), Claimed::resume);
  (void)s.take_wake();
  const std::uint64_t second = s.arm(std::noop_coroutine(), WaitKind::sleep, true);
  EXPECT_NE(first, second);
  EXPECT_EQ(s.claim(first, Wake::event), Claimed::no);  // a late timer of the first sleep
  ASSERT_TRUE(s.settle(second));
  EXPECT_EQ(s.claim(second, Wake::event), Claimed::resume);
}

TEST(CoroSuspension, SetWakeKeepsTheGeneration) {
  Suspension s;
  const std::uint64_t gen = s.arm(std::noop_coroutine(), WaitKind::sleep, true);
  ASSERT_EQ(s.claim(gen, Wake::event), Claimed::settling);
  (void)s.take_wake();
  s.set_wake(Wake::stop);
  EXPECT_EQ(s.take_wake(), Wake::stop);
  const std::uint64_t next = s.arm(std::noop_coroutine(), WaitKind::sleep, true);
  EXPECT_EQ(next, gen + 1);
}

// Many claimers race the arming thread's settle: each generation is
// claimed exactly once, and exactly one side goes on with the frame (the
// claimer on `resume`, the arming thread when its settle fails).
TEST(CoroSuspension, RacingClaimersAndSettleHandTheFrameToExactlyOneSide) {
  Watchdog dog(std::chrono::seconds(60));
  constexpr int kRounds = 20000;
  Suspension s;
  std::atomic<std::uint64_t> published{0};
  std::atomic<int> resumed_by_claimer{0};
  std::atomic<int> claims{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> claimers;
  for (int c = 0; c < 2; ++c) {
    claimers.emplace_back([&] {
      std::uint64_t seen = 0;
      while (!done.load(std::memory_order_acquire)) {
        const std::uint64_t gen = published.load(std::memory_order_acquire);
        if (gen == 0 || gen == seen) continue;
        seen = gen;
        const Claimed r = s.claim(gen, Wake::event);
        if (r != Claimed::no) claims.fetch_add(1, std::memory_order_relaxed);
        if (r == Claimed::resume) resumed_by_claimer.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  int went_on_here = 0;
  int settled = 0;
  for (int i = 0; i < kRounds; ++i) {
    const std::uint64_t gen = s.arm(std::noop_coroutine(), WaitKind::task, true);
    published.store(gen, std::memory_order_release);
    if (s.settle(gen)) {
      ++settled;
      // Suspended: wait until a claimer takes it (or take it back).
      while (s.armed_gen() == gen) {
        if (s.claim(gen, Wake::none) == Claimed::resume) {
          claims.fetch_add(1, std::memory_order_relaxed);
          resumed_by_claimer.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      }
    } else {
      ++went_on_here;
    }
    (void)s.take_wake();
  }
  done.store(true, std::memory_order_release);
  for (auto& t : claimers) t.join();
  EXPECT_EQ(claims.load(), kRounds);  // exactly one claim per generation
  EXPECT_EQ(resumed_by_claimer.load(), settled);
  EXPECT_EQ(went_on_here + settled, kRounds);
}

}  // namespace
}  // namespace crew::detail
