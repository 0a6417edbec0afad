// The stream source's overload backoff as a value (src/redis/
// overload_backoff.hpp): its lengths, bounds, jitter and reset, on a clock
// the test moves by hand.
#include "overload_backoff.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <set>

namespace {

using crew::detail::OverloadBackoff;
using Clock = OverloadBackoff::Clock;
using namespace std::chrono_literals;

constexpr Clock::duration kLo = 10ms, kHi = 1000ms;
const Clock::time_point kT0 = Clock::time_point{} + 1h;

// The backoff a refusal at `now` starts, as a length from `now`.
Clock::duration refuse(OverloadBackoff& b, Clock::time_point now, Clock::duration estimate = 0ms) {
  b.refused(now, estimate);
  return b.until() - now;
}

// A backoff of nominal length `d` lasts within (3/4 d, d].
void expect_jittered(Clock::duration got, Clock::duration d) {
  EXPECT_LE(got, d);
  EXPECT_GE(got, d - d / 4);
}

TEST(OverloadBackoff, NoneUntilARefusal) {
  OverloadBackoff b(kLo, kHi, 1);
  EXPECT_FALSE(b.paused(kT0));
  EXPECT_FALSE(b.paused(Clock::time_point{}));
}

TEST(OverloadBackoff, TheFirstLastsTheLowerBoundAndPausesUntilItsEnd) {
  OverloadBackoff b(kLo, kHi, 1);
  const Clock::duration got = refuse(b, kT0);
  expect_jittered(got, kLo);
  EXPECT_TRUE(b.paused(kT0));
  EXPECT_TRUE(b.paused(b.until() - 1ns));
  EXPECT_FALSE(b.paused(b.until()));
}

TEST(OverloadBackoff, EachRefusalAfterTheLastBackoffDoublesItUpToTheUpperBound) {
  OverloadBackoff b(kLo, kHi, 7);
  Clock::time_point now = kT0;
  Clock::duration nominal = kLo;
  for (int i = 0; i < 12; ++i) {  // 10, 20, ... 640, then 1000 ms every time
    const Clock::duration got = refuse(b, now);
    expect_jittered(got, nominal);
    now = b.until();  // the next refusal comes when this backoff ends
    nominal = std::min(nominal * 2, kHi);
  }
}

TEST(OverloadBackoff, ALongerQueueWaitEstimateIsTakenWithinTheBounds) {
  OverloadBackoff b(kLo, kHi, 3);
  expect_jittered(refuse(b, kT0, 300ms), 300ms);
  // Doubled (600 ms) is longer than the estimate (100 ms) now.
  expect_jittered(refuse(b, b.until(), 100ms), 600ms);
  OverloadBackoff c(kLo, kHi, 3);
  expect_jittered(refuse(c, kT0, 5s), kHi);
}

TEST(OverloadBackoff, ARefusalDuringABackoffDoesNotLengthenIt) {
  OverloadBackoff b(kLo, kHi, 5);
  b.refused(kT0, 200ms);
  const Clock::time_point until = b.until();
  b.refused(kT0 + 1ms, 900ms);
  b.refused(until - 1ns, 0ms);
  EXPECT_EQ(b.until(), until);
  // Nor does it count as a doubling: the next one after it is 2 x 200 ms.
  expect_jittered(refuse(b, until), 400ms);
}

TEST(OverloadBackoff, AnAdmissionStartsTheNextFromTheEstimateAgain) {
  OverloadBackoff b(kLo, kHi, 9);
  Clock::time_point now = kT0;
  for (int i = 0; i < 5; ++i) {  // up to 160 ms
    b.refused(now, 0ms);
    now = b.until();
  }
  b.admitted();
  expect_jittered(refuse(b, now), kLo);
  b.admitted();
  expect_jittered(refuse(b, b.until(), 50ms), 50ms);
}

TEST(OverloadBackoff, TheJitterSpreadsInstancesRefusedTogether) {
  std::set<Clock::duration> lengths;
  for (std::uint32_t seed = 1; seed <= 200; ++seed) {
    OverloadBackoff b(kLo, kHi, seed);
    const Clock::duration got = refuse(b, kT0, 400ms);
    expect_jittered(got, 400ms);
    lengths.insert(got);
  }
  // 200 instances refused at the same instant come back at many instants.
  EXPECT_GT(lengths.size(), 150u);
}

}  // namespace
