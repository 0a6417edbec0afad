// crew's clock (crew/detail/clock.hpp) against steady_clock.
#include "crew/detail/clock.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace crew::detail {
namespace {

using namespace std::chrono_literals;

// How far the clock may stray from steady_clock: the rate error over one
// anchor span is about 2 us right after calibration, far less later.
constexpr std::int64_t kToleranceNs = 50'000;

// Samples now_ns() between two steady_clock reads for `span`; returns the
// largest distance outside [before, after] and the largest step back.
struct Drift {
  std::int64_t outside = 0;
  std::int64_t back = 0;
};

Drift sample(std::chrono::milliseconds span) {
  Drift d;
  std::int64_t last = 0;
  const std::int64_t end = steady_ns() + std::chrono::nanoseconds(span).count();
  for (std::int64_t before = steady_ns(); before < end; before = steady_ns()) {
    const std::int64_t t = TscClock::now_ns();
    const std::int64_t after = steady_ns();
    d.outside = std::max({d.outside, before - t, t - after});
    if (last != 0) d.back = std::max(d.back, last - t);
    last = t;
  }
  return d;
}

TEST(Clock, StaysWithinMicrosecondsOfSteadyClockOnEveryThread) {
  test::Watchdog dog;
  std::vector<Drift> drift(3);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < drift.size(); ++i) {
    threads.emplace_back([&drift, i] { drift[i] = sample(300ms); });
  }
  for (std::thread& t : threads) t.join();
  for (const Drift& d : drift) {
    EXPECT_LE(d.outside, kToleranceNs);
    EXPECT_LE(d.back, kToleranceNs);
  }
  RecordProperty("uses_tsc", TscClock::uses_tsc() ? "yes" : "no");
}

TEST(Clock, MeasuresSleepsLikeSteadyClock) {
  test::Watchdog dog;
  (void)sample(20ms);  // past calibration (10 ms)
  for (int i = 0; i < 5; ++i) {
    const std::int64_t s0 = steady_ns();
    const std::int64_t c0 = TscClock::now_ns();
    std::this_thread::sleep_for(30ms);
    const std::int64_t c1 = TscClock::now_ns();
    const std::int64_t s1 = steady_ns();
    EXPECT_NEAR(static_cast<double>(c1 - c0), static_cast<double>(s1 - s0), 2.0 * kToleranceNs);
  }
}

}  // namespace
}  // namespace crew::detail
